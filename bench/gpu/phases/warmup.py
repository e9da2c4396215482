"""The warm-up phase: how fast an 8 GiB working set comes back to the GPU (warmup.py)."""

from __future__ import annotations

import statistics
import sys

from harness import HERE, Agent, run_json


def warm_up(workdir) -> dict:
    """Three ways back for an 8 GiB working set pushed to host memory: the shim's
    bulk prefetch on the grant, page faults (NVSHARE_PREFETCH=0), and, as the
    ceiling, the process prefetching by hand with no agent (so no lock at all)."""
    agent = Agent(workdir, idle_release_ms=1000)
    command = [sys.executable, str(HERE / "warmup.py"), "--gib", "8"]
    runs = {"prefetch": [], "page_faults": [], "driver_prefetch": []}
    shim_logs = []
    try:
        for _ in range(3):
            runs["prefetch"].append(
                run_json(
                    command,
                    env=agent.env(NVSHARE_PREFETCH=1, NVSHARE_DEBUG=1),
                    timeout=180,
                    stderr_into=shim_logs,
                )["gb_per_s"]
            )
            runs["page_faults"].append(
                run_json(command, env=agent.env(NVSHARE_PREFETCH=0), timeout=180)["gb_per_s"]
            )
            no_agent = agent.env(NVSHARE_SOCKET=workdir / "no-agent.sock")
            runs["driver_prefetch"].append(
                run_json(command + ["--self-prefetch"], env=no_agent, timeout=180)["gb_per_s"]
            )
    finally:
        agent.stop()
    # The shim's own timing of each bulk prefetch (NVSHARE_DEBUG): where the time goes.
    shim_prefetch = [
        line.split("nvshare", 1)[-1]
        for log in shim_logs
        for line in log.splitlines()
        if "prefetch gpu=" in line
    ]
    best = {mode: statistics.median(values) for mode, values in runs.items()}
    return {
        "gb_per_s": runs,
        "prefetch_gb_per_s": best["prefetch"],
        "page_fault_gb_per_s": best["page_faults"],
        "driver_prefetch_gb_per_s": best["driver_prefetch"],
        "shim_prefetch_log": shim_prefetch,
        "speedup": best["prefetch"] / best["page_faults"],
    }
