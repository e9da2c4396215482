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

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "gpu"))
import harness as bench  # noqa: E402  (the benchmark's Agent: one way to start the agent)

SHIM = bench.SHIM


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


@pytest.fixture(scope="session")
def cuda_program(tmp_path_factory):
    """build(NAME, *nvcc_flags): tests/gpu/NAME.cu built with nvcc (once a session); the
    binary's path.  Flags default to linking libcuda, for programs that call the driver."""
    built = {}

    def build(name: str, *flags: str) -> pathlib.Path:
        flags = flags or ("-lcuda",)
        if (name, flags) not in built:
            binary = tmp_path_factory.mktemp(name) / name
            source = pathlib.Path(__file__).parent / f"{name}.cu"
            subprocess.run(["nvcc", "-O2", "-o", str(binary), str(source), *flags], check=True)
            built[name, flags] = binary
        return built[name, flags]

    return build


@pytest.fixture
def start_agent(tmp_path, agent_pythonpath):
    """Starts the real agent (the GPU benchmark's Agent, bench/gpu/harness.py) with its debug log."""
    started = []

    def start(time_quantum_s=30, anti_thrash=True, idle_release_ms=1000):
        agent = bench.Agent(
            tmp_path,
            time_quantum_s=time_quantum_s,
            anti_thrash=anti_thrash,
            idle_release_ms=idle_release_ms,
            debug=True,
            base_env=dict(os.environ, PYTHONPATH=agent_pythonpath),
        )
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop()


@pytest.fixture
def shim_env(shim_library):
    def env_for(agent, **extra):
        return agent.env(**extra)

    return env_for
