"""Does splitting a grant's bulk prefetch over several streams bring a working set back faster?

Builds the shim once per stream count (NVSHARE_PREFETCH_STREAMS, 256 MiB chunks handed
out in turn; 1 is one call per allocation), then runs figure 4's warm-up (warmup.py,
8 GiB pushed to host memory, grant -> first kernel done) under each build in
interleaved rounds, the order rotated every round, beside the process prefetching by
hand with no agent.  Prints each way's median, min and max GB/s and writes the samples
and the shim's own prefetch timings (its debug log) as JSON.

    python3 bench/gpu/prefetch_split.py [RESULTS_DIR] [--rounds 10] [--streams 1 4 8]
"""

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

from gpu_state import check_memory, environment
from harness import REPO, Agent, run_json

HERE = pathlib.Path(__file__).resolve().parent


def build_shim(streams: int) -> pathlib.Path:
    build = f"build/streams-{streams}"
    subprocess.run(
        [
            "make",
            "-s",
            "-C",
            str(REPO / "shim"),
            f"BUILD={build}",
            f"CPPFLAGS=-DNVSHARE_PREFETCH_STREAMS={streams}",
        ],
        check=True,
    )
    return REPO / "shim" / build / "libnvshare.so"


def shim_rate(log: str) -> float | None:
    """GB/s of the bulk prefetch that brought the working set back (the last in the log)."""
    rates = [
        float(line.rsplit("GB/s=", 1)[1]) for line in log.splitlines() if "prefetch gpu=" in line
    ]
    return rates[-1] if rates else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("results_dir", nargs="?", default=None)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if not all(1 <= n <= 64 for n in args.streams):
        parser.error("--streams takes counts from 1 to 64")
    results_dir = pathlib.Path(args.results_dir or "results/gpu")
    results_dir.mkdir(parents=True, exist_ok=True)
    check_memory()

    shims = {f"streams_{n}": build_shim(n) for n in args.streams}
    workdir = pathlib.Path(tempfile.mkdtemp())
    agent = Agent(workdir, idle_release_ms=1000)
    command = [sys.executable, str(HERE / "warmup.py"), "--gib", "8"]
    ways = [*shims, "by_hand"]
    samples = {way: [] for way in ways}
    shim_rates = {way: [] for way in shims}
    try:
        for round_index in range(args.rounds):
            shift = round_index % len(ways)
            for way in ways[shift:] + ways[:shift]:
                if way == "by_hand":
                    env = agent.env(NVSHARE_SOCKET=str(workdir / "no-agent.sock"))
                    result = run_json(command + ["--self-prefetch"], env=env, timeout=180)
                else:
                    logs = []
                    env = agent.env(NVSHARE_DEBUG="1", LD_PRELOAD=str(shims[way]))
                    result = run_json(command, env=env, timeout=180, stderr_into=logs)
                    shim_rates[way].append(shim_rate(logs[-1]))
                samples[way].append(result["gb_per_s"])
            print(
                f"round {round_index}: "
                + ", ".join(f"{way} {samples[way][-1]:.1f}" for way in ways),
                flush=True,
            )
    finally:
        agent.stop()

    summary = {
        way: {"median": statistics.median(values), "min": min(values), "max": max(values)}
        for way, values in samples.items()
    }
    (results_dir / "prefetch_split.json").write_text(
        json.dumps(
            {
                "environment": environment(),
                "gb_per_s": samples,
                "shim_prefetch_gb_per_s": shim_rates,
                "summary": summary,
            },
            indent=1,
        )
    )
    print(f"\n{'way':<12} {'median':>7} {'min':>6} {'max':>6}   GB/s, grant -> first kernel done")
    for way, row in summary.items():
        print(f"{way:<12} {row['median']:>7.1f} {row['min']:>6.1f} {row['max']:>6.1f}")
    for way, rates in shim_rates.items():
        known = [rate for rate in rates if rate is not None]
        if known:
            print(
                f"{way:<12} the shim's prefetch alone: median {statistics.median(known):.1f} GB/s"
            )


if __name__ == "__main__":
    main()
