#!/usr/bin/env python3
"""What sharing a GPU through nvshare costs, measured end to end on one GPU.

Runs the agent on a private socket (no systemd or D-Bus needed), the workloads
in this folder with and without the shim, and prints a table of ratios and
percentiles taken in this one run; full numbers go to RESULTS/gpu.json.

    bench/gpu/run.sh [RESULTS]            # RESULTS defaults to results/gpu

Safety: every process under the shim allocates managed memory.  All of it
together stays under half of the card's free memory (checked before start):
asking for more can hang a shared GPU.
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
SHIM = REPO / "shim" / "build" / "libnvshare.so"
# The same objects for containers with an older glibc (shim/Makefile).
PORTABLE_SHIM = REPO / "shim" / "build" / "libnvshare-portable.so"
PLANNED_MANAGED_GIB = 12  # the largest phase: the 8 GiB warm-up, or two trainers of ~3.5 GiB


def percentile(values, fraction):
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def stop_process(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()


class Agent:
    """The real agent on a temporary socket, configured through its config file (tests/gpu uses
    it too).  base_env: the environment it starts from (os.environ by default)."""

    started = itertools.count()

    def __init__(
        self,
        workdir: pathlib.Path,
        time_quantum_s=30,
        anti_thrash=True,
        idle_release_ms=1000,
        debug=False,
        base_env=None,
        memory_limit=None,
        socket=None,
        extra_config="",
    ):
        """anti_thrash: True/False (on/off, what the phases before auto used), or
        "on", "off", "auto"; memory_limit: the config's memory_limit (e.g. "1G"); socket: a
        path of one's own (a restarted agent on the socket its clients know); extra_config:
        more of the config file (share_by, [share:GROUP] sections: shares.py)."""
        # Numbered, so a phase's logs are kept in the order its agents started (keep_agent_logs).
        self.dir = pathlib.Path(
            tempfile.mkdtemp(dir=workdir, prefix=f"agent-{next(Agent.started):04d}-")
        )
        (self.dir / "state").mkdir()
        config = self.dir / "nvshare.conf"
        if isinstance(anti_thrash, bool):
            anti_thrash = "on" if anti_thrash else "off"
        config.write_text(
            f"[scheduler]\ntime_quantum = {time_quantum_s}\n"
            f"anti_thrash = {anti_thrash}\n"
            f"idle_release_ms = {idle_release_ms}\n"
            + (f"memory_limit = {memory_limit}\n" if memory_limit else "")
            + extra_config
        )
        self.socket = pathlib.Path(socket) if socket else self.dir / "scheduler.sock"
        self.log_path = self.dir / "agent.log"
        env = dict(os.environ if base_env is None else base_env)
        env.pop("LD_PRELOAD", None)
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "nvshare_agent",
                    "--socket",
                    str(self.socket),
                    "--bus",
                    "none",
                    "--config",
                    str(config),
                    "--state-dir",
                    str(self.dir / "state"),
                    *(["--debug"] if debug else []),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        try:
            wait_for_file(self.socket, self.process, timeout=20, poll_s=0.05)
        except RuntimeError:
            raise RuntimeError("agent did not start:\n" + self.log_path.read_text()) from None

    def env(self, **extra) -> dict:
        env = dict(os.environ, LD_PRELOAD=str(SHIM), NVSHARE_SOCKET=str(self.socket))
        env.update({key: str(value) for key, value in extra.items()})
        return env

    def stop(self) -> None:
        stop_process(self.process)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self, name: str) -> list[dict]:
        """Parsed `name key=value ...` lines of the agent's log."""
        time.sleep(0.1)  # the agent buffers its log for up to 20 ms
        found = []
        for line in self.log().splitlines():
            words = line.split()
            if name in words:
                start = words.index(name)
                found.append(dict(w.split("=", 1) for w in words[start + 1 :] if "=" in w))
        return found


