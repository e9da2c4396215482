#!/usr/bin/env python3
"""nvshare and the original nvshare (grgalex/nvshare), the reference issue 6
measures against, side by side in one run.

    bench/gpu/run.sh --against-original ORIGINAL_BUILD [RESULTS]
    NVSHARE_BENCH_ONLY=nvshare_overhead,original_overhead bench/gpu/run.sh --against-original ...

ORIGINAL_BUILD holds `nvshare-scheduler`, `nvsharectl` and `libnvshare.so`
built from grgalex/nvshare's src/ (its Makefile).  Its socket path is compiled
in (/var/run/nvshare/scheduler.sock): run this as root, with no other
scheduler of it running.  Both tools get the same workloads and measures: one
process alone (phases/overhead.py's sole_process_overhead: step ratio, identical results,
launch cost); two trainers (gpu_measures.py's pair_measures: aggregate step rate over
the window both ran, shares, GPU busy fraction, turns from the step times);
drop to release as each scheduler saw it (ours from the agent's log, the
original's from the arrival of its scheduler's log lines), also with trainers
that let work queue ahead (loss read every 50 steps).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

from gpu_measures import drop_stats, pair_measures
from gpu_state import check_memory, environment
from harness import REPO, build_launch_loop, stop_process
from phase_runner import run_phases
from phases.overhead import nvshare_overhead, sole_process_overhead
from phases.trainers import QUEUE_AHEAD, pair_run, run_pair, solo_run

ORIGINAL_SOCKET = pathlib.Path("/var/run/nvshare/scheduler.sock")


class OriginalScheduler:
    """The original's scheduler, its log lines stamped with the time they arrived."""

    def __init__(self, build: pathlib.Path, time_quantum_s: int, anti_thrash=True):
        self.build = build
        self.lines: list[tuple[float, str]] = []
        ORIGINAL_SOCKET.unlink(missing_ok=True)
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        # It logs on stderr, unbuffered, so the arrival time of a line is the time of the event.
        self.process = subprocess.Popen(
            [str(build / "nvshare-scheduler")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        deadline = time.monotonic() + 10
        while not ORIGINAL_SOCKET.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "original scheduler did not start:\n" + "".join(line for _, line in self.lines)
                )
            time.sleep(0.05)
        for setting in (
            f"--set-tq={time_quantum_s}",
            f"--anti-thrash={'on' if anti_thrash else 'off'}",
        ):
            subprocess.run(
                [str(build / "nvsharectl"), setting],
                check=True,
                capture_output=True,
                env=env,
                timeout=10,
            )

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append((time.monotonic(), line))

    def env(self) -> dict:
        env = dict(os.environ, LD_PRELOAD=str(self.build / "libnvshare.so"))
        env.pop("NVSHARE_SOCKET", None)
        return env

    def stop(self) -> None:
        stop_process(self.process)
        self.reader.join(5)

    def drop_to_release_ms(self) -> list[float]:
        """From "Sent DROP_LOCK to client C" to "Received LOCK_RELEASED from C", as our agent measures it."""
        sent_at, drops = {}, []
        for stamp, line in self.lines:
            words = line.split()
            if "Sent DROP_LOCK to client" in line:
                sent_at[words[-1]] = stamp
            elif "Received LOCK_RELEASED from" in line and words[-1] in sent_at:
                drops.append((stamp - sent_at.pop(words[-1])) * 1000)
        return drops


def original_solo(build, seconds, time_quantum_s) -> dict:
    scheduler = OriginalScheduler(build, time_quantum_s)
    try:
        return solo_run(seconds, env=scheduler.env())
    finally:
        scheduler.stop()


def original_pair(build, seconds, time_quantum_s) -> dict:
    scheduler = OriginalScheduler(build, time_quantum_s)
    try:
        results = run_pair(scheduler.env(), seconds)
    finally:
        scheduler.stop()
    return {**pair_measures(results), **drop_stats(scheduler.drop_to_release_ms())}


def original_overhead(build, launch_loop) -> dict:
    scheduler = OriginalScheduler(build, 30)  # its default quantum: a run alone is not dropped
    try:
        return sole_process_overhead(scheduler.env(), launch_loop)
    finally:
        scheduler.stop()


def original_pair_queued(build, seconds, time_quantum_s) -> dict:
    scheduler = OriginalScheduler(build, time_quantum_s)
    try:
        run_pair(scheduler.env(), seconds, *QUEUE_AHEAD)
    finally:
        scheduler.stop()
    return drop_stats(scheduler.drop_to_release_ms())


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: original.py ORIGINAL_BUILD [RESULTS]")
    build = pathlib.Path(sys.argv[1]).resolve()
    missing = [
        name
        for name in ("nvshare-scheduler", "nvsharectl", "libnvshare.so")
        if not (build / name).exists()
    ]
    if missing:
        sys.exit(f"original.py: {build} lacks {', '.join(missing)}")
    results_dir = pathlib.Path(sys.argv[2] if len(sys.argv) > 2 else REPO / "results" / "gpu")
    results_dir.mkdir(parents=True, exist_ok=True)
    free_mib = check_memory()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="nvshare-vs-original-"))
    results = {"environment": environment(), "gpu_free_mib_at_start": free_mib}
    launch_loop = build_launch_loop(workdir)
    phases = [  # interleaved, so drift hits both tools alike
        ("nvshare_overhead", lambda: nvshare_overhead(workdir, launch_loop)),
        ("original_overhead", lambda: original_overhead(build, launch_loop)),
        ("solo", lambda: solo_run(20)),
        ("original_solo_tq5", lambda: original_solo(build, 20, 5)),
        ("nvshare_tq5", lambda: pair_run(workdir, 35, time_quantum_s=5)),
        ("original_tq5", lambda: original_pair(build, 35, 5)),
        ("nvshare_tq2", lambda: pair_run(workdir, 30, time_quantum_s=2)),
        ("original_tq2", lambda: original_pair(build, 30, 2)),
        (
            "nvshare_tq5_queued",
            lambda: pair_run(workdir, 35, queue_ahead=True, time_quantum_s=5),
        ),
        ("original_tq5_queued", lambda: original_pair_queued(build, 35, 5)),
        (
            "nvshare_tq2_queued",
            lambda: pair_run(workdir, 30, queue_ahead=True, time_quantum_s=2),
        ),
        ("original_tq2_queued", lambda: original_pair_queued(build, 30, 2)),
    ]
    run_phases(phases, results, results_dir / "original.json")
    print_table(results)


