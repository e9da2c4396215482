#!/usr/bin/env python3
"""Never hang an application (issue 27) on a real GPU:

1. A trainer under the shim, started while the agent is stopped (SIGSTOP: its
   socket accepts, nobody answers) and kept stopped for 30 s, must finish on
   its own and compute exactly what a plain run computes.  It pauses 2 s every
   20 steps, so it also asks again for the GPU after idle releases.
2. Shims reconnect soon after a new agent listens: PROCESSES heartbeat
   programs under the shim across ROUNDS agent restarts (the agent removes its
   socket on exit; the new one makes it again); per process and round, from
   the new agent's "listening on" line to its "connect pid=" line.

    bench/gpu/run.sh --liveness [RESULTS]
Prints one JSON summary; full numbers in RESULTS/liveness.json.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

from gpu_measures import log_time, percentile
from harness import Agent, build_cuda_program, run_json, start_json, trainer

STOPPED_S = 30
PROCESSES, ROUNDS = 6, 5


def stopped_agent(workdir: pathlib.Path) -> dict:
    steps = ("--steps", "60", "--pause-every", "20", "--pause-s", "2")
    plain = run_json(trainer(*steps), timeout=300)
    agent = Agent(workdir, anti_thrash="auto")
    try:
        os.kill(agent.process.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        process = subprocess.run(
            trainer(*steps), env=agent.env(), capture_output=True, text=True, timeout=300
        )
        finished_after = time.monotonic() - stopped_at
        time.sleep(max(0.0, STOPPED_S - finished_after))
    finally:
        os.kill(agent.process.pid, signal.SIGCONT)
        agent.stop()
    shimmed = json.loads(process.stdout.strip().splitlines()[-1]) if process.returncode == 0 else {}
    warnings = [line for line in process.stderr.splitlines() if "[nvshare]" in line]
    return {
        "returncode": process.returncode,
        "finished_after_s": finished_after,
        "finished_while_stopped": finished_after < STOPPED_S,
        "results_identical": shimmed.get("checksum") == plain["checksum"]
        and shimmed.get("loss") == plain["loss"],
        "shim_lines": warnings[:10],
    }


def reconnects(workdir: pathlib.Path) -> dict:
    heartbeat = build_cuda_program(workdir, "heartbeat")
    agent = Agent(workdir, anti_thrash="auto")
    socket_path = agent.socket
    seconds = ROUNDS * 6 + 10
    processes = [
        start_json([heartbeat, str(seconds), "20"], env=agent.env()) for _ in range(PROCESSES)
    ]
    pids = {str(p.pid) for p in processes}
    delays_ms, per_round = [], []
    try:
        _wait_connected(agent, pids)
        for _ in range(ROUNDS):
            agent.stop()
            time.sleep(1.0)  # the shims run unscheduled meanwhile
            agent = Agent(workdir, anti_thrash="auto", socket=socket_path)
            _wait_connected(agent, pids)
            lines = agent.log().splitlines()
            listening = log_time(next(line for line in lines if "listening on" in line))
            round_ms = []
            for pid in pids:
                connect = next(line for line in lines if f" connect pid={pid} " in line)
                round_ms.append((log_time(connect) - listening) * 1000)
            per_round.append(sorted(round_ms))
            delays_ms += round_ms
    finally:
        agent.stop()
        results = [p.communicate(timeout=120)[0] for p in processes]
    return {
        "processes": PROCESSES,
        "rounds": ROUNDS,
        "reconnect_ms": per_round,
        "reconnect_p50_ms": percentile(delays_ms, 0.5),
        "reconnect_p99_ms": percentile(delays_ms, 0.99),
        "reconnect_max_ms": max(delays_ms),
        "programs_ok": sum("result=ok" in out for out in results),
    }


def _wait_connected(agent: Agent, pids: set[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = agent.log()
        if all(f" connect pid={pid} " in log for pid in pids):
            return
        time.sleep(0.05)
    raise RuntimeError(f"not every heartbeat connected within {timeout} s:\n{agent.log()[-2000:]}")


def main() -> None:
    results_dir = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "results/gpu")
    results_dir.mkdir(parents=True, exist_ok=True)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="nvshare-liveness-"))
    results = {"stopped_agent": stopped_agent(workdir), "reconnects": reconnects(workdir)}
    (results_dir / "liveness.json").write_text(json.dumps(results, indent=2))
    summary = {
        "stopped_agent": {k: v for k, v in results["stopped_agent"].items() if k != "shim_lines"},
        **{k: v for k, v in results["reconnects"].items() if k != "reconnect_ms"},
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
