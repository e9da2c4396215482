#!/usr/bin/env python3
"""Two trainers that fit together: nvshare's turns against the driver's time-slicing and
against one trainer alone (issue 44's i.: >= 0.99x).

    bench/gpu/run.sh --busy-turns [RESULTS] [--seconds S] [--pairs N]

Runs, one after the other: the reference trainer (trainer.py) alone; two of them without
nvshare; two of them under the shim and an agent at its defaults (anti-thrash
auto: side by side until their use shows both busy, ~15 s on an H200, then turns).  Each
pair is judged over the window both were stepping, less its first WARM_S (under nvshare,
less the first SETTLE_S), and under nvshare also from its first turn on: what a long run
gets.  --pairs N runs that pair N times, each under a fresh agent: the same policy read
0.974-0.996x in turns from run to run (docs/benchmarks.md); judge a change on a spread.
Prints each figure as steps/s and the pairs' sums over the solo rate; all of it to
RESULTS/busy_turns.json.
Safety: two reference trainers hold ~5.6 GiB of managed memory, checked against half of
the GPU's free memory first.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import tempfile

from gpu_measures import log_time
from gpu_state import check_memory
from harness import Agent, finish_json, start_json, trainer

WARM_S = 4.0
SETTLE_S = 10.0
PAIR_GIB = 6.0


def rate(step_times: list[float], start: float, end: float) -> float:
    steps = [t for t in step_times if start <= t <= end]
    return (len(steps) - 1) / (steps[-1] - steps[0]) if len(steps) > 1 else 0.0


def pair(seconds: float, env: dict | None, skip_s: float) -> tuple[dict, list[list[float]]]:
    runs = [start_json(trainer("--seconds", str(seconds)), env=env) for _ in range(2)]
    results = [finish_json(r, timeout=seconds + 240) for r in runs]
    times = [r["step_times"] for r in results]
    return window(times, max(t[0] for t in times) + skip_s), times


def window(times: list[list[float]], start: float) -> dict:
    end = min(t[-1] for t in times)
    rates = [rate(t, start, end) for t in times]
    return {"rates": rates, "sum": sum(rates), "window_s": end - start}


def first_turn(log: str) -> float | None:
    """When the agent granted the first turn (its log's clock is the trainers')."""
    for line in log.splitlines():
        if " grant gpu=" in line and "role=turn" in line:
            return log_time(line)
    return None


def under_nvshare(seconds: float) -> tuple[dict, str]:
    """One pair under a fresh agent at its defaults: its figures and the agent's log."""
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="busy-turns-"))
    agent = Agent(workdir, anti_thrash="auto", debug=True)
    try:
        shared, shared_times = pair(seconds + SETTLE_S, agent.env(), SETTLE_S)
    finally:
        agent.stop()
    log = agent.log()
    drops = [line for line in log.splitlines() if " drop gpu=" in line]
    # Once in turns, what the pair does for the rest of a long run; before, side by side
    # until both read busy (usage.py's window: ~15 s on an H200).
    turns_from = first_turn(log)
    return {
        "nvshare": shared,
        "in_turns": window(shared_times, turns_from) if turns_from else None,
        "turns_from_first_step_s": (
            turns_from - max(t[0] for t in shared_times) if turns_from else None
        ),
        "drops": len(drops),
        "drop_reasons": sorted({line.split("reason=")[1].split(" use=")[0] for line in drops}),
    }, log


def main() -> None:
    parser = argparse.ArgumentParser(prog="busy_turns", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="?", default="results/gpu")
    parser.add_argument("--seconds", type=float, default=20.0, help="each trainer's run")
    parser.add_argument(
        "--pairs", type=int, default=1, help="pairs under nvshare, one after another (spread)"
    )
    args = parser.parse_args()
    results = pathlib.Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    check_memory(PAIR_GIB)
    solo_result = finish_json(start_json(trainer("--seconds", str(args.seconds))), timeout=400)
    times = solo_result["step_times"]
    solo = rate(times, times[0] + WARM_S, times[-1])
    plain, _ = pair(args.seconds, None, WARM_S)
    print(f"solo {solo:.2f} steps/s")
    print(
        f"no_nvshare: {plain['rates'][0]:.2f} + {plain['rates'][1]:.2f} = {plain['sum']:.2f} "
        f"steps/s over {plain['window_s']:.1f} s: {plain['sum'] / solo:.3f}x solo"
    )
    runs = []
    for index in range(args.pairs):
        run, log = under_nvshare(args.seconds)
        runs.append(run)
        (results / f"busy_turns_agent{index or ''}.log").write_text(log)
        f, turns = run["nvshare"], run["in_turns"]
        print(
            f"nvshare: {f['rates'][0]:.2f} + {f['rates'][1]:.2f} = {f['sum']:.2f} steps/s "
            f"over {f['window_s']:.1f} s: {f['sum'] / solo:.3f}x solo"
        )
        if turns:
            print(
                f"  from the first turn on ({run['turns_from_first_step_s']:.1f} s after the "
                f"later first step): {turns['sum']:.2f} steps/s over {turns['window_s']:.1f} s: "
                f"{turns['sum'] / solo:.3f}x solo"
            )
        print(f"  drops {run['drops']}: {', '.join(run['drop_reasons'])}")
    whole = [r["nvshare"]["sum"] / solo for r in runs]
    in_turns = [r["in_turns"]["sum"] / solo for r in runs if r["in_turns"]]
    figures = {
        "solo_steps_per_s": solo,
        "no_nvshare": plain,
        "no_nvshare_over_solo": plain["sum"] / solo,
        **runs[0],  # the first pair's, as before --pairs
        "nvshare_over_solo": whole[0],
        "pairs": runs,
        "nvshare_over_solo_each": whole,
        "in_turns_over_solo_each": in_turns,
    }
    (results / "busy_turns.json").write_text(json.dumps(figures, indent=1))
    if args.pairs > 1:
        print(
            f"{args.pairs} pairs: {min(whole):.3f}-{max(whole):.3f}x solo (median "
            f"{statistics.median(whole):.3f}); from the first turn on "
            + (
                f"{min(in_turns):.3f}-{max(in_turns):.3f}x (median {statistics.median(in_turns):.3f})"
                if in_turns
                else "no turns"
            )
        )


if __name__ == "__main__":
    sys.exit(main())