def run_json(command, env=None, timeout=300, stderr_into=None) -> dict:
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{command} failed:\n{done.stderr[-3000:]}")
    if stderr_into is not None:
        stderr_into.append(done.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def start_json(command, env=None):
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def finish_json(process, timeout=300) -> dict:
    out, err = process.communicate(timeout=timeout)
    if process.returncode != 0:
        raise RuntimeError(f"{process.args} failed:\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def wait_for_file(path: pathlib.Path, process: subprocess.Popen, timeout=120, poll_s=0.1) -> None:
    """Returns once process has created path (the agent its socket, a trainer its ready file)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None:
            output = process.stderr.read()[-3000:] if process.stderr else ""
            raise RuntimeError(f"{process.args} stopped before creating {path}:\n{output}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{process.args} did not create {path} in {timeout} s")
        time.sleep(poll_s)


def trainer(*args) -> list[str]:
    return [sys.executable, str(HERE / "trainer.py"), *args]


def median_step_s(step_times, skip=10) -> float:
    deltas = [b - a for a, b in zip(step_times, step_times[1:])][skip:]
    return statistics.median(deltas)


def count_and_results_dir(script, what, default, minimum) -> tuple[int, pathlib.Path]:
    """`SCRIPT [COUNT] [RESULTS]` of the side scripts: the count, checked (a bad one ends the
    script with one line), and the results folder, made."""
    try:
        count = int(sys.argv[1]) if len(sys.argv) > 1 else default
    except ValueError:
        sys.exit(f"{script}: {what} must be a whole number, not {sys.argv[1]!r}")
    if count < minimum:
        sys.exit(f"{script}: {what} must be at least {minimum}")
    results_dir = pathlib.Path(sys.argv[2] if len(sys.argv) > 2 else "results/gpu")
    results_dir.mkdir(parents=True, exist_ok=True)
    return count, results_dir


def build_cuda_program(workdir, name) -> str:
    """Compiles bench/gpu/NAME.cu into workdir; returns the program's path."""
    program = str(workdir / name)
    subprocess.run(["nvcc", "-O2", "-o", program, str(HERE / f"{name}.cu")], check=True)
    return program


def build_launch_loop(workdir) -> str:
    return build_cuda_program(workdir, "launch_loop")


# Each launch-loop process: 30 rounds of 10,000 launches (0.04 s each).  The host's speed at
# the driver's launch path wanders by up to ~1 µs per launch from moment to moment
# (launch_spread.py), so the fastest of many short rounds finds its quiet moments more surely
# than the fastest of 3 rounds of 100,000 (what the bench used until 2026-11-25;
# still reported, from ten consecutive rounds, for comparison).
LAUNCHES_PER_ROUND, LAUNCH_ROUNDS, ROUNDS_PER_OLD_ROUND = 10_000, 30, 10


def fastest_old_round_us(rounds_us) -> float:
    """The fastest run of ten consecutive short rounds: the old 100,000-launch round."""
    blocks = [
        rounds_us[i : i + ROUNDS_PER_OLD_ROUND]
        for i in range(0, len(rounds_us) - ROUNDS_PER_OLD_ROUND + 1, ROUNDS_PER_OLD_ROUND)
    ]
    return min(statistics.fmean(block) for block in blocks)


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


def steps_per_s(step_times, skip=5) -> float:
    times = step_times[skip:]
    return (len(times) - 1) / (times[-1] - times[0])


def gpu_step_s(result) -> float:
    """The GPU time of one step (its first kernel to its last), median over the run.

    The median leaves out the few steps whose span also covers a wait for the lock
    (under the shim a step's first event is recorded before its first gated launch)."""
    return statistics.median(result["gpu_spans_s"][5:])


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
    """Rates over the window in which both had started training and neither had stopped."""
    window_start = max(r["step_times"][3] for r in results)
    window_end = min(r["step_times"][-1] for r in results)
    counts = [sum(window_start <= t <= window_end for t in r["step_times"]) for r in results]
    window = window_end - window_start
    busy = sum(count / window * gpu_step_s(r) for count, r in zip(counts, results))
    turns = turn_lengths(results)
    return {
        "window_s": window,
        "steps": counts,
        "gpu_step_s": [gpu_step_s(r) for r in results],
        "aggregate_steps_per_s": sum(counts) / window,
        "gpu_busy_fraction": busy,
        "shares": [c / sum(counts) for c in counts],
        "turns": len(turns),
        "turn_p50_s": percentile(turns, 0.5),
        "turn_max_s": max(turns, default=float("nan")),
    }


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


def nvidia_smi_rows(query: str) -> list[list[str]]:
    """nvidia-smi's answer to one --query-... option (CSV, no header, no units): a row of
    stripped fields per GPU or process."""
    out = subprocess.run(
        ["nvidia-smi", query, "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [[field.strip() for field in line.split(",")] for line in out.splitlines() if line]


def check_memory(planned_gib=PLANNED_MANAGED_GIB, script="bench") -> int:
    """The first GPU's free MiB; ends the script with one line when planned_gib of managed
    memory would be more than half of it (mix.py plans its own)."""
    free_mib = int(
        subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[0]
    )
    if free_mib / 2 < planned_gib * 1024:
        sys.exit(
            f"{script}: refusing to start: {planned_gib} GiB of managed memory is more than half of "
            f"the GPU's free {free_mib} MiB"
        )
    return free_mib


def environment() -> dict:
    import torch

    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {
        "date": time.strftime("%Y-%m-%d"),
        "gpu_and_driver": smi,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }


class GpuClockSampler:
    """nvidia-smi's SM clock, power, temperature and clock-event reasons every 200 ms while a phase
    runs: whether the GPU itself slowed down (power or heat) explains a step that took longer."""

    FIELDS = "clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"

    def __init__(self):
        # A file, not a pipe, so a long phase cannot fill it; stdbuf so every line reaches it.
        self.output = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(
            [
                "stdbuf",
                "-oL",
                "nvidia-smi",
                f"--query-gpu={self.FIELDS}",
                "--format=csv,noheader,nounits",
                "-lms",
                "200",
            ],
            stdout=self.output,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> dict:
        stop_process(self.process)
        self.output.seek(0)
        lines = self.output.read().splitlines()
        self.output.close()
        return gpu_clock_summary(lines)


def gpu_clock_summary(lines) -> dict:
    """GpuClockSampler's lines (clock MHz, power W, temperature C, reasons bitmask in hex)."""
    rows = []
    for line in lines:
        fields = [field.strip() for field in line.split(",")]
        try:
            rows.append((float(fields[0]), float(fields[1]), float(fields[2]), int(fields[3], 16)))
        except (ValueError, IndexError):
            continue  # a "[N/A]", a cut-off last line
    if not rows:
        return {}
    reasons = 0
    for row in rows:
        reasons |= row[3]
    return {
        "samples": len(rows),
        "sm_mhz_median": statistics.median(r[0] for r in rows),
        "sm_mhz_min": min(r[0] for r in rows),
        "power_w_median": statistics.median(r[1] for r in rows),
        "temperature_c_max": max(r[2] for r in rows),
        "clock_event_reasons": hex(reasons),
    }


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


def main() -> None:
    results_dir = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else REPO / "results" / "gpu")
    results_dir.mkdir(parents=True, exist_ok=True)
    free_mib = check_memory()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="nvshare-gpu-bench-"))
    launch_loop = build_launch_loop(workdir)
    hook_cost_program = build_cuda_program(workdir, "hook_cost")

    results = {"environment": environment(), "gpu_free_mib_at_start": free_mib}
    phases = [
        ("overhead", lambda: nvshare_overhead(workdir, launch_loop, hook_cost_program)),
        ("solo", lambda: solo_run(16)),
        ("pair_tq2", lambda: pair_run(workdir, 30, time_quantum_s=2)),
        ("pair_tq2_queued", lambda: pair_run(workdir, 20, queue_ahead=True, time_quantum_s=2)),
        ("pair_tq5_queued", lambda: pair_run(workdir, 30, queue_ahead=True, time_quantum_s=5)),
        ("pair_off", lambda: pair_run(workdir, 15, time_quantum_s=2, anti_thrash=False)),
        ("warmup", lambda: warm_up(workdir)),
        (
            "prefetch_probe",
            lambda: run_json([sys.executable, str(HERE / "prefetch_probe.py"), "--gib", "8"]),
        ),
        # At TQ 30 every wait is a whole quantum: 32 s give two of them (~65 s).
        ("notebook_tq30", lambda: notebook_beside_trainer(workdir, 30, 32)),
        ("notebook_tq2", lambda: notebook_beside_trainer(workdir, 2, 24)),
        # Anti-thrash auto (docs/scheduling.md), at the defaults (TQ 30 s): a notebook beside
        # the trainer while their memory fits the GPU, and with memory_limit set so that it
        # does not (the real card is never oversubscribed); two trainers, fitting and not, for
        # two quanta each.
        (
            "auto_notebook_fits",
            lambda: notebook_beside_trainer(workdir, 30, 30, trainer_extra_s=8, anti_thrash="auto"),
        ),
        (
            "auto_notebook_exclusive",
            lambda: notebook_beside_trainer(
                workdir, 30, 30, trainer_extra_s=8, anti_thrash="auto", memory_limit="1G"
            ),
        ),
        ("auto_pair_fits", lambda: pair_run(workdir, 64, time_quantum_s=30, anti_thrash="auto")),
        (
            "auto_pair_exclusive",
            lambda: pair_run(workdir, 64, time_quantum_s=30, anti_thrash="auto", memory_limit="1G"),
        ),
        ("solo_pausing", lambda: solo_run(24, None, *PAUSING)),
        (
            "pair_pausing_tq2",
            lambda: pair_run(workdir, 30, trainer_args=("--gpu-spans", *PAUSING), time_quantum_s=2),
        ),
        (
            "pair_pausing_off",
            lambda: pair_run(
                workdir,
                24,
                trainer_args=("--gpu-spans", *PAUSING),
                time_quantum_s=2,
                anti_thrash=False,
            ),
        ),
    ]
    extra = {"notebook_tq2", "solo_pausing", "pair_pausing_tq2", "pair_pausing_off"}
    # nvidia-smi's polling goes through the driver every 200 ms; the overhead phase resolves
    # tenths of a microsecond per launch, so nothing else queries the GPU while it runs.
    run_phases(
        phases, results, results_dir / "gpu.json", extra, unsampled={"overhead"}, workdir=workdir
    )
    print_table(results)


def print_table(results: dict) -> None:
    def get(phase, key, fmt="{:.3f}"):
        value = results.get(phase, {}).get(key)
        return "n/a" if value is None else fmt.format(value)

    def step_ms(phase):
        value = results.get(phase, {}).get("gpu_step_s")
        values = value if isinstance(value, list) else [] if value is None else [value]
        return ", ".join(f"{1000 * v:.1f}" for v in values) or "n/a"

    def clock(phase, key, fmt):
        value = results.get(phase, {}).get("gpu_clocks", {}).get(key)
        return "n/a" if value is None else fmt.format(value)

    def vs_solo(phase, solo_phase="solo"):
        alone = results.get(solo_phase, {}).get("steps_per_s")
        rate = results.get(phase, {}).get("aggregate_steps_per_s")
        return "n/a" if rate is None or not alone else f"{rate / alone:.3f}x"

    def trainer_vs_solo(phase):
        alone = results.get("solo", {}).get("steps_per_s")
        rate = results.get(phase, {}).get("trainer_steps_per_s")
        return "n/a" if rate is None or not alone else f"{rate / alone:.3f}x"

    def waits(phase):
        p50 = get(phase, "wait_p50_ms", "{:.1f}")
        return f"{p50} / {get(phase, 'wait_p95_ms', '{:.1f}')}"

    def shares(phase):
        values = results.get(phase, {}).get("shares")
        return "n/a" if not values else " / ".join(f"{100 * v:.1f}%" for v in values)

    def drops(phase):
        p50 = get(phase, "drop_to_release_p50_ms", "{:.1f}")
        return f"{p50} / {get(phase, 'drop_to_release_p99_ms', '{:.1f}')}"

    rows = [
        (
            "1 training step ratio, shim/plain (median of 3)",
            get("overhead", "step_ratio_median", "{:.4f}"),
            "<= 1.002",
        ),
        (
            "1 results identical with and without shim",
            get("overhead", "results_identical", "{}"),
            "True",
        ),
        (
            "1 launch cost delta, us/launch (fastest 10k-launch round per process)",
            get("overhead", "launch_us_delta", "{:+.3f}"),
            "<= +0.3",
        ),
        (
            "1 same, fastest 100k launches in a row (the bench before)",
            get("overhead", "launch_us_delta_100k", "{:+.3f}"),
            "(compare)",
        ),
        (
            "1 same, median of the pairs' own deltas",
            get("overhead", "launch_us_delta_paired", "{:+.3f}"),
            "(compare)",
        ),
        (
            "1 same, the hook alone in one process, ns (median/mean)",
            get("overhead", "hook_delta_ns_median", "{:+.1f}")
            + " / "
            + get("overhead", "hook_delta_ns_mean", "{:+.1f}"),
            "<= +300",
        ),
        ("2 drop->release p50/p99 ms, TQ 2 s, loss read every step", drops("pair_tq2"), "<= 100"),
        (
            "2 same, loss read every 50 steps (work queued ahead)",
            drops("pair_tq2_queued"),
            "<= 100",
        ),
        ("2 same, TQ 5 s, loss read every 50 steps", drops("pair_tq5_queued"), "<= 100"),
        (
            "2 turn p50/max s from step times, TQ 2 s",
            f"{get('pair_tq2', 'turn_p50_s', '{:.2f}')} / {get('pair_tq2', 'turn_max_s', '{:.2f}')}",
            "(TQ+drop)",
        ),
        (
            "3 two trainers, anti-thrash on, TQ 2: aggregate vs solo",
            vs_solo("pair_tq2"),
            "(withdrawn)",
        ),
        ("3 shares, anti-thrash on, TQ 2", shares("pair_tq2"), "45-55%"),
        ("3 two trainers, anti-thrash off: aggregate vs solo", vs_solo("pair_off"), "(compare)"),
        (
            "3 GPU busy fraction: solo / TQ 2",
            " / ".join(get(p, "gpu_busy_fraction", "{:.3f}") for p in ("solo", "pair_tq2")),
            "(why)",
        ),
        (
            "3 GPU time per step ms: solo / TQ 2 (each)",
            step_ms("solo") + " / " + step_ms("pair_tq2"),
            "(why)",
        ),
        (
            "3 SM clock MHz, median: solo / TQ 2",
            " / ".join(clock(p, "sm_mhz_median", "{:.0f}") for p in ("solo", "pair_tq2")),
            "(why)",
        ),
        (
            "3 power W, median: solo / TQ 2",
            " / ".join(clock(p, "power_w_median", "{:.0f}") for p in ("solo", "pair_tq2")),
            "(why)",
        ),
        ("4 warm-up GB/s, bulk prefetch", get("warmup", "prefetch_gb_per_s", "{:.1f}"), ">= 45"),
        ("4 warm-up GB/s, page faults", get("warmup", "page_fault_gb_per_s", "{:.1f}"), "(~8.5)"),
        ("4 prefetch / page faults", get("warmup", "speedup", "{:.1f}x"), ">= 5x"),
        (
            "4 warm-up GB/s, process prefetching by hand, no lock",
            get("warmup", "driver_prefetch_gb_per_s", "{:.1f}"),
            "(ceiling)",
        ),
        (
            "5 notebook wait p50/p95 ms, TQ 30 s",
            get("notebook_tq30", "wait_p50_ms", "{:.0f}")
            + " / "
            + get("notebook_tq30", "wait_p95_ms", "{:.0f}"),
            "(report)",
        ),
        (
            "5 notebook wait p50/p95 ms, TQ 2 s",
            get("notebook_tq2", "wait_p50_ms", "{:.0f}")
            + " / "
            + get("notebook_tq2", "wait_p95_ms", "{:.0f}"),
            "(report)",
        ),
        ("a auto, fits: notebook wait p50/p95 ms", waits("auto_notebook_fits"), "<= 5 / 50"),
        (
            "a auto, fits: trainer beside it vs solo",
            trainer_vs_solo("auto_notebook_fits"),
            ">= 0.95x",
        ),
        (
            "b auto, not fit, TQ 30: notebook wait p50/p95 ms",
            waits("auto_notebook_exclusive"),
            "p95 <= 500",
        ),
        (
            "b auto, not fit: trainer vs solo",
            trainer_vs_solo("auto_notebook_exclusive"),
            ">= 0.85x",
        ),
        ("c auto, two trainers fit: aggregate vs solo", vs_solo("auto_pair_fits"), ">= 0.99x"),
        ("c shares", shares("auto_pair_fits"), "45-55%"),
        (
            "d auto, two trainers not fit: aggregate vs solo",
            vs_solo("auto_pair_exclusive"),
            ">= 0.99x",
        ),
        ("d drop->release p50/p99 ms", drops("auto_pair_exclusive"), "<= 100"),
        ("e anti-thrash on, TQ 30: notebook wait p50/p95 ms", waits("notebook_tq30"), "(today's)"),
    ]
    if "pair_pausing_tq2" in results:
        rows += [
            (
                "3x pausing trainers, TQ 2: aggregate vs one pausing alone",
                vs_solo("pair_pausing_tq2", "solo_pausing"),
                "(extra)",
            ),
            ("3x shares, pausing trainers", shares("pair_pausing_tq2"), "(extra)"),
            (
                "3x pausing trainers, anti-thrash off: aggregate",
                vs_solo("pair_pausing_off", "solo_pausing"),
                "(extra)",
            ),
            (
                "3x GPU busy fraction: solo / pair, pausing",
                " / ".join(
                    get(p, "gpu_busy_fraction", "{:.3f}")
                    for p in ("solo_pausing", "pair_pausing_tq2")
                ),
                "(extra)",
            ),
        ]
    print(f"\n{'figure':<58}{'measured':>18}  target")
    for label, value, target in rows:
        print(f"{label:<58}{value:>18}  {target}")


if __name__ == "__main__":
    main()
