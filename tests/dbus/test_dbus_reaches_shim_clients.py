"""A setting changed over D-Bus reaches the shim clients connected to the
agent's socket, and their state shows in the live-state properties."""

import asyncio
import os
import sys
from pathlib import Path

from dbus_next.aio import MessageBus

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_harness import GPU0, ShimClient
from dbus_harness import busctl_on_agent, property_data, wait_for, watch_properties_changed

from nvshare_agent import dbus_names as names
from nvshare_agent import protocol
from nvshare_agent.protocol import MessageType


def _frames_until(client: ShimClient, msg_type: int) -> list:
    """Every frame up to and including the first of `msg_type`."""
    frames = []
    while True:
        frame = client.recv()
        assert frame is not None, f"agent closed the connection; got {frames}"
        frames.append(frame)
        if getattr(frame, "type", None) == msg_type:
            return frames


def _holder_and_waiter(agent, bus):
    # On: first come first served, so the waiter stays queued behind the holder
    # (auto, the default, would serve a light newcomer after the minimum slice).
    busctl_on_agent(bus.address, "set-property", "AntiThrashMode", "s", "on")
    holder = ShimClient(agent.socket_path, command="holder")
    waiter = ShimClient(agent.socket_path, command="waiter")
    holder.request()
    grant = holder.wait_grant()
    waiter.request()
    me = os.getpid()  # both fake shims live in this process
    wait_for(
        lambda: any(gpu[4] == [me] for gpu in property_data(bus.address, "Gpus")),
        "the waiter queued",
    )
    return holder, grant, waiter


def test_anti_thrash_off_over_dbus_grants_a_queued_waiter_at_once(agent, bus):
    holder, _, waiter = _holder_and_waiter(agent, bus)
    states = sorted(
        entry[1] for client in property_data(bus.address, "Clients") for entry in client[4]
    )
    assert states == ["holding", "waiting"]
    gpu = busctl_on_agent(
        bus.address, "call", names.METHOD_GET_GPU, "s", protocol.format_uuid(GPU0)
    ).stdout.split()
    assert gpu[0] == "(sstauau)" and gpu[1] == f'"{protocol.format_uuid(GPU0)}"'
    assert gpu[-4:] == ["1", str(os.getpid()), "1", str(os.getpid())]  # one holder, one waiting
    assert holder.settings.anti_thrash and holder.settings.time_quantum_ms == 30_000

    busctl_on_agent(bus.address, "set-property", "AntiThrash", "b", "false")
    # The quantum is 30 s: a grant within the timeout is the setting, not expiry.
    frames = _frames_until(waiter, MessageType.LOCK_GRANT)
    assert frames[-1].gpu == GPU0
    pushed = holder.expect(MessageType.SETTINGS)
    assert pushed.anti_thrash == 0
    assert sorted(
        entry[1] for client in property_data(bus.address, "Clients") for entry in client[4]
    ) == ["holding", "holding"]
    holder.close()
    waiter.close()


def test_time_quantum_over_dbus_reaches_clients_and_ends_the_holders_turn(agent, bus):
    holder, grant, waiter = _holder_and_waiter(agent, bus)
    busctl_on_agent(bus.address, "set-property", "TimeQuantum", "u", "1")
    frames = _frames_until(holder, MessageType.DROP_REQUEST)
    pushed = [frame for frame in frames if isinstance(frame, protocol.WireSettings)]
    assert pushed and pushed[0].time_quantum_ms == 1000
    assert frames[-1].lease == grant.lease
    holder.release(grant)
    frames = _frames_until(waiter, MessageType.LOCK_GRANT)
    assert frames[0].time_quantum_ms == 1000  # the push reached the waiter too
    assert frames[-1].gpu == GPU0
    holder.close()
    waiter.close()


async def test_live_state_changes_emit_properties_changed(agent, bus):
    connection = await MessageBus(bus_address=bus.address).connect()
    signals = await watch_properties_changed(connection, f"path='{names.OBJECT_PATH}'")
    try:
        client = await asyncio.to_thread(ShimClient, agent.socket_path, command="newcomer")
        changed = (await asyncio.wait_for(signals.get(), 30)).body[1]
        while "Clients" not in changed:
            changed = (await asyncio.wait_for(signals.get(), 30)).body[1]
        assert [c[3] for c in changed["Clients"].value] == ["newcomer"]

        await asyncio.to_thread(client.request)
        while True:  # the grant shows as a holder in Gpus
            changed = (await asyncio.wait_for(signals.get(), 30)).body[1]
            if "Gpus" in changed and changed["Gpus"].value[0][3] == [os.getpid()]:
                break
        client.close()
        while True:
            changed = (await asyncio.wait_for(signals.get(), 30)).body[1]
            if "Clients" in changed and changed["Clients"].value == []:
                break
    finally:
        connection.disconnect()
