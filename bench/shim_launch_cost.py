#!/usr/bin/env python3
"""What the shim's launch path costs on the CPU alone, inside one process.

tests/standin/build/client_launch_cost launches through the shim's cuLaunchKernel hook
and through the stand-in driver's own, alternating in blocks, with the stand-in's launch
reduced to its argument check (STANDIN_LAUNCH_NOOP=1).  No agent: the shim runs
unscheduled, whose gate is open as when it holds the GPU.  The median of the paired
deltas is the hook and the gate (most blocks hold no mark of the queue bound); the mean
adds the marks, which on the stand-in go through its stream worker thread and so cost
more than on a GPU.  bench/gpu/hook_cost.cu measures the same on a GPU.

    make shim standin && python3 bench/shim_launch_cost.py [--blocks 20000] [--shim PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STANDIN = REPO / "tests" / "standin" / "build"
sys.path.insert(0, str(REPO / "bench" / "gpu"))
from gpu_measures import hook_cost_measures  # noqa: E402


def measure(shim: Path, blocks: int, per_block: int) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LD_PRELOAD", "NVSHARE_", "STANDIN_"))
    }
    env.update(
        LD_PRELOAD=str(shim),
        LD_LIBRARY_PATH=str(STANDIN),
        STANDIN_LAUNCH_NOOP="1",
        NVSHARE_SOCKET="/nonexistent/nvshare.sock",
    )
    done = subprocess.run(
        [str(STANDIN / "client_launch_cost"), str(blocks), str(per_block)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"client_launch_cost failed: {(done.stdout + done.stderr).strip().splitlines()[-1]}"
        )
    return hook_cost_measures(json.loads(done.stdout))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=20000, help="blocks per path")
    parser.add_argument("--per-block", type=int, default=64, help="launches per block")
    parser.add_argument("--shim", type=Path, default=REPO / "shim" / "build" / "libnvshare.so")
    args = parser.parse_args()
    if args.blocks < 1 or args.per_block < 1:
        print("shim_launch_cost: --blocks and --per-block must be at least 1", file=sys.stderr)
        return 2
    missing = [path for path in (args.shim, STANDIN / "client_launch_cost") if not path.exists()]
    if missing:
        print(f"shim_launch_cost: no {missing[0]}: run `make shim standin` first", file=sys.stderr)
        return 2
    m = measure(args.shim, args.blocks, args.per_block)
    low, high = m["delta_ns_mean_95"]
    print(f"shim: {args.shim}")
    print(
        f"driver {m['driver_ns_median']:.1f} ns  hook {m['hook_ns_median']:.1f} ns per launch (medians); "
        f"hook - driver: median {m['delta_ns_median']:+.1f} ns, mean {m['delta_ns_mean']:+.1f} "
        f"({low:+.1f} .. {high:+.1f}), {args.blocks} blocks of {args.per_block}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
