"""A small PyTorch training loop, run by the GPU tests with and without the shim.

Prints one JSON line: the loss after each step, a checksum of the weights,
whether the parameters live in managed memory (cuPointerGetAttribute), and the
wall-clock time of every step (the tests read alternation from them).  With
--graph, three eager steps warm up on a side stream and the whole step
(forward, backward, optimizer) is then captured once as a CUDA graph and
replayed: the stream-capture path under the shim.  With --loader-workers N the
inputs come from a DataLoader with N forked workers and pinned batches, as
real training feeds the GPU: forked children of a CUDA process, and page-locked
host memory, under the shim.  With --compile the model goes through
torch.compile: Inductor's generated Triton kernels, compiled in the run.
"""
import argparse
import json
import time

import torch

from cuda_pointer import is_managed


def capture(train_step, losses):
    """PyTorch's whole-network capture: warm up on a side stream, capture one
    step, return a function that replays it (the same tensors every time)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            losses.append(train_step().item())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured_loss = train_step()

    def replay():
        graph.replay()
        return captured_loss
    return replay


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=0.0,
                        help="train for this long instead of --steps")
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--graph", action="store_true", help="replay a captured CUDA graph of the step")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (Inductor)")
    parser.add_argument("--loader-workers", type=int, default=0,
                        help="feed the inputs from a DataLoader with this many forked workers")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda")
    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(device)
    if args.compile:
        model = torch.compile(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    inputs = torch.randn(args.batch, args.width, device=device)
    targets = torch.randn(args.batch, args.width, device=device)
    loader = None
    if args.loader_workers > 0:
        host_inputs = torch.randn(4 * args.batch, args.width, generator=torch.Generator().manual_seed(1))
        loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(host_inputs), batch_size=args.batch,
            num_workers=args.loader_workers, pin_memory=True, persistent_workers=True,
            multiprocessing_context="fork")

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss

    losses, step_times = [], []
    run_step = capture(train_step, losses) if args.graph else train_step
    started = time.time()
    step = 0
    epoch = iter(())
    while (step < args.steps) if args.seconds <= 0 else (time.time() - started < args.seconds):
        if loader is not None:
            batch = next(epoch, None)
            if batch is None:
                epoch = iter(loader)
                batch = next(epoch)
            inputs.copy_(batch[0], non_blocking=True)
        loss = run_step()
        losses.append(loss.item())  # one sync per step, as real loops log the loss
        step_times.append(time.time())
        step += 1

    checksum = sum(float(p.double().sum()) for p in model.parameters())
    print(json.dumps({
        "losses": losses,
        "checksum": checksum,
        "managed": is_managed(next(model.parameters()).data_ptr()),
        "step_times": step_times,
        "steps": step,
    }))


if __name__ == "__main__":
    main()
