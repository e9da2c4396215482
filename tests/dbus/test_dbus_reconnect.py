"""The agent keeps serving the shim without a bus, and comes back on the bus
when it (re)appears."""

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_harness import ShimClient
from dbus_harness import (
    TIMEOUT_S,
    AgentProcess,
    DbusDaemon,
    busctl_on_agent,
    get_property,
    nvsharectl,
    wait_for,
)
from dbus_next import Message, Variant

from nvshare_agent import dbus_names as names
from nvshare_agent.dbus_api import DBusApi
from nvshare_agent.dbus_connection import connect_bus
from nvshare_agent.dbus_contract import load_contract
from nvshare_agent.settings import Settings
from nvshare_agent.settings_sources import SettingsOrigin
from nvshare_agent.snapshot import AgentSnapshot


class _StubAgent:
    """What the D-Bus adapter uses of the engine; records changes."""

    def __init__(self):
        self.settings = Settings()
        self.settings_origin = SettingsOrigin()
        self.changes = []

    def snapshot(self):
        return AgentSnapshot(gpus=(), clients=())

    def gpu_statistics(self):
        return {}

    async def change_settings(self, **setting):
        self.changes.append(setting)


def test_agent_survives_bus_restart_and_reclaims_its_name(agent, bus):
    busctl_on_agent(bus.address, "set-property", "TimeQuantum", "u", "12")
    bus.stop()
    with ShimClient(agent.socket_path, command="during-outage") as client:
        assert client.settings.time_quantum_ms == 12_000  # the shim side never noticed
    agent.assert_alive()
    assert nvsharectl(bus.address, "status").returncode == 1

    bus.start()
    wait_for(bus.name_has_owner, "the agent to re-register after the bus came back")
    assert get_property(bus.address, "TimeQuantum") == "u 12"
    busctl_on_agent(bus.address, "set-property", "AntiThrash", "b", "false")
    assert get_property(bus.address, "AntiThrash") == "b false"
    # The name is owned before the agent logs it, and its log is written in batches.
    wait_for(
        lambda: agent.log().count("dbus connected") >= 2,
        "the agent to log its second bus connection",
    )
    assert agent.log().count("dbus connected") == 2


@pytest.mark.root
def test_agent_started_before_its_bus_registers_when_the_bus_appears(world_dir):
    daemon = DbusDaemon(world_dir)
    agent = AgentProcess(world_dir, daemon.address)
    agent.start()
    try:
        wait_for(agent.socket_path.exists, "the agent's socket")
        with ShimClient(agent.socket_path, command="no-bus-yet") as client:
            assert client.settings.anti_thrash == 2  # auto, the default
        agent.assert_alive()
        daemon.start()
        wait_for(daemon.name_has_owner, "the agent to register once the bus exists")
        assert get_property(daemon.address, "TimeQuantum") == "u 30"
        assert agent.log().count("dbus unavailable") == 1  # logged once, not per retry
    finally:
        agent.stop()
        daemon.stop()


class HangUpDuringAuth:
    """A socket that looks like a bus until the client's first auth line, then closes."""

    def __init__(self, path: Path):
        self.address = f"unix:path={path}"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        os.chmod(path, 0o666)
        self._listener.listen(16)
        self.hangups = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                peer, _ = self._listener.accept()
            except OSError:
                return  # closed
            with peer:
                peer.settimeout(5)
                try:
                    while b"\r\n" not in peer.recv(4096):
                        pass
                except OSError:
                    pass
            self.hangups += 1

    def close(self):
        self._listener.close()


def test_bus_that_hangs_up_during_auth_is_retried_while_the_shim_is_served(world_dir):
    # dbus-next 0.2.3 spun at 100% CPU on the EOF here: no shim was answered and SIGTERM was not handled.
    fake_bus = HangUpDuringAuth(world_dir / "hangup.sock")
    agent = AgentProcess(world_dir, fake_bus.address)
    agent.start()
    try:
        wait_for(agent.socket_path.exists, "the agent's socket")
        wait_for(lambda: fake_bus.hangups >= 2, "the agent to retry the bus")
        with ShimClient(agent.socket_path, command="bus-hung-up", timeout=5) as client:
            assert client.settings.anti_thrash == 2  # auto, the default
        wait_for(lambda: "dbus unavailable" in agent.log(), "the agent to log the failed connect")
        line = next(line for line in agent.log().splitlines() if "dbus unavailable" in line)
        assert "closed the connection during authentication" in line
        assert "Traceback" not in agent.log()
        agent.assert_alive()
    finally:
        assert agent.stop() == 0, agent.log()[-2000:]
        fake_bus.close()


def test_nvsharectl_on_a_bus_that_hangs_up_during_auth_exits_1(world_dir):
    fake_bus = HangUpDuringAuth(world_dir / "hangup.sock")
    try:
        result = nvsharectl(fake_bus.address, "status")
    finally:
        fake_bus.close()
    assert result.returncode == 1
    assert result.stderr.startswith(f"nvsharectl: cannot connect to the bus at {fake_bus.address}")
    assert "closed the connection during authentication" in result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr


def _break_for_writes(connection, daemon):
    # With dbus-daemon paused, nothing comes back to read: the next write fails
    # (BrokenPipeError) before any reader sees the end.
    os.kill(daemon.process.pid, signal.SIGSTOP)
    connection._sock.shutdown(socket.SHUT_WR)


# How the connection ends under a pending Set: the agent stopping, or a write
# failing on a broken connection.
CONNECTION_ENDS = {
    "disconnect": lambda connection, daemon: connection.disconnect(),
    "broken-write": _break_for_writes,
}


@pytest.mark.parametrize("end_connection", CONNECTION_ENDS.values(), ids=CONNECTION_ENDS.keys())
async def test_a_set_cut_off_by_the_bus_closing_is_dropped_quietly(bus, caplog, end_connection):
    # Nothing changes, no reply can be sent, and nothing alarming is logged (it
    # was an ERROR with a traceback, and asyncio's "Future exception was never
    # retrieved" for the failed write).
    loop = asyncio.get_running_loop()
    unhandled = []
    loop.set_exception_handler(lambda _, context: unhandled.append(context["message"]))
    agent = _StubAgent()
    service = await connect_bus(bus.address, TIMEOUT_S)
    api = DBusApi(service, agent, load_contract())
    call = Message(
        destination=names.BUS_NAME,
        path=names.OBJECT_PATH,
        interface="org.freedesktop.DBus.Properties",
        member="Set",
        signature="ssv",
        body=[names.INTERFACE, names.PROP_TIME_QUANTUM, Variant("u", 5)],
        sender=":1.999",
        serial=7,
    )
    try:
        assert api.handle(call) is True  # taken: it runs as a task, asking the bus for the uid
        end_connection(service, bus)
        while api._pending:
            await asyncio.sleep(0.01)
        with contextlib.suppress(OSError, EOFError):  # the agent's reconnect loop hears of it here
            await asyncio.wait_for(service.wait_for_disconnect(), TIMEOUT_S)
    finally:
        os.kill(bus.process.pid, signal.SIGCONT)
    # asyncio reports a never-retrieved exception when the future is collected:
    # the agent drops a closed bus, and so does the test.
    del service, api
    gc.collect()
    assert agent.changes == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert unhandled == []
