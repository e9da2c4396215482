"""Running a script's phases one after the other: the ones NVSHARE_BENCH_ONLY picks, each
under the clock sampler, its results saved as soon as it ends and its agents' logs kept."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import time

from gpu_state import GpuClockSampler


def keep_agent_logs(workdir: pathlib.Path, logs_dir: pathlib.Path, phase: str, kept: set) -> None:
    """Copies the logs of the agents a phase started (workdir/agent-*) to logs_dir/PHASE[-N].log."""
    for number, agent_dir in enumerate(sorted(set(workdir.glob("agent-*")) - kept)):
        kept.add(agent_dir)
        logs_dir.mkdir(exist_ok=True)
        shutil.copyfile(
            agent_dir / "agent.log", logs_dir / f"{phase}{f'-{number + 1}' if number else ''}.log"
        )


def run_phases(
    phases, results: dict, results_file: pathlib.Path, extra=(), unsampled=(), workdir=None
) -> None:
    """Runs the (name, function) phases that NVSHARE_BENCH_ONLY picks (all but the extra ones by
    default), saving the results after each, and the logs of the agents in workdir beside them;
    every phase but the unsampled ones under a GpuClockSampler."""
    only = set(os.environ.get("NVSHARE_BENCH_ONLY", "").split(",")) - {""}
    kept_logs = set()
    for name, phase in phases:
        selected = name in only if only else name not in extra
        if not selected:
            continue
        started = time.monotonic()
        clocks = None if name in unsampled else GpuClockSampler()
        try:
            results[name] = phase()
        except Exception as error:  # one failed phase must not lose the others' numbers
            results[name] = {"error": str(error)[-2000:]}
        if clocks is not None:
            results[name]["gpu_clocks"] = clocks.stop()
        results[name]["phase_seconds"] = round(time.monotonic() - started, 1)
        print(f"bench: {name} done in {results[name]['phase_seconds']} s", flush=True)
        results_file.write_text(json.dumps(results, indent=2))
        if workdir is not None:
            keep_agent_logs(workdir, results_file.parent / "agent-logs", name, kept_logs)
