"""`nvsharectl status` while the agent cannot answer says why within 2 s, as
`systemctl status` would (issue 36: it waited for the bus's 25 s timeout).

A private bus has no systemd: a stand-in owns org.freedesktop.systemd1 on it and
tells what systemd would of nvshare.service and nvshare.socket (LoadUnit, then
Properties.GetAll, as cli/unit_state.py asks).  The agent's name is activatable
with a command that never takes it (the bus waits for it as for an agent that
cannot start), missing altogether, or owned by a connection that never answers.
The real thing, under a booted systemd: tests/packaging/test_config_faults_in_container.py."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest
from dbus_harness import DbusDaemon
from dbus_next import Message, MessageType, Variant

from nvshare_agent import dbus_names as names
from nvshare_agent.dbus_connection import connect_bus

SYSTEMD = "org.freedesktop.systemd1"
FAKE_SYSTEMD_POLICY = f"""
  <policy context="default">
    <allow own="{SYSTEMD}"/>
    <allow send_destination="{SYSTEMD}"/>
  </policy>
"""
BAD_BUS_LINE = "--bus 'sytem' is not a D-Bus address (no transport, such as unix:)"
FAILED = {
    "LoadState": "loaded",
    "ActiveState": "failed",
    "SubState": "failed",
    "Result": "exit-code",
    "ExecMainCode": 1,
    "ExecMainStatus": 2,
    "NRestarts": 0,
    "MainPID": 0,
    "StatusText": f"cannot start: {BAD_BUS_LINE}",
}
RESTARTING = {**FAILED, "ActiveState": "activating", "SubState": "auto-restart", "NRestarts": 3}
RUNNING = {
    **FAILED,
    "ActiveState": "active",
    "SubState": "running",
    "Result": "success",
    "MainPID": 4242,
    "StatusText": "0 clients",
}
LISTENING = {"LoadState": "loaded", "ActiveState": "active", "SubState": "listening"}
SOCKET_FAILED = {
    "LoadState": "loaded",
    "ActiveState": "failed",
    "SubState": "failed",
    "Result": "service-start-limit-hit",
}
_TYPES = {str: "s", int: "u"}


class FakeSystemd:
    """Answers LoadUnit and Properties.GetAll for the two units, from dicts."""

    def __init__(self, units: dict[str, dict]):
        self.units = units
        self.bus = None

    async def start(self, address: str) -> None:
        self.bus = await connect_bus(address, 10)
        self.bus.add_message_handler(self._handle)
        await self.bus.request_name(SYSTEMD)

    def _handle(self, msg: Message):
        if msg.message_type != MessageType.METHOD_CALL:
            return None
        if msg.member == "LoadUnit":
            return Message.new_method_return(msg, "o", [self._path(msg.body[0])])
        if msg.member == "GetAll":
            unit = next(u for u in self.units if self._path(u) == msg.path)
            values = {
                key: Variant(_TYPES[type(value)], value) for key, value in self.units[unit].items()
            }
            return Message.new_method_return(msg, "a{sv}", [values])
        return None

    @staticmethod
    def _path(unit: str) -> str:
        return "/org/freedesktop/systemd1/unit/" + unit.replace(".", "_2e")

    def stop(self) -> None:
        if self.bus is not None:
            self.bus.disconnect()


@pytest.fixture
def world(world_dir):
    servicedir = world_dir / "services"
    servicedir.mkdir()
    daemon = DbusDaemon(world_dir, FAKE_SYSTEMD_POLICY, servicedir=servicedir)
    yield daemon, servicedir
    daemon.stop()


def activatable_but_never_there(servicedir) -> None:
    """The agent's name, started by a command that never takes it: the bus waits."""
    (servicedir / f"{names.BUS_NAME}.service").write_text(
        f"[D-BUS Service]\nName={names.BUS_NAME}\nExec=/bin/sleep 60\nUser=root\n"
    )


async def nvsharectl_status(address: str) -> tuple[int, str, float]:
    began = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nvshare_cli",
        "--bus",
        address,
        "status",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode, stderr.decode(), time.monotonic() - began


@pytest.mark.root
@pytest.mark.parametrize(
    "service, socket, activatable, expected",
    [
        (
            FAILED,
            LISTENING,
            True,
            "nvsharectl: the nvshare agent does not answer: nvshare.service cannot start: "
            f"failed (failed), result exit-code, exit status 2: {BAD_BUS_LINE}",
        ),
        (
            RESTARTING,
            LISTENING,
            True,
            "nvsharectl: the nvshare agent does not answer: nvshare.service cannot start: "
            "activating (auto-restart), result exit-code, exit status 2, restarted 3 times: "
            f"{BAD_BUS_LINE}",
        ),
        (
            FAILED,
            LISTENING,
            False,
            "nvsharectl: the nvshare agent is not running: nvshare.service cannot start: "
            f"failed (failed), result exit-code, exit status 2: {BAD_BUS_LINE}",
        ),
        (
            FAILED,
            SOCKET_FAILED,
            True,
            "nvsharectl: the nvshare agent does not answer: nvshare.socket is failed "
            "(service-start-limit-hit): processes run unscheduled; fix the cause, then: "
            f"systemctl restart nvshare.socket: {BAD_BUS_LINE}",
        ),
    ],
    ids=["failed", "auto-restart", "not-activatable", "socket-failed"],
)
async def test_an_agent_that_cannot_start_is_said_within_2_s(
    world, service, socket, activatable, expected
):
    daemon, servicedir = world
    if activatable:
        activatable_but_never_there(servicedir)
    daemon.start()
    systemd = FakeSystemd({"nvshare.service": service, "nvshare.socket": socket})
    await systemd.start(daemon.address)
    try:
        code, stderr, seconds = await nvsharectl_status(daemon.address)
    finally:
        systemd.stop()
    assert (code, stderr) == (1, expected + "\n")
    assert seconds <= 2.0, seconds


@pytest.mark.root
async def test_a_running_agent_that_does_not_answer_is_said_within_2_s(world):
    daemon, _ = world
    daemon.start()
    systemd = FakeSystemd({"nvshare.service": RUNNING, "nvshare.socket": LISTENING})
    await systemd.start(daemon.address)
    # The agent's name, owned by a connection that takes every call and answers none
    # (a wedged agent: stopped, or its loop stuck).
    wedged = await connect_bus(daemon.address, 10)
    wedged.add_message_handler(lambda msg: msg.message_type == MessageType.METHOD_CALL)
    await wedged.request_name(names.BUS_NAME)
    try:
        code, stderr, seconds = await nvsharectl_status(daemon.address)
    finally:
        wedged.disconnect()
        systemd.stop()
    assert code == 1
    assert stderr.startswith(
        "nvsharectl: the nvshare agent does not answer: nvshare.service is active (running), "
        "pid 4242, but has not answered for "
    ), stderr
    assert seconds <= 2.0, seconds
