#!/usr/bin/env python3
"""Where the spread of the launch figure comes from.

Single launch-loop processes of one build differ by up to ~1 µs per launch (launch_pairs.py).
This runs PROCESSES rounds of five ways of starting the same loop, interleaved: plain; plain
with address-space randomisation off (`setarch -R`: every process gets the same layout);
plain pinned to one CPU; under the shim; under the shim with randomisation off.  Each process
runs 6 rounds of 100,000 launches.  Per way it prints the spread of the processes' fastest
rounds, the spread of the rounds inside one process, and how much of a round went to
enqueueing the launches (all of it: the host is the bottleneck).  Full numbers go to
RESULTS/launch_spread.json.

    bench/gpu/run.sh --launch-spread [PROCESSES] [RESULTS]
"""

from __future__ import annotations

import json
import pathlib
import platform
import statistics
import tempfile

from harness import Agent, build_launch_loop, count_and_results_dir, run_json

ADDRESSES_FIXED = ["setarch", platform.machine(), "-R"]
ONE_CPU = ["taskset", "-c", "4"]


def spread_measures(processes: list[dict]) -> dict:
    """Summary of one way's launch_loop outputs (µs per launch).  The first round is left out
    of the within-process spread: it may still be warming up."""
    fastest = [min(process["rounds_us"]) for process in processes]
    within = [
        max(process["rounds_us"][1:]) - min(process["rounds_us"][1:]) for process in processes
    ]
    enqueue_share = [
        min(process["enqueue_us"]) / min(process["rounds_us"]) for process in processes
    ]
    return {
        "fastest_median": statistics.median(fastest),
        "fastest_range": [min(fastest), max(fastest)],
        "within_process_spread_median": statistics.median(within),
        "enqueue_share_median": statistics.median(enqueue_share),
    }


def main() -> None:
    count, results_dir = count_and_results_dir("launch_spread", "PROCESSES", default=8, minimum=2)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="nvshare-spread-"))
    launch_loop = build_launch_loop(workdir)
    agent = Agent(workdir)
    ways = {
        "plain": ([], None),
        "plain, addresses fixed": (ADDRESSES_FIXED, None),
        "plain, one CPU": (ONE_CPU, None),
        "shim": ([], agent.env()),
        "shim, addresses fixed": (ADDRESSES_FIXED, agent.env()),
    }
    outputs = {way: [] for way in ways}
    try:
        for _ in range(count):
            for way, (prefix, env) in ways.items():
                outputs[way].append(run_json([*prefix, launch_loop, "100000", "6"], env=env))
    finally:
        agent.stop()
    measures = {way: spread_measures(processes) for way, processes in outputs.items()}
    (results_dir / "launch_spread.json").write_text(
        json.dumps({"processes": count, "measures": measures, "outputs": outputs}, indent=1)
    )
    print(
        f"µs per launch, {count} processes per way; fastest round of each process, median (range);"
        " spread of rounds 2-6 inside a process, median; enqueue / round"
    )
    for way, m in measures.items():
        low, high = m["fastest_range"]
        print(
            f"{way:24s} {m['fastest_median']:.3f} ({low:.3f}-{high:.3f})  "
            f"{m['within_process_spread_median']:.3f}  {m['enqueue_share_median']:.3f}"
        )


if __name__ == "__main__":
    main()
