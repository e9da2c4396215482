"""One process of issue 44's shapes f and g (duty.py): GPU work in units, each ending with a
host sync, until SIGTERM.

    duty_client.py bursts --burst-ms 30 --duty 0.3     # a duty process: 30 ms bursts, busy 30 %
    duty_client.py bursts --burst-ms 60 --gap-ms 90    # a loader-bound trainer
    duty_client.py trainer                             # an always-busy trainer

A burst is matrix products (4096 x 4096, fp32) over a 256 MiB stack of matrices, enough of
them to take --burst-ms on this GPU (sized at start unless the start options give
`products`), ended by `.item()`.  With --duty D the process sleeps after each burst until
its cycle (burst / D) is over, so it is busy D of the time alone and never catches up on a
late cycle; with --gap-ms it waits that long after every burst, as a trainer waits for a
batch its loader had not ready.  The trainer is trainer.py's step (Linear layers, MSE, the
plain SGD update, the loss read every step) at width 2048, batch 4096: ~0.7 GiB.

--hold PATH: after importing torch the process creates PATH.held and waits for PATH (JSON
options, written by duty.py when the process's turn comes), so that torch's import of every
process is paid together at the start, before anything is measured, and a process can
arrive on the GPU at a chosen moment.  After its first unit it creates --ready-file.  It
prints one JSON line: each unit's completion (wall clock) and GPU time (CUDA events)."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import time

import light
import torch
from trainer import PlainSgd

SIDE, STACK = 4096, 4  # 4 x 4096 x 4096 fp32 = 256 MiB read by every burst
MAX_SECONDS = 600.0  # a process duty.py forgot ends by itself
PARENT = os.getppid()


def wait_for_start(hold: str | None) -> dict:
    """Says the import is done (PATH.held) and returns the options in PATH once it exists
    (duty.py writes it whole, by a rename)."""
    if not hold:
        return {}
    pathlib.Path(f"{hold}.held").touch()
    path = pathlib.Path(hold)
    while True:
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            if orphaned():
                raise SystemExit("duty_client: duty.py is gone") from None
            time.sleep(0.05)  # ~40 processes wait at once: a light poll


def orphaned() -> bool:
    """duty.py ended (killed with its command) and this process was handed to init."""
    return os.getppid() != PARENT


def refuse_over_budget() -> None:
    """duty.py plans memory with every process under 1 GiB: one over it stops at once."""
    light.refuse_over_budget("duty_client", torch.cuda.max_memory_reserved())


def stop_on_sigterm() -> list:
    """A list that gets an item at SIGTERM: the loop ends after the unit under way."""
    stopping: list = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    return stopping


class Bursts:
    """Bursts of matrix products over the stack; each returns its GPU time in ms."""

    def __init__(self, seed: int):
        torch.manual_seed(seed)
        # In place: a divided copy would leave 256 MiB more in the allocator's cache.
        self.stack = torch.randn(STACK, SIDE, SIDE, device="cuda").div_(SIDE**0.5)
        self.out = torch.empty(SIDE, SIDE, device="cuda")
        self.begin = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.checksum = 0.0

    def run(self, products: int) -> float:
        self.begin.record()
        for index in range(products):
            torch.matmul(self.stack[index % STACK], self.stack[(index + 1) % STACK], out=self.out)
        self.end.record()
        self.checksum = self.out[0, 0].item()  # the sync that ends a burst
        return self.begin.elapsed_time(self.end)

    def ms_per_product(self) -> float:
        self.run(STACK)  # cuBLAS picks its kernel, the allocator settles
        return self.run(10) / 10


class Trainer:
    """trainer.py's step, smaller; each returns its GPU time in ms."""

    def __init__(self, seed: int, width: int, batch: int):
        torch.manual_seed(seed)
        layers: list[torch.nn.Module] = []
        for _ in range(6):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        self.model = torch.nn.Sequential(*layers).cuda()
        self.optimizer = PlainSgd(self.model.parameters(), lr=1e-4)
        self.inputs = torch.randn(batch, width, device="cuda")
        self.targets = torch.randn(batch, width, device="cuda")
        self.begin = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def run(self) -> float:
        self.begin.record()
        self.optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(self.inputs), self.targets)
        loss.backward()
        self.optimizer.step()
        self.end.record()
        loss.item()
        return self.begin.elapsed_time(self.end)


