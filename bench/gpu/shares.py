#!/usr/bin/env python3
"""Shares between people, not processes (issue 38), on one GPU, in one run.

Two "users" are two uids (USER_A 4001, USER_B 4002): the bench runs as root (the GPU
machine has no systemd and no logins) and starts each client as a child that drops to
its uid (setgid, setuid) before it execs.  The agent runs on a socket of its own
(--socket) in a folder every uid can reach.

Phases (NVSHARE_BENCH_ONLY=phase,phase picks some):
- users: three reference trainers (trainer.py) of user A and one of user B, started
  together, the agent at its defaults (share_by = user, anti-thrash auto, TQ 30 s): each
  user's share of the steps over the window (--window, 60 s by default), counted from
  when every trainer has taken its first step.  At TQ 30 s a minute holds about two
  turns, so the figure is coarse; --window 120 or more gives it more turns.
- users_by_process: the same with share_by = process (the behaviour before shares, for
  comparison: A's three get about three quarters).
- cap: one PyTorch process of user A under a 4 GiB memory cap ([share:user:4001]
  memory_cap = 4G): torch.cuda.mem_get_info() must show the cap as the total; an
  allocation past it must raise torch.OutOfMemoryError; the process must go on (a
  smaller allocation and a matmul after it).  capped.py is that process.

    bench/gpu/run.sh --shares [RESULTS_DIR] [--window S]    # about 4 minutes at 60 s

Prints a table; full numbers in RESULTS/shares.json, agent logs in RESULTS/agent-logs/.
Safety: four trainers at width 2048, batch 4096 (~0.7 GiB each, under 3 GiB together)
and the capped process (at most 4 GiB): checked against the GPU's free memory first.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from run import Agent, check_memory, environment, run_phases, wait_for_file

HERE = pathlib.Path(__file__).resolve().parent
USER_A, USER_B = 4001, 4002
WINDOW_S = 60.0
# Small trainers: the bench is about who gets the GPU, not about memory.
TRAINER = [sys.executable, str(HERE / "trainer.py"), "--width", "2048", "--batch", "4096"]
CAPPED = [sys.executable, str(HERE / "capped.py")]
PLANNED_GIB = 7  # four small trainers, then the capped process's 4 GiB (never together)
CAP_GIB = 4
SETUP_TIMEOUT_S = 180


def as_user(uid: int):
    """A preexec_fn: the child becomes uid (and its group) before it execs."""

    def drop() -> None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)

    return drop


def user_env(agent: Agent, uid: int) -> dict:
    env = agent.env()
    env.update(HOME="/tmp", USER=f"nvshare-bench-{uid}")
    return env


def open_folder(parent: pathlib.Path, prefix: str) -> pathlib.Path:
    """A folder every uid can write in (ready files, the agent's socket)."""
    folder = pathlib.Path(tempfile.mkdtemp(dir=parent, prefix=prefix))
    folder.chmod(0o1777)
    return folder


def shares_config(share_by: str, shares: dict[str, dict[str, str]] | None = None) -> str:
    """The config lines beyond run.Agent's: share_by (it sits in [scheduler], which the
    Agent writes last thing before these), then a section per group."""
    lines = [f"share_by = {share_by}"]
    for group, fields in (shares or {}).items():
        lines += ["", f"[share:{group}]", *(f"{k} = {v}" for k, v in fields.items())]
    return "\n".join(lines) + "\n"


def steps_in_window(step_times: list[float], start: float, seconds: float) -> int:
    return sum(1 for t in step_times if start <= t < start + seconds)


def user_shares(results: list[tuple[int, dict]], start: float, seconds: float) -> dict:
    """Each uid's steps in the window and its share of all of them."""
    steps: dict[int, int] = {}
    for uid, result in results:
        steps[uid] = steps.get(uid, 0) + steps_in_window(result["step_times"], start, seconds)
    total = sum(steps.values()) or 1
    return {
        str(uid): {"steps": n, "share": round(n / total, 4)} for uid, n in sorted(steps.items())
    }


def run_users(
    workdir: pathlib.Path,
    window_s: float,
    share_by: str = "user",
    trainer=TRAINER,
    users=(USER_A, USER_A, USER_A, USER_B),
    **agent_settings,
) -> dict:
    """Trainers of the given uids under one agent, started together: the shares of steps
    in the window that opens once every trainer has taken its first step."""
    shared = open_folder(workdir, "users-")  # ready files (the agent makes its socket's 0755)
    agent = Agent(
        workdir,
        anti_thrash="auto",
        socket=open_folder(workdir, "socket-") / "scheduler.sock",
        extra_config=shares_config(share_by),
        **agent_settings,
    )
    processes = []
    try:
        # Setup (imports, CUDA, the first step) takes a while and runs the trainers at once
        # as they come; the window opens after it, and each runs until the window is over.
        seconds = SETUP_TIMEOUT_S + window_s
        for number, uid in enumerate(users):
            ready = shared / f"ready-{number}"
            command = [*trainer, "--seconds", str(seconds), "--ready-file", str(ready)]
            process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=user_env(agent, uid),
                preexec_fn=as_user(uid),
                cwd="/tmp",
            )
            processes.append((uid, process, ready))
        for _uid, process, ready in processes:
            wait_for_file(ready, process, timeout=SETUP_TIMEOUT_S)
        start = time.time()
        time.sleep(window_s)
        for _uid, process, _ready in processes:
            process.terminate()  # trainer.py prints its result after the step under way
        return _collect([(uid, p) for uid, p, _ in processes], start, window_s, agent)
    finally:
        for _uid, process, _ready in processes:
            if process.poll() is None:
                process.kill()
        agent.stop()


