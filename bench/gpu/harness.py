"""The GPU benchmarks' machinery: the agent on a private socket, the workloads as processes
that print one JSON line, the CUDA programs built with nvcc.  Every script in this folder
starts its processes through here; nothing here measures."""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
SHIM = REPO / "shim" / "build" / "libnvshare.so"
# The same objects for containers with an older glibc (shim/Makefile).
PORTABLE_SHIM = REPO / "shim" / "build" / "libnvshare-portable.so"


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
        more of the config file (share_by, [share:GROUP] sections: shares.py).
        NVSHARE_BENCH_AGENT_CONFIG, if set, is added to every agent's [scheduler] section
        (lines split by ";", e.g. "fair_page = off"): a bench again under a setting changed."""
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
            + os.environ.get("NVSHARE_BENCH_AGENT_CONFIG", "").replace(";", "\n")
            + "\n"
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
    keep = os.environ.get("NVSHARE_BENCH_STDERR_DIR")
    if keep:  # the shims' debug lines (NVSHARE_DEBUG=1), one file a client
        name = pathlib.Path(str(process.args[1] if len(process.args) > 1 else process.args[0]))
        pathlib.Path(keep).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(keep) / f"{name.stem}-{process.pid}.err").write_text(err)
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
