#!/usr/bin/env python3
"""Two trainers that fit together: nvshare's turns against the driver's time-slicing and
against one trainer alone (issue 44's i.: >= 0.99x).

    bench/gpu/run.sh --busy-turns [RESULTS] [--seconds S]

Runs, one after the other: the reference trainer (trainer.py) alone; two of them without
nvshare; two of them under the shim and an agent at its defaults (anti-thrash
auto: side by side until their use shows both busy, ~15 s on an H200, then turns).  Each
pair is judged over the window both were stepping, less its first WARM_S (under nvshare,
less the first SETTLE_S), and under nvshare also from its first turn on: what a long run
gets.  Prints each figure as steps/s and
the pairs' sums over the solo rate; all of it to RESULTS/busy_turns.json.
Safety: two reference trainers hold ~5.6 GiB of managed memory, checked against half of
the GPU's free memory first.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys
import tempfile

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
            stamp = " ".join(line.split()[:2])
            return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").timestamp()
    return None


def main() -> None:
    parser = argparse.ArgumentParser(prog="busy_turns", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="?", default="results/gpu")
    parser.add_argument("--seconds", type=float, default=20.0, help="each trainer's run")
    args = parser.parse_args()
    results = pathlib.Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    check_memory(PAIR_GIB)
    solo_result = finish_json(start_json(trainer("--seconds", str(args.seconds))), timeout=400)
    times = solo_result["step_times"]
    solo = rate(times, times[0] + WARM_S, times[-1])
    plain, _ = pair(args.seconds, None, WARM_S)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="busy-turns-"))
    agent = Agent(workdir, anti_thrash="auto", debug=True)
    try:
        shared, shared_times = pair(args.seconds + SETTLE_S, agent.env(), SETTLE_S)
    finally:
        agent.stop()
    log = agent.log()
    drops = [line for line in log.splitlines() if " drop gpu=" in line]
    # Once in turns, what the pair does for the rest of a long run; before, side by side
    # until both read busy (usage.py's window: ~15 s on an H200).
    turns_from = first_turn(log)
    in_turns = window(shared_times, turns_from) if turns_from else None
    figures = {
        "solo_steps_per_s": solo,
        "no_nvshare": plain,
        "nvshare": shared,
        "no_nvshare_over_solo": plain["sum"] / solo,
        "nvshare_over_solo": shared["sum"] / solo,
        "in_turns": in_turns,
        "turns_from_first_step_s": (
            turns_from - max(t[0] for t in shared_times) if turns_from else None
        ),
        "drops": len(drops),
        "drop_reasons": sorted({line.split("reason=")[1].split(" use=")[0] for line in drops}),
    }
    (results / "busy_turns.json").write_text(json.dumps(figures, indent=1))
    (results / "busy_turns_agent.log").write_text(log)
    print(f"solo {solo:.2f} steps/s")
    for name in ("no_nvshare", "nvshare"):
        f = figures[name]
        print(
            f"{name}: {f['rates'][0]:.2f} + {f['rates'][1]:.2f} = {f['sum']:.2f} steps/s "
            f"over {f['window_s']:.1f} s: {f['sum'] / solo:.3f}x solo"
        )
    if in_turns:
        print(
            f"nvshare from the first turn on ({figures['turns_from_first_step_s']:.1f} s after "
            f"the later first step): {in_turns['sum']:.2f} steps/s over "
            f"{in_turns['window_s']:.1f} s: {in_turns['sum'] / solo:.3f}x solo"
        )
    print(f"drops {len(drops)}: {', '.join(figures['drop_reasons'])}")


if __name__ == "__main__":
    sys.exit(main())