def _collect(stopped, start: float, window_s: float, agent: Agent) -> dict:
    """The trainers were told to stop at the window's end (SIGTERM): each prints its step
    times after the step under way, which for one that waits for the GPU comes once it
    has its turn again (a quantum or so later, as the others leave)."""
    results = []
    for uid, process in stopped:
        out, err = process.communicate(timeout=SETUP_TIMEOUT_S)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if not lines:
            raise RuntimeError(f"a trainer of uid {uid} printed no result:\n{err[-3000:]}")
        results.append((uid, json.loads(lines[-1])))
    return {
        "window_s": window_s,
        "users": user_shares(results, start, window_s),
        "turns": len(agent.events("grant")),
    }


def run_cap(workdir: pathlib.Path, capped=CAPPED, cap_gib: int = CAP_GIB) -> dict:
    """One PyTorch process of user A under a memory cap: what capped.py saw."""
    agent = Agent(
        workdir,
        anti_thrash="auto",
        socket=open_folder(workdir, "socket-") / "scheduler.sock",
        extra_config=shares_config("user", {f"user:{USER_A}": {"memory_cap": f"{cap_gib}G"}}),
    )
    try:
        done = subprocess.run(
            [*capped, "--cap-gib", str(cap_gib)],
            capture_output=True,
            text=True,
            env=user_env(agent, USER_A),
            preexec_fn=as_user(USER_A),
            cwd="/tmp",
            timeout=SETUP_TIMEOUT_S,
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        result = json.loads(lines[-1]) if lines else {}
        warnings = [line for line in done.stderr.splitlines() if "memory cap" in line]
        result.update(
            returncode=done.returncode,
            warnings=warnings,
            verdict=cap_verdict(result, cap_gib, warnings, done.returncode),
        )
        if done.returncode != 0:
            result["stderr"] = done.stderr[-3000:]
        return result
    finally:
        agent.stop()


def cap_verdict(result: dict, cap_gib: int, warnings: list[str], returncode: int) -> dict:
    """Each thing the issue asks of a capped process, true or false."""
    cap = cap_gib << 30
    return {
        "mem_get_info_total_is_the_cap": result.get("total_bytes") == cap,
        "free_at_most_the_cap": 0 < result.get("free_bytes", 0) <= cap,
        "allocation_past_it_raised_out_of_memory": result.get("past_cap") == "OutOfMemoryError",
        "went_on": result.get("went_on") is True and returncode == 0,
        "one_warning_naming_the_cap": len(warnings) == 1 and str(cap) in warnings[0],
    }


def preflight(python: str = sys.executable) -> str | None:
    """Why the other uids cannot run the bench's clients, or None: the Python, torch and
    this checkout must be readable by them (a venv under /root is not)."""
    probe = f"import torch; open({str(HERE / 'trainer.py')!r}).close()"
    try:
        done = subprocess.run(
            [python, "-c", probe],
            capture_output=True,
            text=True,
            preexec_fn=as_user(USER_A),
            cwd="/tmp",
            env={**os.environ, "HOME": "/tmp"},
            timeout=120,
        )
    except OSError as error:
        return f"uid {USER_A} cannot run {python}: {error}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return f"uid {USER_A} cannot import torch or read {HERE}: {last}"
    return None


def print_table(results: dict) -> None:
    for phase in ("users", "users_by_process"):
        found = results.get(phase)
        if not found or "users" not in found:
            continue
        figures = "  ".join(
            f"uid {uid}: {f['share'] * 100:.1f} % ({f['steps']} steps)"
            for uid, f in found["users"].items()
        )
        print(f"{phase:18s} {figures}  over {found['window_s']:.0f} s")
    cap = results.get("cap")
    if cap and "verdict" in cap:
        print("cap", json.dumps(cap["verdict"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="?", default=str(HERE.parents[1] / "results" / "gpu"))
    parser.add_argument("--window", type=float, default=WINDOW_S, help="seconds measured")
    args = parser.parse_args()
    results_dir = pathlib.Path(args.results)
    results_dir.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        sys.exit("shares.py runs its clients as two uids: run it as root")
    problem = preflight()
    if problem:
        sys.exit(
            f"shares.py: {problem} (the Python, torch and the checkout must be readable "
            "by other users)"
        )
    check_memory(PLANNED_GIB, script="shares")
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="nvshare-shares-"))
    workdir.chmod(0o755)
    results: dict = {"environment": environment()}
    results_file = results_dir / "shares.json"
    run_phases(
        [
            ("users", lambda: run_users(workdir, args.window)),
            ("users_by_process", lambda: run_users(workdir, args.window, "process")),
            ("cap", lambda: run_cap(workdir)),
        ],
        results,
        results_file,
        workdir=workdir,
    )
    print_table(results)
    print(f"bench: results in {results_file}")


if __name__ == "__main__":
    main()