def print_table(results: dict) -> None:
    solo = results.get("solo", {}).get("steps_per_s")

    def cell(phase, render):
        try:
            return render(results[phase])
        except (KeyError, TypeError, ZeroDivisionError):
            return "n/a"

    def drops(v):
        return f"{v['drop_to_release_p50_ms']:.0f} / {v['drop_to_release_p99_ms']:.0f}"

    rows = [
        ("aggregate step rate / solo", lambda v: f"{v['aggregate_steps_per_s'] / solo:.3f}x"),
        ("shares", lambda v: " / ".join(f"{100 * x:.1f}%" for x in v["shares"])),
        (
            "GPU busy fraction (> 1: both compute at once)",
            lambda v: f"{v['gpu_busy_fraction']:.3f}",
        ),
        (
            "turns / turn p50 / turn max, s",
            lambda v: f"{v['turns']} / {v['turn_p50_s']:.2f} / {v['turn_max_s']:.2f}",
        ),
        ("drop -> release p50 / p99 ms", drops),
    ]

    def rate(v):
        return v["steps_per_s"]

    print(
        f"\nsolo, no tool: {cell('solo', lambda v: f'{rate(v):.2f}')} steps/s; under the original "
        f"(TQ 5 s): {cell('original_solo_tq5', lambda v: f'{rate(v) / solo:.3f}')} of that"
    )
    for label, key, fmt in (
        ("one process: training step ratio, tool / none", "step_ratio_median", "{:.4f}"),
        ("one process: results identical", "results_identical", "{}"),
        ("one process: empty-kernel launch, tool - none, us", "launch_us_delta", "{:+.3f}"),
    ):
        print(
            f"{label:<58}{cell('nvshare_overhead', lambda v, f=fmt, k=key: f.format(v[k])):>22}"
            f"{cell('original_overhead', lambda v, f=fmt, k=key: f.format(v[k])):>22}"
        )
    print(f"{'two trainers':<58}{'nvshare':>22}{'original':>22}")
    for tq in (5, 2):
        for label, render in rows:
            print(
                f"{f'TQ {tq} s: ' + label:<58}{cell(f'nvshare_tq{tq}', render):>22}"
                f"{cell(f'original_tq{tq}', render):>22}"
            )
    for tq in (5, 2):
        print(
            f"{f'TQ {tq} s, loss read every 50 steps: drop -> release p50 / p99 ms':<58}"
            f"{cell(f'nvshare_tq{tq}_queued', drops):>22}{cell(f'original_tq{tq}_queued', drops):>22}"
        )


if __name__ == "__main__":
    main()
