"""Fixtures for the agent tests; the reusable pieces live in agent_harness.py
(import it from other test folders as its docstring shows).

- start_agent(**kwargs): starts an AgentProcess (a real `python -m nvshare_agent`
  subprocess on a temp socket) and stops it at teardown.
- start_inproc_agent(settings): runs the daemon's Agent inside the test's event
  loop on a real UNIX socket in a temp dir; returns (agent, socket_path).  Used
  where a test must change settings at run time, which only the control plane
  (the Agent facade that D-Bus calls) can do.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_harness import AgentProcess

from nvshare_agent.daemon import Agent
from nvshare_agent.listener import Listener
from nvshare_agent.settings import Settings, SettingsStore
from nvshare_agent.systemd import bind_socket

FAST_SETTINGS = Settings(time_quantum_s=1, anti_thrash=True, idle_release_ms=100, drop_grace_ms=300)


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

    async def start(settings: Settings = FAST_SETTINGS):
        loop = asyncio.get_running_loop()
        agent = Agent(settings, SettingsStore(tmp_path / "state"), loop=loop)
        path = tmp_path / f"inproc{len(servers)}.sock"
        listener = Listener(bind_socket(path), agent.server)  # the daemon's own accept path
        listener.start()
        servers.append((listener, agent))
        return agent, path

    yield start
    for listener, agent in servers:
        listener.close()
        agent.server.cancel_timer()
        agent.server.close_all()
