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
torch.compile: Inductor's generated Triton kernels, compiled in the run.  With
--side-thread a second thread launches small in-place kernels on its own stream
all along, as another thread of a server would, and with --graph the main
thread holds the capture open 0.2 s after capturing the step, so that thread's
launches (and the shim's marks of them) fall inside PyTorch's global-mode capture.
With --devices 0,1 the layers are split in order over those GPUs (a pipeline in one
process: activations and gradients cross between them every step).
"""

import argparse
import json
import threading
import time

import torch
from cuda_pointer import is_managed


class SideWork:
    """A second thread launching small kernels on its own stream until stopped."""

    def __init__(self):
        self.tensor = torch.ones(1 << 20, device="cuda")
        self.stream = torch.cuda.Stream()
        self.launches = 0
        self.launches_during_capture = None
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        with torch.cuda.stream(self.stream):
            while not self.stopped.is_set():
                self.tensor.mul_(1.0)  # in place: an allocation would break a global-mode capture
                self.launches += 1

    def stop(self):
        self.stopped.set()
        self.thread.join()
        self.stream.synchronize()


class MoveTo(torch.nn.Module):
    """Moves activations to the next layer's device (a no-op on one GPU; gradients cross back)."""

    def __init__(self, device):
        super().__init__()
        self.device = device

    def forward(self, x):
        return x.to(self.device)


def capture(train_step, losses, side_work=None):
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
        if side_work is not None:
            before = side_work.launches
            time.sleep(0.2)
            side_work.launches_during_capture = side_work.launches - before

    def replay():
        graph.replay()
        return captured_loss

    return replay


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument(
        "--seconds", type=float, default=0.0, help="train for this long instead of --steps"
    )
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument(
        "--graph", action="store_true", help="replay a captured CUDA graph of the step"
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (Inductor)")
    parser.add_argument(
        "--side-thread",
        action="store_true",
        help="a second thread launches small kernels on its own stream meanwhile",
    )
    parser.add_argument(
        "--loader-workers",
        type=int,
        default=0,
        help="feed the inputs from a DataLoader with this many forked workers",
    )
    parser.add_argument(
        "--devices",
        default="0",
        help="comma-separated GPU indices to split the layers over, in order",
    )
    args = parser.parse_args()
    devices = [torch.device("cuda", int(index)) for index in args.devices.split(",")]

    torch.manual_seed(0)
    layers = []
    for index in range(6):
        device = devices[index * len(devices) // 6]
        layers += [
            MoveTo(device),
            torch.nn.Linear(args.width, args.width).to(device),
            torch.nn.ReLU(),
        ]
    model = torch.nn.Sequential(*layers)
    if args.compile:
        model = torch.compile(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    inputs = torch.randn(args.batch, args.width, device=devices[0])
    targets = torch.randn(args.batch, args.width, device=devices[-1])
    loader = None
    if args.loader_workers > 0:
        host_inputs = torch.randn(
            4 * args.batch, args.width, generator=torch.Generator().manual_seed(1)
        )
        loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(host_inputs),
            batch_size=args.batch,
            num_workers=args.loader_workers,
            pin_memory=True,
            persistent_workers=True,
            multiprocessing_context="fork",
        )

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss

    side_work = SideWork() if args.side_thread else None
    losses, step_times = [], []
    run_step = capture(train_step, losses, side_work) if args.graph else train_step
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

    side_launches = {}
    if side_work is not None:
        side_work.stop()
        side_launches = {
            "side_launches": side_work.launches,
            "side_launches_during_capture": side_work.launches_during_capture,
        }
    checksum = sum(float(p.double().sum()) for p in model.parameters())
    print(
        json.dumps(
            {
                **side_launches,
                "losses": losses,
                "checksum": checksum,
                "managed": all(is_managed(p.data_ptr()) for p in model.parameters()),
                "step_times": step_times,
                "steps": step,
            }
        )
    )


if __name__ == "__main__":
    main()
