"""A notebook beside a trainer: how long each of its bursts waits for the GPU, and what the
trainer keeps of its solo rate meanwhile (notebook.py)."""

from __future__ import annotations

import sys

from gpu_measures import percentile
from harness import HERE, Agent, finish_json, start_json, trainer, wait_for_file


def notebook_beside_trainer(
    workdir, time_quantum_s, seconds, trainer_extra_s=40, **agent_settings
) -> dict:
    """A notebook (a ~50 ms burst of GPU work every 2 s) beside the reference trainer:
    how long each burst waits for the GPU (the agent's grant lines), and the trainer's
    step rate meanwhile (compared with the solo phase's)."""
    agent = Agent(workdir, time_quantum_s=time_quantum_s, **agent_settings)
    try:
        # The trainer outlives the notebook, so every burst competes with it; it stops by
        # itself soon after, so that its step times come back.
        ready = agent.dir / "trainer-ready"
        training = start_json(
            trainer("--seconds", str(seconds + trainer_extra_s), "--ready-file", str(ready)),
            env=agent.env(),
        )
        # Its first step, not its first grant: in its setup it leaves the GPU idle for seconds
        # (the shim gives the lock back), and a notebook starting then finds the GPU free.
        wait_for_file(ready, training)
        notebook = start_json(
            [sys.executable, str(HERE / "notebook.py"), "--seconds", str(seconds)], env=agent.env()
        )
        bursts = finish_json(notebook, timeout=seconds + 120)
        if training.poll() is not None:
            raise RuntimeError(
                f"the trainer stopped before the notebook:\n{training.stderr.read()[-3000:]}"
            )
        trained = finish_json(training, timeout=120)
        waits = [
            float(e["waited_ms"])
            for e in agent.events("grant")
            if e.get("pid") == str(notebook.pid)
        ]
        modes = [e.get("mode") for e in agent.events("mode")]
    finally:
        agent.stop()
    # The trainer's rate while the notebook ran, from its own step times (wall clock).
    start, end = bursts["started_at"], bursts["ended_at"]
    steps = [t for t in trained["step_times"] if start <= t <= end]
    rate = (len(steps) - 1) / (steps[-1] - steps[0]) if len(steps) > 2 else float("nan")
    return {
        "time_quantum_s": time_quantum_s,
        **{key: str(value) for key, value in agent_settings.items()},
        "grant_waits_ms": waits,
        "wait_p50_ms": percentile(waits, 0.5),
        "wait_p95_ms": percentile(waits, 0.95),
        "burst_latency_p50_s": percentile(bursts["burst_latencies_s"], 0.5),
        "burst_latency_p95_s": percentile(bursts["burst_latencies_s"], 0.95),
        "burst_gpu_ms": bursts.get("burst_gpu_ms"),
        "bursts": len(bursts["burst_latencies_s"]),
        "trainer_steps_per_s": rate,
        "auto_modes": modes,
    }
