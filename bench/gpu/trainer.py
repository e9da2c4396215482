"""The reference training loop: 6 x Linear(4096), batch 8192, fp32, SGD.

Prints one JSON line: wall-clock time of every step, the last loss and a
checksum of the weights (equal with and without the shim when results are
identical); also when stopped by SIGTERM, after the step under way.  By default the
loss is read every step, so at most one step is queued ahead of the GPU; --sync-every N
reads it every N steps, as loops that log every N steps do, and lets work queue ahead
(step times are then the times steps were queued).  --pause-every N --pause-s S waits S seconds on the
CPU after every N steps (an evaluation or a checkpoint), leaving the GPU idle.
--devices 0,1 splits the six layers in order over those GPUs: one process using
two GPUs, activations and gradients crossing between them every step."""

import argparse
import json
import pathlib
import signal
import time

import torch


class PlainSgd:
    """torch.optim.SGD's update without momentum, the same foreach kernel: constructing
    torch.optim.SGD imports torch._dynamo, 3.8 s of every process's start on the H100
    machines, which the bench pays in each of its ~17 trainers."""

    def __init__(self, parameters, lr: float):
        self.parameters, self.lr = list(parameters), lr

    def zero_grad(self) -> None:
        for parameter in self.parameters:
            parameter.grad = None

    @torch.no_grad()
    def step(self) -> None:
        torch._foreach_add_(self.parameters, [p.grad for p in self.parameters], alpha=-self.lr)


class MoveTo(torch.nn.Module):
    """Moves the activations to the next layer's GPU (their gradients cross back)."""

    def __init__(self, device):
        super().__init__()
        self.device = device

    def forward(self, x):
        return x.to(self.device)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps")
    parser.add_argument("--seconds", type=float, default=0.0, help="or after this long")
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--sync-every", type=int, default=1, help="read the loss every N steps")
    parser.add_argument("--pause-every", type=int, default=0, help="pause after every N steps")
    parser.add_argument("--pause-s", type=float, default=0.0, help="for this long, GPU idle")
    parser.add_argument(
        "--devices", default="0", help="GPU indices to split the layers over, in order"
    )
    parser.add_argument(
        "--ready-file", help="created once the first step is done (the setup is over)"
    )
    parser.add_argument(
        "--gpu-spans",
        action="store_true",
        help="also time each step on the GPU (first kernel to last), to see idle gaps",
    )
    args = parser.parse_args()
    # Before any CUDA call: under anti-thrash on, the first one waits for the lock.
    set_up_from = time.time()

    devices = [torch.device("cuda", int(index)) for index in args.devices.split(",")]
    torch.manual_seed(0)
    layers = []
    for index in range(6):
        device = devices[index * len(devices) // 6]
        linear = torch.nn.Linear(args.width, args.width).to(device)
        # Across GPUs, the pipeline's hop; on one, the reference loop exactly as it was.
        layers += [MoveTo(device)] if len(devices) > 1 else []
        layers += [linear, torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    optimizer = PlainSgd(model.parameters(), lr=1e-4)
    inputs = torch.randn(args.batch, args.width, device=devices[0])
    targets = torch.randn(args.batch, args.width, device=devices[-1])

    # SIGTERM ends the loop after the step under way, and the result is printed as at the
    # end: shares.py stops its trainers at its window's end, whenever each started.
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    step_times, spans, loss = [], [], None
    started = time.time()
    while not stopping:
        if args.gpu_spans:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        if args.gpu_spans:
            end.record()
        if len(step_times) % args.sync_every == 0:
            loss_value = loss.item()  # a sync, as real loops log the loss
        step_times.append(time.time())
        if args.ready_file and len(step_times) == 1:
            pathlib.Path(args.ready_file).touch()
        if args.gpu_spans:
            spans.append(begin.elapsed_time(end) / 1000)
        if args.pause_every and len(step_times) % args.pause_every == 0:
            loss_value = loss.item()
            time.sleep(args.pause_s)
        if args.steps and len(step_times) >= args.steps:
            break
        if args.seconds and step_times[-1] - started >= args.seconds:
            break
    loss_value = loss.item()
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    # started_at: when it began to set up, before it waited for any lock.
    result = {
        "step_times": step_times,
        "started_at": set_up_from,
        "loss": loss_value,
        "checksum": checksum,
    }
    if args.gpu_spans:
        result["gpu_spans_s"] = spans
    print(json.dumps(result))


if __name__ == "__main__":
    main()