def loop(unit, ready_file: str | None, duty: float, cycle_s: float, gap_s: float) -> dict:
    """Runs unit() until SIGTERM (or MAX_SECONDS): after each, sleeps out the cycle (duty)
    or the gap.  Returns each unit's completion time and GPU time."""
    stopping = stop_on_sigterm()
    done_at: list[float] = []
    gpu_ms: list[float] = []
    started = time.monotonic()
    while not stopping and time.monotonic() - started < MAX_SECONDS and not orphaned():
        began = time.monotonic()
        gpu_ms.append(unit())
        done_at.append(time.time())
        if len(done_at) == 1:
            refuse_over_budget()
            if ready_file:
                pathlib.Path(ready_file).touch()
        if duty:
            time.sleep(max(0.0, began + cycle_s - time.monotonic()))
        elif gap_s:
            time.sleep(gap_s)
    return {"done_at": done_at, "gpu_ms": gpu_ms}


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hold", help="wait for this file (JSON options) before using the GPU")
    parser.add_argument("--ready-file", help="created after the first unit")
    parser.add_argument("--seed", type=int, default=0)


def about_process() -> dict:
    return {
        "pid": os.getpid(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "reserved_bytes": torch.cuda.max_memory_reserved(),
    }


def sized_bursts(burst_ms: float, options: dict, seed: int) -> tuple[Bursts, int, float]:
    """The bursts, their products (the options', else sized here) and ms per product."""
    bursts = Bursts(seed)
    ms_per_product = bursts.ms_per_product()
    products = int(options.get("products") or max(1, round(burst_ms / ms_per_product)))
    return bursts, products, ms_per_product


def main() -> None:
    parser = argparse.ArgumentParser()
    modes = parser.add_subparsers(dest="mode", required=True)
    bursts_parser = modes.add_parser("bursts")
    add_common_arguments(bursts_parser)
    bursts_parser.add_argument("--burst-ms", type=float, required=True)
    paced = bursts_parser.add_mutually_exclusive_group(required=True)
    paced.add_argument("--duty", type=float, help="busy fraction alone: cycle = burst / duty")
    paced.add_argument("--gap-ms", type=float, help="host wait after every burst")
    trainer_parser = modes.add_parser("trainer")
    add_common_arguments(trainer_parser)
    trainer_parser.add_argument("--width", type=int, default=2048)
    trainer_parser.add_argument("--batch", type=int, default=4096)
    args = parser.parse_args()
    if args.mode == "bursts" and args.duty is not None and not 0 < args.duty <= 1:
        parser.error(f"--duty must be in (0, 1], not {args.duty}")

    options = wait_for_start(args.hold)
    released_at = time.time()
    if args.mode == "trainer":
        trainer = Trainer(args.seed, args.width, args.batch)
        run = loop(trainer.run, args.ready_file, 0.0, 0.0, 0.0)
        sizes: dict = {"width": args.width, "batch": args.batch}
    else:
        bursts, products, ms_per_product = sized_bursts(args.burst_ms, options, args.seed)
        cycle_s = args.burst_ms / 1000 / args.duty if args.duty else 0.0
        gap_s = (args.gap_ms or 0.0) / 1000
        run = loop(lambda: bursts.run(products), args.ready_file, args.duty or 0.0, cycle_s, gap_s)
        sizes = {"products": products, "ms_per_product": ms_per_product}
    print(json.dumps({**run, **sizes, **about_process(), "released_at": released_at}))


if __name__ == "__main__":
    main()
