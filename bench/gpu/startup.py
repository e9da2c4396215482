#!/usr/bin/env python3
"""What the shim adds to a CUDA process's start.

The reference trainer's time from spawn to its first step, without and with the shim, in
interleaved pairs (the order flipping each pair), and the grants each start under the shim
took: between copying its weights and its first kernel the trainer leaves the GPU idle for
seconds, so the shim gives the lock back and asks again.  Full numbers go to RESULTS/startup.json.

    bench/gpu/run.sh --startup [PAIRS] [RESULTS]
"""

from __future__ import annotations

import collections
import json
import pathlib
import statistics
import tempfile
import time

from gpu_measures import bootstrap_95
from harness import Agent, count_and_results_dir, run_json, trainer


def seconds_to_first_step(env) -> float:
    spawned = time.time()
    return run_json(trainer("--steps", "3"), env=env)["step_times"][0] - spawned


def startup_measures(plain_s, shim_s, grants_per_start) -> dict:
    """Medians of both sides, their ratio, each pair's difference (shim - plain) and their mean
    with its 95 % bootstrap interval.  The second start of a pair tends to be the slower one,
    whichever it is; the order flips each pair, so an even number of pairs cancels that out."""
    plain, shim = statistics.median(plain_s), statistics.median(shim_s)
    paired = [s - p for s, p in zip(shim_s, plain_s)]
    return {
        "plain_s": plain_s,
        "shim_s": shim_s,
        "plain_median_s": plain,
        "shim_median_s": shim,
        "shim_over_plain": shim / plain,
        "paired_delta_s": paired,
        "mean_paired_delta_s": statistics.fmean(paired),
        "mean_paired_delta_95_s": bootstrap_95(statistics.fmean, paired, draws=4000),
        "grants_per_start": grants_per_start,
    }


def main() -> None:
    pairs, results_dir = count_and_results_dir("startup", "PAIRS", default=10, minimum=1)
    agent = Agent(pathlib.Path(tempfile.mkdtemp(prefix="nvshare-startup-")))
    plain_s, shim_s = [], []
    try:
        # Not counted: the first start on a machine reads PyTorch and CUDA from disk (12 s against 8).
        seconds_to_first_step(None)
        for pair in range(pairs):
            for shimmed in (False, True) if pair % 2 == 0 else (True, False):
                (shim_s if shimmed else plain_s).append(
                    seconds_to_first_step(agent.env() if shimmed else None)
                )
        # Only the processes under the shim talk to the agent, in the order they started.
        grants = collections.Counter(event["pid"] for event in agent.events("grant"))
    finally:
        agent.stop()
    measures = startup_measures(plain_s, shim_s, list(grants.values()))
    (results_dir / "startup.json").write_text(json.dumps(measures, indent=1))
    print(
        f"spawn to first step, plain: median {measures['plain_median_s']:.2f} s "
        f"({min(plain_s):.2f}-{max(plain_s):.2f})"
    )
    print(
        f"spawn to first step, shim:  median {measures['shim_median_s']:.2f} s "
        f"({min(shim_s):.2f}-{max(shim_s):.2f}); shim / plain {measures['shim_over_plain']:.3f}"
    )
    low, high = measures["mean_paired_delta_95_s"]
    print(
        f"shim - plain, mean of {pairs} pairs: {measures['mean_paired_delta_s']:+.2f} s "
        f"(95 % bootstrap {low:+.2f} .. {high:+.2f})"
    )
    print(f"grants per start under the shim (3 steps): {measures['grants_per_start']}")


if __name__ == "__main__":
    main()
