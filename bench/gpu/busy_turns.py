#!/usr/bin/env python3
"""Two trainers that fit together: nvshare's turns against the driver's time-slicing and
against one trainer alone (issue 44's i.: >= 0.99x).

    bench/gpu/run.sh --busy-turns [RESULTS] [--seconds S]

Runs, one after the other: the reference trainer (trainer.py) alone; two of them without
nvshare; two of them under the shim and an agent at its defaults (anti-thrash auto:
together until their use shows both busy, ~5 s, then turns; --seconds past TQ to see more
than one).  Each pair is judged over
the window both were stepping, less its first WARM_S (under nvshare, less the first
SETTLE_S: the turns begin once their use reads busy).  Prints each figure as steps/s and
the pairs' sums over the solo rate; all of it to RESULTS/busy_turns.json.
Safety: two reference trainers hold ~5.6 GiB of managed memory, checked against half of
the GPU's free memory first.
"""

from __future__ import annotations

import argparse
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


def pair(seconds: float, env: dict | None, skip_s: float) -> dict:
    runs = [start_json(trainer("--seconds", str(seconds)), env=env) for _ in range(2)]
    results = [finish_json(r, timeout=seconds + 240) for r in runs]
    times = [r["step_times"] for r in results]
    start = max(t[0] for t in times) + skip_s
    end = min(t[-1] for t in times)
    rates = [rate(t, start, end) for t in times]
    return {"rates": rates, "sum": sum(rates), "window_s": end - start}


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
    plain = pair(args.seconds, None, WARM_S)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="busy-turns-"))
    agent = Agent(workdir, anti_thrash="auto", debug=True)
    try:
        shared = pair(args.seconds + SETTLE_S, agent.env(), SETTLE_S)
    finally:
        agent.stop()
    log = agent.log()
    drops = [line for line in log.splitlines() if " drop gpu=" in line]
    figures = {
        "solo_steps_per_s": solo,
        "no_nvshare": plain,
        "nvshare": shared,
        "no_nvshare_over_solo": plain["sum"] / solo,
        "nvshare_over_solo": shared["sum"] / solo,
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
    print(f"drops {len(drops)}: {', '.join(figures['drop_reasons'])}")


if __name__ == "__main__":
    sys.exit(main())
