"""Fixtures for the agent tests; the reusable pieces live in agent_harness.py
(import it from other test folders as its docstring shows).

- start_agent(**kwargs): starts an AgentProcess (a real `python -m nvshare_agent`
  subprocess on a temp socket) and stops it at teardown.
- start_inproc_agent(settings): runs the daemon's Engine and socket adapter inside
  the test's event loop on a real UNIX socket in a temp dir; returns (engine,
  socket_path).  Used where a test must change settings at run time, which only
  the control plane (the engine's change_settings, which D-Bus calls) can do.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_harness import AgentProcess

from nvshare_agent.engine import Engine
from nvshare_agent.listener import Listener
from nvshare_agent.settings import AntiThrash, Settings
from nvshare_agent.settings_files import SettingsStore
from nvshare_agent.shim_connections import ShimConnections
from nvshare_agent.systemd import bind_socket

FAST_SETTINGS = Settings(
    time_quantum_s=1, anti_thrash=AntiThrash.ON, idle_release_ms=100, drop_grace_ms=300
)


@pytest.fixture
def start_agent(tmp_path):
    started: list[AgentProcess] = []

    def start(name: str = "agent", **kwargs) -> AgentProcess:
        agent = AgentProcess(tmp_path / name, **kwargs).start()
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop()


@pytest.fixture
async def start_inproc_agent(tmp_path):
    servers = []

    async def start(settings: Settings = FAST_SETTINGS, hello_timeout_s: float | None = None):
        loop = asyncio.get_running_loop()
        engine = Engine(settings, SettingsStore(tmp_path / "state"), loop=loop)
        if hello_timeout_s is not None:
            engine.core.hello_timeout_s = hello_timeout_s
        connections = ShimConnections(engine)
        path = tmp_path / f"inproc{len(servers)}.sock"
        listener = Listener(bind_socket(path), connections)  # the daemon's own accept path
        listener.start()
        servers.append((listener, engine, connections))
        return engine, path

    yield start
    for listener, engine, connections in servers:
        listener.close()
        engine.cancel_timers()
        connections.close_all()
