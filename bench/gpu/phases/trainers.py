"""Trainers alone and in pairs: one trainer without a tool or under one (its step rate and
the share of wall time the GPU computes), two identical trainers under the shim and an
agent with given settings (aggregate rate, shares, turns, drop to release)."""

from __future__ import annotations

from gpu_measures import drop_stats, gpu_step_s, pair_measures, steps_per_s
from harness import Agent, finish_json, run_json, start_json, trainer


def solo_run(seconds, env=None, *trainer_args) -> dict:
    """One trainer alone, with no tool (env None) or under one."""
    result = run_json(trainer("--seconds", str(seconds), "--gpu-spans", *trainer_args), env=env)
    rate = steps_per_s(result["step_times"])
    # Steps per second times GPU seconds per step: the share of wall time the GPU computes.
    return {
        "steps_per_s": rate,
        "gpu_step_s": gpu_step_s(result),
        "gpu_busy_fraction": rate * gpu_step_s(result),
    }


def run_pair(env, seconds, *trainer_args) -> list[dict]:
    processes = [
        start_json(trainer("--seconds", str(seconds), *(trainer_args or ("--gpu-spans",))), env=env)
        for _ in range(2)
    ]
    return [finish_json(p) for p in processes]


# Trainers that read the loss every 50 steps let work queue ahead of the GPU, as loops that log
# every N steps do: what a drop has to drain (reading it every step leaves at most one step queued).
QUEUE_AHEAD = ("--sync-every", "50")


# A trainer that leaves the GPU idle: a 2 s pause (an evaluation, a checkpoint) after every 20
# steps (~1.9 s of GPU time), longer than the agent's idle release (1 s).  Not in the default run:
# it shows where taking turns gains over one process alone (issue 6's aggregate figure).
PAUSING = ("--pause-every", "20", "--pause-s", "2")


def pair_run(workdir, seconds, queue_ahead=False, trainer_args=(), **agent_settings) -> dict:
    """Two identical trainers under the shim and the agent.  With queue_ahead, step times are
    the times steps were queued, so only the agent's figures (drop to release) are taken."""
    agent = Agent(workdir, **agent_settings)
    try:
        results = run_pair(agent.env(), seconds, *(QUEUE_AHEAD if queue_ahead else trainer_args))
        releases = agent.events("release")
        revokes = agent.events("revoke")
        grants = agent.events("grant")
    finally:
        agent.stop()
    drops = [float(e["drop_to_release_ms"]) for e in releases if "drop_to_release_ms" in e]
    measures = {} if queue_ahead else pair_measures(results)
    return {**measures, "grants": len(grants), "revokes": len(revokes), **drop_stats(drops)}
