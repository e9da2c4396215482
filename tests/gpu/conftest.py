"""Fixtures for the tests that need a real NVIDIA GPU.

They skip cleanly where there is none (CI).  Where there is one, they build the
shim, start a real agent on a temporary socket (no systemd, no D-Bus needed)
and run workloads under LD_PRELOAD.  Keep every process's managed memory
small: all managed memory together must stay under half the card's free
memory, or a shared GPU can hang.
"""
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SHIM = REPO / "shim" / "build" / "libnvshare.so"


def _gpu_present() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    probe = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return probe.returncode == 0 and "GPU" in probe.stdout


def pytest_collection_modifyitems(config, items):
    if _gpu_present():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    here = pathlib.Path(__file__).parent
    for item in items:
        if here in pathlib.Path(item.fspath).parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shim_library() -> pathlib.Path:
    subprocess.run(["make", "-s", "-C", str(REPO / "shim")], check=True)
    return SHIM


@pytest.fixture(scope="session")
def agent_pythonpath(tmp_path_factory) -> str:
    """A PYTHONPATH under which `nvshare_agent` imports from the checkout.

    pyproject maps the folder agent/ to the package nvshare_agent; without an
    install, a symlink with the package's name does the same."""
    root = tmp_path_factory.mktemp("pypath")
    (root / "nvshare_agent").symlink_to(REPO / "agent")
    parts = [str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(":") if p]
    return ":".join(parts)


class RunningAgent:
    def __init__(self, socket_path, log_path, process):
        self.socket_path = socket_path
        self.log_path = log_path
        self.process = process

    def log(self) -> str:
        return pathlib.Path(self.log_path).read_text(errors="replace")

    def events(self, name: str) -> list[dict]:
        """Parsed `name key=value ...` lines of the agent log."""
        found = []
        for line in self.log().splitlines():
            words = line.split()
            if name not in words:
                continue
            start = words.index(name)
            fields = dict(w.split("=", 1) for w in words[start + 1:] if "=" in w)
            found.append(fields)
        return found


@pytest.fixture
def start_agent(tmp_path, agent_pythonpath):
    started = []

    def start(time_quantum_s=30, anti_thrash=True, idle_release_ms=1000):
        config = tmp_path / "nvshare.conf"
        config.write_text(
            "[scheduler]\n"
            f"time_quantum = {time_quantum_s}\n"
            f"anti_thrash = {'on' if anti_thrash else 'off'}\n"
            f"idle_release_ms = {idle_release_ms}\n")
        socket_path = tmp_path / "scheduler.sock"
        log_path = tmp_path / "agent.log"
        state = tmp_path / "state"
        state.mkdir(exist_ok=True)
        env = dict(os.environ, PYTHONPATH=agent_pythonpath)
        env.pop("LD_PRELOAD", None)
        with open(log_path, "w") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "nvshare_agent", "--socket", str(socket_path),
                 "--bus", "none", "--config", str(config), "--state-dir", str(state), "--debug"],
                stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 20
        while not socket_path.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("agent did not start:\n" + log_path.read_text())
            time.sleep(0.05)
        agent = RunningAgent(socket_path, log_path, process)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.process.terminate()
        try:
            agent.process.wait(10)
        except subprocess.TimeoutExpired:
            agent.process.kill()


@pytest.fixture
def shim_env(shim_library):
    def env_for(agent, **extra):
        env = dict(os.environ)
        env["LD_PRELOAD"] = str(shim_library)
        env["NVSHARE_SOCKET"] = str(agent.socket_path)
        env.update({k: str(v) for k, v in extra.items()})
        return env
    return env_for
