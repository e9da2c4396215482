"""The GPU benchmark's arithmetic, pure: percentiles, step rates, turns and shares of two
trainers, drop-to-release figures, the launch and hook figures, the agent log's clock.
No GPU, no processes."""

from __future__ import annotations

import random
import statistics
from datetime import datetime

# Ten consecutive rounds of 10,000 launches: the 100,000-launch round the bench used until
# 2026-11-25 (phases/overhead.py), still reported for comparison.
ROUNDS_PER_OLD_ROUND = 10


def log_time(line: str) -> float:
    """A line of the agent's log ("2026-11-25 16:02:03.456 INFO ...") as seconds, on the
    clock of time.time() (both local time)."""
    stamp = " ".join(line.split()[:2])
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").timestamp()


def percentile(values, fraction):
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def median_step_s(step_times, skip=10) -> float:
    deltas = [b - a for a, b in zip(step_times, step_times[1:])][skip:]
    return statistics.median(deltas)


def fastest_old_round_us(rounds_us) -> float:
    """The fastest run of ten consecutive short rounds: the old 100,000-launch round."""
    blocks = [
        rounds_us[i : i + ROUNDS_PER_OLD_ROUND]
        for i in range(0, len(rounds_us) - ROUNDS_PER_OLD_ROUND + 1, ROUNDS_PER_OLD_ROUND)
    ]
    return min(statistics.fmean(block) for block in blocks)


def bootstrap_95(statistic, *samples, draws, seed=1) -> tuple[float, float]:
    """95 % interval of statistic(*samples), each sample resampled with replacement."""
    rng = random.Random(seed)
    values = sorted(
        statistic(*[rng.choices(sample, k=len(sample)) for sample in samples]) for _ in range(draws)
    )
    return values[int(0.025 * draws)], values[int(0.975 * draws) - 1]


def hook_cost_measures(result: dict) -> dict:
    """One hook_cost process's blocks: each path's median ns per launch, and hook - driver
    paired block by block (the median: hook and gate; the mean adds the queue bound's marks)."""

    def block_by_block(path):
        return [ns - driver for ns, driver in zip(result[path], result["driver_ns"])]

    paired = block_by_block("hook_ns")
    low, high = bootstrap_95(statistics.fmean, paired, draws=2000)
    return {
        "driver_ns_median": statistics.median(result["driver_ns"]),
        "hook_ns_median": statistics.median(result["hook_ns"]),
        "delta_ns_median": statistics.median(paired),
        "delta_ns_mean": statistics.fmean(paired),
        "delta_ns_mean_95": [low, high],
        "ctx_get_current_ns": result.get("ctx_get_current_ns"),
        # hook_cost.cu's third path: one locked add right after the driver's own launch.
        "locked_add_ns_median": statistics.median(block_by_block("driver_then_locked_ns"))
        if "driver_then_locked_ns" in result
        else None,
    }


def steps_per_s(step_times, skip=5) -> float:
    times = step_times[skip:]
    return (len(times) - 1) / (times[-1] - times[0])


def gpu_step_s(result) -> float:
    """The GPU time of one step (its first kernel to its last), median over the run.

    The median leaves out the few steps whose span also covers a wait for the lock
    (under the shim a step's first event is recorded before its first gated launch)."""
    return statistics.median(result["gpu_spans_s"][5:])


def drop_stats(drops_ms) -> dict:
    return {
        "drop_to_release_ms": drops_ms,
        "drop_to_release_p50_ms": percentile(drops_ms, 0.5),
        "drop_to_release_p99_ms": percentile(drops_ms, 0.99),
    }


def turn_lengths(results) -> list[float]:
    """Each process's turns on the GPU, seen from its step times alone (so any sharing tool can be measured).

    A turn is a run of one process's steps with none of the other's between; its length runs from the
    other's last step before it to its own last step, so it includes the handoff.  The first and last
    turns are cut short by the run's start and end and are left out."""
    steps = sorted((t, owner) for owner, r in enumerate(results) for t in r["step_times"])
    turn_ends = []  # (owner, time of its last step in that turn)
    for t, owner in steps:
        if turn_ends and turn_ends[-1][0] == owner:
            turn_ends[-1] = (owner, t)
        else:
            turn_ends.append((owner, t))
    return [b[1] - a[1] for a, b in zip(turn_ends, turn_ends[1:])][1:-1]


def pair_measures(results) -> dict:
    """Rates over the window in which both had started training (their 4th step: past
    their warm-up) and neither had stopped.  Shares over the window in which both were
    at work (from the later of their starts, set-up included): turns of TQ put one's 4th
    step a whole turn after the other's, and a window from there held one turn of one
    and a few seconds of the other."""
    window_start = max(r["step_times"][3] for r in results)
    window_end = min(r["step_times"][-1] for r in results)
    counts = [sum(window_start <= t <= window_end for t in r["step_times"]) for r in results]
    window = window_end - window_start
    busy = sum(count / window * gpu_step_s(r) for count, r in zip(counts, results))
    both_in = max(r.get("started_at", r["step_times"][0]) for r in results)
    in_loops = [sum(both_in <= t <= window_end for t in r["step_times"]) for r in results]
    turns = turn_lengths(results)
    return {
        "window_s": window,
        "steps": counts,
        "gpu_step_s": [gpu_step_s(r) for r in results],
        "aggregate_steps_per_s": sum(counts) / window,
        "gpu_busy_fraction": busy,
        "shares_window_s": window_end - both_in,
        "shares": [c / sum(in_loops) for c in in_loops],
        "turns": len(turns),
        "turn_p50_s": percentile(turns, 0.5),
        "turn_max_s": max(turns, default=float("nan")),
    }
