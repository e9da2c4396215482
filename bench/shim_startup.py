#!/usr/bin/env python3
"""Start-up cost of preloading libnvshare.so into processes that never use CUDA.

With /etc/ld.so.preload every process on the node loads the shim, so its cost
for a program that never touches CUDA must be negligible.  This runs
`/bin/true` and `python3 -c pass` many times with and without
LD_PRELOAD=shim/build/libnvshare.so, interleaved (so drift in machine load hits
both alike), and prints the median wall time of each and the ratio.

    python3 bench/shim_startup.py [--runs 300] [--python-runs 60] [--shim PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def spawn_seconds(argv: list[str], env: dict) -> float:
    """Wall time from spawn to reaped exit; posix_spawn keeps our own overhead small."""
    started = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, env)
    _, status = os.waitpid(pid, 0)
    elapsed = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed (status {status})")
    return elapsed


def measure(argv: list[str], runs: int, shim: Path) -> tuple[float, float]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LD_PRELOAD", "NVSHARE_"))}
    # No agent anywhere: a process that never uses CUDA must not look for one.
    base["NVSHARE_SOCKET"] = "/nonexistent/nvshare.sock"
    preloaded = dict(base, LD_PRELOAD=str(shim))
    plain_times, shim_times = [], []
    for _ in range(3):  # warm the page cache for both
        spawn_seconds(argv, base)
        spawn_seconds(argv, preloaded)
    for _ in range(runs):
        plain_times.append(spawn_seconds(argv, base))
        shim_times.append(spawn_seconds(argv, preloaded))
    return statistics.median(plain_times), statistics.median(shim_times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300, help="runs of /bin/true per variant")
    parser.add_argument(
        "--python-runs", type=int, default=60, help="runs of python3 -c pass per variant"
    )
    parser.add_argument("--shim", type=Path, default=REPO / "shim" / "build" / "libnvshare.so")
    args = parser.parse_args()
    if not args.shim.exists():
        print(f"no shim at {args.shim}: run `make shim` first", file=sys.stderr)
        return 2
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    cases = [(["/bin/true"], args.runs), ([python, "-c", "pass"], args.python_runs)]
    print(f"shim: {args.shim}")
    print(f"{'program':<28} {'runs':>5} {'plain ms':>10} {'preload ms':>11} {'ratio':>7}")
    for argv, runs in cases:
        plain, shim = measure(argv, runs, args.shim)
        print(
            f"{' '.join(argv):<28} {runs:>5} {plain * 1e3:>10.3f} {shim * 1e3:>11.3f} {shim / plain:>7.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
