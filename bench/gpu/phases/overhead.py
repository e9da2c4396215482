"""The overhead phase: one process alone without and with a sharing tool (a trainer's step
time and results, the launch cost from interleaved pairs of launch-loop processes), and the
launch hook's own cost inside one process (hook_cost.cu)."""

from __future__ import annotations

import statistics

from gpu_measures import fastest_old_round_us, hook_cost_measures, median_step_s
from harness import Agent, run_json, trainer

# Each launch-loop process: 30 rounds of 10,000 launches (0.04 s each).  The host's speed at
# the driver's launch path wanders by up to ~1 µs per launch from moment to moment
# (launch_spread.py), so the fastest of many short rounds finds its quiet moments more surely
# than the fastest of 3 rounds of 100,000 (what the bench used until 2026-11-25;
# still reported, from ten consecutive rounds, for comparison).
LAUNCHES_PER_ROUND, LAUNCH_ROUNDS = 10_000, 30


def launch_pairs(launch_loop, tool_env, pairs) -> dict[str, list[float]]:
    """µs per launch without and with a tool, from interleaved pairs of processes (the order
    flipping each pair): each process's fastest round ("plain", "tool"), and its fastest
    100,000 launches in a row ("plain_100k", "tool_100k")."""
    found = {"plain": [], "tool": [], "plain_100k": [], "tool_100k": []}
    for pair in range(pairs):
        for with_tool in (False, True) if pair % 2 == 0 else (True, False):
            output = run_json(
                [launch_loop, str(LAUNCHES_PER_ROUND), str(LAUNCH_ROUNDS)],
                env=tool_env if with_tool else None,
            )
            side = "tool" if with_tool else "plain"
            found[side].append(output["us_per_launch"])
            found[f"{side}_100k"].append(fastest_old_round_us(output["rounds_us"]))
    return found


def sole_process_overhead(tool_env, launch_loop) -> dict:
    """One process alone, without and with a sharing tool (tool_env: its environment; the
    "shim" figures are the tool's)."""
    ratios, identical = [], []
    # Interleaved pairs, the order flipping each time, so neither drift nor the GPU warming
    # over a pair favours one side.
    for pair in range(3):
        runs = {
            shimmed: run_json(trainer("--steps", "50"), env=tool_env if shimmed else None)
            for shimmed in ((False, True) if pair % 2 == 0 else (True, False))
        }
        plain, shared = runs[False], runs[True]
        ratios.append(median_step_s(shared["step_times"]) / median_step_s(plain["step_times"]))
        identical.append(
            plain["checksum"] == shared["checksum"] and plain["loss"] == shared["loss"]
        )
    # 12 pairs: single processes of one build differ by up to ~0.6 µs per launch, so the
    # medians of 6 moved by ±0.2 µs from run to run (+0.308 in one, against +0.3).
    launches = launch_pairs(launch_loop, tool_env, pairs=12)
    plain_us, shared_us = launches["plain"], launches["tool"]
    return {
        "step_ratio_median": statistics.median(ratios),
        "step_ratios": ratios,
        "results_identical": all(identical),
        "launch_us_plain_median": statistics.median(plain_us),
        "launch_us_shim_median": statistics.median(shared_us),
        "launch_us_delta": statistics.median(shared_us) - statistics.median(plain_us),
        "launch_us_delta_100k": statistics.median(launches["tool_100k"])
        - statistics.median(launches["plain_100k"]),
        # Pair by pair (the two processes of a pair ran one after the other).
        "launch_us_delta_paired": statistics.median(
            tool - plain for plain, tool in zip(plain_us, shared_us)
        ),
        "launch_us_plain": plain_us,
        "launch_us_shim": shared_us,
        "launch_us_plain_100k": launches["plain_100k"],
        "launch_us_shim_100k": launches["tool_100k"],
    }


def hook_cost(program, shim_env, blocks=4000) -> dict:
    """The launch hook's own cost inside one process under the shim (hook_cost.cu)."""
    result = run_json([program, str(blocks)], env=shim_env)
    if result["hooked_in"] == result["driver_in"]:
        raise RuntimeError(
            f"dlsym gave the driver's own cuLaunchKernel ({result['hooked_in']}): "
            "is the shim preloaded?"
        )
    return {"measures": hook_cost_measures(result), **result}


def nvshare_overhead(workdir, launch_loop, hook_cost_program) -> dict:
    agent = Agent(workdir)
    try:
        overhead = sole_process_overhead(agent.env(), launch_loop)
        hook = hook_cost(hook_cost_program, agent.env(), blocks=2000)["measures"]
        return {**overhead, **{f"hook_{key}": value for key, value in hook.items()}}
    finally:
        agent.stop()
