"""io.github.nvshare.Shares1 emits PropertiesChanged as Scheduler1 does: its settings
(ShareBy, Shares) when they change, Groups when the groups' state changes (a group
comes or goes, its weight, cap or number of clients), not when only its use and share
move with time; nothing for a refused change.  Every signal names Shares1 and carries
only its properties."""

import asyncio
import sys
from pathlib import Path

from dbus_harness import NOBODY, busctl, busctl_on_agent, watch_properties_changed
from dbus_next import Message
from dbus_next.aio import MessageBus

from nvshare_agent import dbus_names as names

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_harness import GPU0, AsyncShimClient

SHARES = "io.github.nvshare.Shares1"
SHARES_PROPERTIES = {"ShareBy", "Shares", "Groups"}
TIMEOUT_S = 30


def _shares(address, *args, user=None):
    return busctl(
        address, "call", names.BUS_NAME, names.OBJECT_PATH, SHARES, *args, user=user, check=False
    )


async def _shares_call(address, *args, user=None):
    return await asyncio.to_thread(_shares, address, *args, user=user)


async def _next_shares_change(signals: asyncio.Queue) -> dict:
    """The next PropertiesChanged on Shares1, as {name: value}, skipping Scheduler1's."""
    while True:
        signal = await asyncio.wait_for(signals.get(), TIMEOUT_S)
        interface, changed, invalidated = signal.body
        if interface == SHARES:
            assert signal.path == names.OBJECT_PATH and invalidated == []
            assert set(changed) <= SHARES_PROPERTIES, changed
            return {name: variant.value for name, variant in changed.items()}
        assert not SHARES_PROPERTIES & set(changed), f"{interface} carried {set(changed)}"


async def _shares_changes_so_far(connection, signals: asyncio.Queue) -> list:
    """The Shares1 signals the agent sent before now: a Ping's reply comes after them."""
    await connection.call(
        Message(
            destination=names.BUS_NAME,
            path=names.OBJECT_PATH,
            interface="org.freedesktop.DBus.Peer",
            member="Ping",
        )
    )
    found = []
    while not signals.empty():
        signal = signals.get_nowait()
        if signal.body[0] == SHARES:
            found.append(signal.body[1])
    return found


def _weights(shares: dict) -> dict:
    return {group: {k: v.value for k, v in fields.items()} for group, fields in shares.items()}


async def _watch(bus):
    connection = await MessageBus(bus_address=bus.address).connect()
    return connection, await watch_properties_changed(connection, f"path='{names.OBJECT_PATH}'")


async def test_set_share_then_reset_share_each_signal_the_new_shares(agent, bus):
    connection, signals = await _watch(bus)
    try:
        result = await _shares_call(
            bus.address, "SetShare", "sa{sv}", "user:4001", "2", "weight", "u", "2",
            "memory_cap_bytes", "t", str(1 << 30),
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        changed = await _next_shares_change(signals)
        assert set(changed) == {"Shares"}  # no GPU yet: Groups stays empty
        assert _weights(changed["Shares"]) == {
            "user:4001": {"weight": 2, "memory_cap_bytes": 1 << 30}
        }

        result = await _shares_call(bus.address, "ResetShare", "s", "user:4001")
        assert result.returncode == 0, result.stderr
        assert await _next_shares_change(signals) == {"Shares": {}}
    finally:
        connection.disconnect()


async def test_a_share_by_set_signals_share_by_on_shares1(agent, bus):
    connection, signals = await _watch(bus)
    try:
        await asyncio.to_thread(
            busctl, bus.address, "set-property", names.BUS_NAME, names.OBJECT_PATH, SHARES,
            "ShareBy", "s", "unit",
        )  # fmt: skip
        assert await _next_shares_change(signals) == {"ShareBy": "unit"}
    finally:
        connection.disconnect()


async def test_refused_share_changes_send_no_signal(agent, bus):
    connection, signals = await _watch(bus)
    try:
        for args, user in (
            (("SetShare", "sa{sv}", "user:4001", "1", "weight", "u", "0"), None),
            (("SetShare", "sa{sv}", "user:4001", "1", "weight", "u", "5"), NOBODY),
            (("ResetShare", "s", "user:no-such-user-here"), None),
        ):
            result = await _shares_call(bus.address, *args, user=user)
            assert result.returncode != 0, (args, user)
        result = await asyncio.to_thread(
            busctl, bus.address, "set-property", names.BUS_NAME, names.OBJECT_PATH, SHARES,
            "ShareBy", "s", "sometimes", check=False,
        )  # fmt: skip
        assert result.returncode != 0
        # The first Shares1 signal is the one change that was made, after them all.
        result = await _shares_call(
            bus.address, "SetShare", "sa{sv}", "user:4002", "1", "weight", "u", "3"
        )
        assert result.returncode == 0, result.stderr
        changed = await _next_shares_change(signals)
        assert set(changed) == {"Shares"}
        assert _weights(changed["Shares"]) == {"user:4002": {"weight": 3}}
    finally:
        connection.disconnect()


def _group(groups: list, name: str) -> dict | None:
    for entry in groups:
        fields = {key: variant.value for key, variant in entry.items()}
        if fields["group"] == name:
            return fields
    return None


async def test_groups_signal_when_a_client_comes_and_goes_not_when_only_use_moves(agent, bus):
    connection, signals = await _watch(bus)
    me = "user:0"  # the fake shim runs in this process, as root
    try:
        client = await AsyncShimClient.connect(agent.socket_path, (GPU0,), command="trainer")
        while True:
            changed = await _next_shares_change(signals)
            entry = _group(changed.get("Groups", []), me)
            if entry is not None and entry["clients"] == 1:
                break
        assert set(changed) == {"Groups"}

        client.request()
        await client.wait_grant()
        before = await _groups_now(connection)
        await asyncio.sleep(0.3)  # holding: its use and share grow on every read
        # A change of Scheduler1's (a notification to every subscriber) while only the
        # group's use and share moved: Scheduler1 signals, Shares1 does not.
        await asyncio.to_thread(
            busctl_on_agent, bus.address, "set-property", "TimeQuantum", "u", "20"
        )
        while True:
            signal = await asyncio.wait_for(signals.get(), TIMEOUT_S)
            if signal.body[0] == SHARES:
                raise AssertionError(f"Shares1 signalled use alone: {signal.body[1]}")
            if "TimeQuantum" in signal.body[1]:
                break
        assert await _shares_changes_so_far(connection, signals) == []
        after = await _groups_now(connection)
        assert (before["use"], before["share"]) != (after["use"], after["share"])
        assert before["clients"] == after["clients"] == 1

        await client.close()
        while True:
            changed = await _next_shares_change(signals)
            entry = _group(changed.get("Groups", []), me)
            if "Groups" in changed and (entry is None or entry["clients"] == 0):
                break
    finally:
        connection.disconnect()


async def _groups_now(connection) -> dict:
    reply = await connection.call(
        Message(
            destination=names.BUS_NAME,
            path=names.OBJECT_PATH,
            interface="org.freedesktop.DBus.Properties",
            member="Get",
            signature="ss",
            body=[SHARES, "Groups"],
        )
    )
    entry = _group(reply.body[0].value, "user:0")
    assert entry is not None, reply.body
    return entry
