"""What systemd says of the agent's units, for nvsharectl when the agent does not
answer: the unit's state and the last error line, as `systemctl status` shows them.

A call to the agent's bus name starts nvshare.service through D-Bus activation;
when the agent cannot start, the call would wait for the bus's 25 s timeout
(issue 36).  While the call is pending, nvsharectl asks systemd (on the same bus:
org.freedesktop.systemd1, which any user may read) how the units are, and gives
up at once with a sentence that says why once they cannot answer: the service
failed or waits to be restarted, the socket failed, or the agent runs but has not
answered for NOT_ANSWERING_S.  An agent that is still starting is waited for.
Where no systemd is on the bus (a private bus in tests, a node without systemd),
nothing here answers and the call waits as before.
"""

from __future__ import annotations

import asyncio
import shutil
import time

from dbus_next import Message, MessageType
from dbus_next.aio import MessageBus

from nvshare_agent.dbus_connection import plain
from nvshare_agent.text import printable

SYSTEMD = "org.freedesktop.systemd1"
_MANAGER_PATH = "/org/freedesktop/systemd1"
_MANAGER = "org.freedesktop.systemd1.Manager"
_PROPERTIES = "org.freedesktop.DBus.Properties"
SERVICE = "nvshare.service"
SOCKET = "nvshare.socket"
# How often systemd is asked while a call waits, and how long an agent that
# systemd says runs may stay silent: a running agent answers in milliseconds.
POLL_S = 0.1
NOT_ANSWERING_S = 0.8
# The agent's own last words (agent/__main__.py: fail()) are its STATUS= line.
_AGENT_FAILED_PREFIX = "cannot start: "
_JOURNAL_TIMEOUT_S = 0.5
# journalctl's --priority: warning and worse (the event log's WARNING, ERROR).
_ERROR_PRIORITIES = "warning"


async def _call(bus: MessageBus, message: Message) -> Message | None:
    reply = await bus.call(message)
    if reply is None or reply.message_type != MessageType.METHOD_RETURN:
        return None
    return reply


async def unit_properties(bus: MessageBus, unit: str, kind: str) -> dict | None:
    """The Unit properties and those of its kind ("Service", "Socket") of `unit`,
    plain values by name; None where systemd is not on this bus."""
    loaded = await _call(
        bus,
        Message(
            destination=SYSTEMD,
            path=_MANAGER_PATH,
            interface=_MANAGER,
            member="LoadUnit",
            signature="s",
            body=[unit],
        ),
    )
    if loaded is None:
        return None
    properties: dict = {}
    for interface in ("org.freedesktop.systemd1.Unit", f"org.freedesktop.systemd1.{kind}"):
        reply = await _call(
            bus,
            Message(
                destination=SYSTEMD,
                path=loaded.body[0],
                interface=_PROPERTIES,
                member="GetAll",
                signature="s",
                body=[interface],
            ),
        )
        if reply is not None:
            properties.update({name: plain(v.value) for name, v in reply.body[0].items()})
    return properties


async def systemd_on_bus(bus: MessageBus) -> bool:
    reply = await _call(
        bus,
        Message(
            destination="org.freedesktop.DBus",
            path="/org/freedesktop/DBus",
            interface="org.freedesktop.DBus",
            member="NameHasOwner",
            signature="s",
            body=[SYSTEMD],
        ),
    )
    return bool(reply and reply.body[0])


def _state(unit: dict) -> str:
    return f"{unit.get('ActiveState', '?')} ({unit.get('SubState', '?')})"


