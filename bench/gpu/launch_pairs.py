#!/usr/bin/env python3
"""The launch figure from many interleaved pairs, with a bootstrap interval.

Single launch-loop processes differ by up to ~1 µs per launch on one machine, with or
without the shim, so the 6 pairs of run.py's overhead phase resolve about ±0.5 µs.  This
runs PAIRS pairs (30 take about 2.5 minutes on an H100) and prints the delta of the
medians with its 95 % bootstrap interval; full numbers go to RESULTS/launch_pairs.json.

    bench/gpu/run.sh --launch-pairs [PAIRS] [RESULTS]
"""

from __future__ import annotations

import json
import pathlib
import statistics
import tempfile

from gpu_measures import bootstrap_95
from harness import Agent, build_launch_loop, count_and_results_dir
from phases.overhead import launch_pairs


def bootstrap_delta(plain, tool, draws=4000, seed=1) -> tuple[float, float]:
    """95 % interval of median(tool) - median(plain), resampling each side."""
    return bootstrap_95(
        lambda tool, plain: statistics.median(tool) - statistics.median(plain),
        tool,
        plain,
        draws=draws,
        seed=seed,
    )


def main() -> None:
    pairs, results_dir = count_and_results_dir("launch_pairs", "PAIRS", default=30, minimum=2)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="nvshare-launch-"))
    launch_loop = build_launch_loop(workdir)
    agent = Agent(workdir)
    try:
        launches = launch_pairs(launch_loop, agent.env(), pairs)
    finally:
        agent.stop()
    plain, shim = launches["plain"], launches["tool"]
    low, high = bootstrap_delta(plain, shim)
    delta = statistics.median(shim) - statistics.median(plain)
    paired = [s - p for s, p in zip(shim, plain)]
    (results_dir / "launch_pairs.json").write_text(
        json.dumps(
            {
                "pairs": pairs,
                "launch_us_plain": plain,
                "launch_us_shim": shim,
                "launch_us_plain_100k": launches["plain_100k"],
                "launch_us_shim_100k": launches["tool_100k"],
                "delta_of_medians": delta,
                "bootstrap_95": [low, high],
                "mean_paired_delta": statistics.mean(paired),
            },
            indent=1,
        )
    )
    print(
        f"plain  median {statistics.median(plain):.3f} µs/launch (runs {min(plain):.2f}-{max(plain):.2f})"
    )
    print(
        f"shim   median {statistics.median(shim):.3f} µs/launch (runs {min(shim):.2f}-{max(shim):.2f})"
    )
    print(
        f"delta  {delta:+.3f} µs, 95 % bootstrap {low:+.3f} .. {high:+.3f}; "
        f"mean of paired deltas {statistics.mean(paired):+.3f} ({pairs} pairs)"
    )


if __name__ == "__main__":
    main()
