"""Fixtures for the shim's CPU tests: the real agent (tests/agent/agent_harness.py),
the stand-in libcuda.so.1 and its clients (tests/standin), and libnvshare.so
preloaded.  Nothing is built here: `make check` builds the shim and the
stand-in first; a missing build fails loudly instead of skipping.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "agent"))

from agent_harness import AgentProcess  # noqa: E402
from shim_harness import SHIM, STANDIN_BUILD, Client, client_env, read_calls  # noqa: E402

FAST_CONFIG = """\
[scheduler]
time_quantum = 1
anti_thrash = on
idle_release_ms = 100
drop_grace_ms = 300
"""


@pytest.fixture(scope="session", autouse=True)
def built_artifacts():
    missing = [
        p
        for p in (SHIM, STANDIN_BUILD / "libcuda.so.1", STANDIN_BUILD / "client_linked")
        if not p.exists()
    ]
    if missing:
        pytest.fail(
            f"not built: {', '.join(map(str, missing))}; run `make shim standin` (make check does)"
        )


class ShimWorld:
    """One test's socket, agents, clients and stand-in call log."""

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        # UNIX socket paths are limited to 108 bytes; pytest's tmp_path can be longer.
        self.socket_dir = Path(tempfile.mkdtemp(prefix="nvs-", dir="/tmp"))
        self.socket_path = self.socket_dir / "scheduler.sock"
        self.standin_log = tmp_path / "standin.log"
        self.agents: list[AgentProcess] = []
        self.clients: list[Client] = []
        # What clients run: the checkout's build, or a copy other uids can read.
        self.shim, self.standin_build = SHIM, STANDIN_BUILD

    def start_agent(self, config: str = FAST_CONFIG, **kwargs) -> AgentProcess:
        agent = AgentProcess(
            self.tmp / f"agent{len(self.agents)}",
            config=config,
            socket_path=self.socket_path,
            debug=True,
            **kwargs,
        ).start()
        self.agents.append(agent)
        return agent

    @property
    def agent(self) -> AgentProcess:
        return self.agents[-1]

    def settled(self, agent: AgentProcess, *clients: Client) -> str:
        """The agent's log once it has seen every client go (its log trails the clients a little)."""
        for client in clients:
            agent.wait_for_log(rf"INFO disconnect pid={client.pid}\b")
        return agent.log()

    def env(self, **extra) -> dict:
        extra.setdefault("preload", str(self.shim))
        return client_env(
            self.socket_path, self.standin_log, standin_build=self.standin_build, **extra
        )

    def client(self, name: str, *args, env: dict | None = None, prefix=(), **env_extra) -> Client:
        client = Client(
            self.tmp,
            name,
            args,
            env=env or self.env(**env_extra),
            prefix=prefix,
            label=f"{name}{len(self.clients)}",
            standin_build=self.standin_build,
        )
        self.clients.append(client)
        return client

    def calls(self, pid: int | None = None, function: str | None = None):
        return [
            c
            for c in read_calls(self.standin_log)
            if (pid is None or c.pid == pid) and (function is None or c.function == function)
        ]

    def kernel_runs(self, pid: int) -> list[tuple[float, float]]:
        """(start, done) of each kernel the stand-in ran for pid, in the order they ended."""
        starts: dict[str, float] = {}
        runs = []
        for call in self.calls(pid):
            if call.function == "@kernel_start":
                starts[call.fields["seq"]] = call.t
            elif call.function == "@kernel_done" and call.fields["seq"] in starts:
                runs.append((starts.pop(call.fields["seq"]), call.t))
        return runs

    def close(self) -> None:
        for client in self.clients:
            client.kill()
        for agent in self.agents:
            if agent.alive():
                agent.stop()
        shutil.rmtree(self.socket_dir, ignore_errors=True)


@pytest.fixture
def world(tmp_path):
    w = ShimWorld(tmp_path)
    yield w
    w.close()


@pytest.fixture
def agent(world) -> AgentProcess:
    return world.start_agent()