def trouble(service: dict, socket: dict | None, silent_since_active_s: float) -> str | None:
    """Why the agent cannot answer, by systemd's view of its units; None while it may."""
    load = service.get("LoadState", "")
    if load == "not-found":
        return f"{SERVICE} is not installed on this node"
    if load == "masked":
        return f"{SERVICE} is masked: systemctl unmask {SERVICE}"
    if socket is not None and socket.get("ActiveState") == "failed":
        return (
            f"{SOCKET} is failed ({socket.get('Result', '?')}): processes run unscheduled; "
            f"fix the cause, then: systemctl restart {SOCKET}"
        )
    active, sub, result = (service.get(k, "") for k in ("ActiveState", "SubState", "Result"))
    if (
        active == "failed"
        or sub == "auto-restart"
        or (active == "inactive" and result not in ("", "success"))
    ):
        how = f"result {result}" if result else "no result"
        status = service.get("ExecMainStatus")
        if service.get("ExecMainCode") == 1 and status:  # CLD_EXITED
            how += f", exit status {status}"
        restarts = service.get("NRestarts")
        if restarts:
            how += f", restarted {restarts} times"
        return f"{SERVICE} cannot start: {_state(service)}, {how}"
    if active == "active" and silent_since_active_s >= NOT_ANSWERING_S:
        return (
            f"{SERVICE} is {_state(service)}, pid {service.get('MainPID', '?')}, but has not "
            f"answered for {silent_since_active_s:.1f} s"
        )
    return None


async def last_error_line(service: dict, on_system_bus: bool) -> str:
    """The agent's last error: its STATUS= when it said why it cannot start, else
    the journal's last line of warning or worse from the unit's processes, where
    we may read it, of the unit's last run (its InvocationID).  Not any last line:
    that is "INFO stopping" after a stop.  The event log gives its lines their
    priority; the unit makes every other line of the agent (a crash's traceback)
    an error (SyslogLevel=err)."""
    status = printable(service.get("StatusText") or "")
    if status.startswith(_AGENT_FAILED_PREFIX):
        return status.removeprefix(_AGENT_FAILED_PREFIX)
    journalctl = shutil.which("journalctl")
    if not on_system_bus or journalctl is None:
        return ""
    invocation = service.get("InvocationID") or b""
    this_run = [f"_SYSTEMD_INVOCATION_ID={bytes(invocation).hex()}"] if invocation else []
    try:
        process = await asyncio.create_subprocess_exec(
            journalctl,
            f"_SYSTEMD_UNIT={SERVICE}",
            *this_run,
            f"--priority={_ERROR_PRIORITIES}",
            "-n",
            "1",
            "-o",
            "cat",
            "-q",
            "--no-pager",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
    except OSError:
        return ""
    try:
        async with asyncio.timeout(_JOURNAL_TIMEOUT_S):
            output, _ = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        return ""
    lines = output.decode(errors="replace").strip().splitlines()
    return printable(lines[-1]) if lines else ""


async def trouble_now(bus: MessageBus, on_system_bus: bool) -> str | None:
    """Once, now: why the agent cannot answer, or None (also where no systemd is)."""
    try:
        if not await systemd_on_bus(bus):
            return None
        service = await unit_properties(bus, SERVICE, "Service")
        if service is None:
            return None
        reason = trouble(service, await unit_properties(bus, SOCKET, "Socket"), 0.0)
        if reason is None:
            return None
        line = await last_error_line(service, on_system_bus)
    except Exception:  # asking systemd is a courtesy: never the error itself
        return None
    return f"{reason}: {line}" if line else reason


async def why_no_answer(bus: MessageBus, on_system_bus: bool) -> str:
    """Returns, once systemd's view says the agent cannot answer, one sentence that
    says why (with the agent's last line); never returns while it still may, nor
    where systemd is not on this bus.  Meant to race the call to the agent."""
    if not await systemd_on_bus(bus):
        await asyncio.Event().wait()  # nothing to ask: the call's own timeout applies
    asked_at = time.monotonic()
    while True:
        await asyncio.sleep(POLL_S)
        service = await unit_properties(bus, SERVICE, "Service")
        if service is None:
            await asyncio.Event().wait()
            continue  # never: the wait ends only when the call wins the race
        socket = await unit_properties(bus, SOCKET, "Socket")
        now = time.monotonic()
        silent_s = 0.0
        if service.get("ActiveState") == "active":
            # Silent since we asked, or since it started if that was later (systemd's
            # monotonic clock is CLOCK_MONOTONIC, as time.monotonic() on Linux).
            started = service.get("ActiveEnterTimestampMonotonic", 0) / 1e6
            silent_s = now - max(asked_at, started)
        reason = trouble(service, socket, silent_s)
        if reason is not None:
            line = await last_error_line(service, on_system_bus)
            return f"{reason}: {line}" if line else reason
