"""The agent leaves the bus without failing a call (issue 45): a restart used to
fail every call it met with "Message recipient disconnected from message bus
without replying".  On a stop the agent hands its name back first, answers what
the bus sent it before, and only then closes; a call after that finds no owner
(on the system bus, it waits for the next agent: D-Bus activation)."""

from __future__ import annotations

import asyncio

from dbus_harness import AgentProcess, wait_for
from dbus_next import Message, MessageType, Variant

from nvshare_agent import dbus_names as names
from nvshare_agent.dbus_connection import connect_bus

NO_REPLY = "org.freedesktop.DBus.Error.NoReply"
NO_OWNER = "org.freedesktop.DBus.Error.ServiceUnknown"
CALLERS = 8


def time_quantum_call() -> Message:
    return Message(
        destination=names.BUS_NAME,
        path=names.OBJECT_PATH,
        interface="org.freedesktop.DBus.Properties",
        member="Get",
        signature="ss",
        body=[names.INTERFACE, "TimeQuantum"],
    )


async def call_until_no_owner(address: str) -> list[str]:
    """Calls one after another until the name has no owner: each answer's kind."""
    bus = await connect_bus(address, 10)
    answers: list[str] = []
    try:
        while not answers or answers[-1] != NO_OWNER:
            reply = await bus.call(time_quantum_call())
            assert reply is not None
            if reply.message_type == MessageType.METHOD_RETURN:
                assert reply.body == [Variant("u", 30)]
                answers.append("value")
            else:
                answers.append(reply.error_name or "?")
    finally:
        bus.disconnect()
    return answers


async def test_calls_that_meet_a_stop_are_answered_not_dropped(world_dir, bus):
    agent = AgentProcess(world_dir, bus.address)
    agent.start()
    try:
        wait_for(bus.name_has_owner, "the agent to own its bus name")
        callers = [asyncio.create_task(call_until_no_owner(bus.address)) for _ in range(CALLERS)]
        await asyncio.sleep(0.2)  # every caller in full flow
        agent.process.terminate()
        answers = await asyncio.wait_for(asyncio.gather(*callers), 30)
        status = agent.process.wait(10)
    finally:
        agent.stop()
    assert status == 0, agent.log()
    flat = [answer for caller in answers for answer in caller]
    assert flat.count("value") >= CALLERS, flat
    assert NO_REPLY not in flat, f"{flat.count(NO_REPLY)} of {len(flat)} calls dropped"
    assert set(flat) == {"value", NO_OWNER}, set(flat)
