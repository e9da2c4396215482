"""A caller's argument of any size gets a short error: an error that quoted it
whole could grow past the bus's message limit, and dbus-daemon then drops the
agent's connection, every other client's view with it."""

import asyncio

import pytest
from dbus_harness import nvsharectl
from dbus_next import Message, MessageType, Variant
from dbus_next.aio import MessageBus

from nvshare_agent import dbus_names as names

_PROPERTIES = "org.freedesktop.DBus.Properties"
BIG = "x" * 1_000_000


async def _call(address, member, signature, body, interface=_PROPERTIES, path=names.OBJECT_PATH):
    connection = await MessageBus(bus_address=address).connect()
    try:
        return await asyncio.wait_for(
            connection.call(
                Message(
                    destination=names.BUS_NAME,
                    path=path,
                    interface=interface,
                    member=member,
                    signature=signature,
                    body=body,
                )
            ),
            60,
        )
    finally:
        connection.disconnect()


@pytest.mark.parametrize(
    "interface, member, signature, body, path, error",
    [
        (names.INTERFACE, "GetGpu", "s", [BIG], names.OBJECT_PATH, names.ERROR_UNKNOWN_GPU),
        (
            _PROPERTIES,
            "Set",
            "ssv",
            [names.INTERFACE, BIG, Variant("u", 5)],
            names.OBJECT_PATH,
            "org.freedesktop.DBus.Error.UnknownProperty",
        ),
        (
            _PROPERTIES,
            "Set",
            "ssv",
            [names.INTERFACE, names.PROP_ANTI_THRASH, Variant("s", BIG)],
            names.OBJECT_PATH,
            names.ERROR_INVALID_ARGUMENT,
        ),
        # dbus-next's own answers quote the name they could not find.
        (
            _PROPERTIES,
            "Get",
            "ss",
            [names.INTERFACE, BIG],
            names.OBJECT_PATH,
            "org.freedesktop.DBus.Error.UnknownProperty",
        ),
        (
            _PROPERTIES,
            "GetAll",
            "s",
            [BIG],
            names.OBJECT_PATH,
            "org.freedesktop.DBus.Error.UnknownInterface",
        ),
        (
            _PROPERTIES,
            "GetAll",
            "s",
            [names.INTERFACE],
            "/" + BIG,
            "org.freedesktop.DBus.Error.UnknownObject",
        ),
    ],
    ids=["GetGpu", "Set-name", "Set-value", "Get", "GetAll-interface", "GetAll-path"],
)
async def test_an_error_quotes_at_most_an_excerpt_of_a_huge_argument(
    agent, bus, interface, member, signature, body, path, error
):
    reply = await _call(bus.address, member, signature, body, interface=interface, path=path)
    assert (reply.message_type, reply.error_name) == (MessageType.ERROR, error)
    text = reply.body[0]
    assert len(text) < 700 and "\n" not in text, text[:200]


async def test_an_argument_whose_quote_would_pass_the_bus_limit_leaves_the_agent_on_the_bus(
    agent, bus
):
    # 20 M backslashes: a 20 MB call, and repr() would have made a 40 MB reply,
    # past dbus-daemon's 32 MiB limit.
    reply = await _call(
        bus.address, names.METHOD_GET_GPU, "s", ["\\" * 20_000_000], interface=names.INTERFACE
    )
    assert reply.error_name == names.ERROR_UNKNOWN_GPU, reply.body
    assert "(20000000 characters)" in reply.body[0]
    assert bus.name_has_owner()
    status = nvsharectl(bus.address, "status")
    assert status.returncode == 0, status.stderr
    assert "dbus lost" not in agent.log()
