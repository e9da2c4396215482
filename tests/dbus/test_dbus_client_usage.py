"""Who used the GPU and who waited, and why, through the real bus: ClientDetails'
per_gpu figures (busctl, a client that knows nothing of nvshare), and the same in
`nvsharectl status --json`.  Clients' own signature stays as it was."""

import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_harness import GPU0, AsyncShimClient, ShimClient
from dbus_harness import (
    busctl_on_agent,
    get_property,
    nvsharectl,
    property_data,
    wait_for,
    watch_properties_changed,
)
from dbus_next import Message, Variant
from dbus_next.aio import MessageBus

from nvshare_agent import dbus_names as names
from nvshare_agent import protocol
from nvshare_agent.dbus_connection import plain

UUID = protocol.format_uuid(GPU0)


def _holder_and_waiter(agent, bus):
    # On: both busy, so the waiter waits its turn (cause "turn").
    busctl_on_agent(bus.address, "set-property", "AntiThrashMode", "s", "on")
    holder = ShimClient(agent.socket_path, command="holder")
    holder.request()
    grant = holder.wait_grant()
    waiter = ShimClient(agent.socket_path, command="waiter")
    waiter.request()
    wait_for(
        lambda: any(gpu[4] == [os.getpid()] for gpu in property_data(bus.address, "Gpus")),
        "the waiter queued",
    )
    return holder, grant, waiter


def client_details(address: str) -> dict:
    """ClientDetails as a D-Bus library reads it (busctl's JSON has no maps keyed
    by numbers), the variants kept: their types are part of the contract."""

    async def read():
        connection = await MessageBus(bus_address=address).connect()
        try:
            reply = await connection.call(
                Message(
                    destination=names.BUS_NAME,
                    path=names.OBJECT_PATH,
                    interface="org.freedesktop.DBus.Properties",
                    member="Get",
                    signature="ss",
                    body=[names.INTERFACE, names.PROP_CLIENT_DETAILS],
                )
            )
            assert reply.signature == "v" and reply.body[0].signature == "a{ua{sv}}", reply
            return reply.body[0].value
        finally:
            connection.disconnect()

    return asyncio.run(read())


def gpu_figures(address: str) -> dict:
    """This process's figures on GPU0, plain."""
    per_gpu = client_details(address)[os.getpid()]["per_gpu"]
    assert per_gpu.signature == "a{sa{sv}}"
    types = {key: item.signature for key, item in per_gpu.value[UUID].items()}
    assert types == {"gpu_seconds": "d", "recent_use": "d", "wait_cause": "s", "waited_s": "a{sd}"}
    return plain(per_gpu.value[UUID])


def test_client_details_say_gpu_time_and_why_a_client_waits(agent, bus):
    holder, grant, waiter = _holder_and_waiter(agent, bus)
    try:
        time.sleep(0.2)
        assert get_property(bus.address, "Clients").startswith("a(uuusa(sstd)) 2 ")
        # Both connections are this process: one pid, their figures added up.
        figures = gpu_figures(bus.address)
        assert figures["wait_cause"] == "turn"
        assert figures["gpu_seconds"] >= 0.2  # the holder's turn so far
        assert list(figures["waited_s"]) == ["turn"] and figures["waited_s"]["turn"] >= 0.2
        assert 0 < figures["recent_use"] <= 2

        status = json.loads(nvsharectl(bus.address, "status", "--json").stdout)
        (client,) = status["clients"][:1]
        entries = [entry for client in status["clients"] for entry in client["gpus"]]
        assert {entry["state"] for entry in entries} == {"holding", "waiting"}
        for entry in entries:  # each connection's entry gets its pid's figures
            assert entry["wait_cause"] == "turn" and entry["gpu_seconds"] >= 0.2
            assert set(entry["waited_s"]) == {"turn"}
        assert client["user"] == "root"
    finally:
        holder.release(grant)
        waiter.close()
        holder.close()


def test_a_client_that_waited_and_now_holds_keeps_its_wait_and_has_no_cause(agent, bus):
    holder, grant, waiter = _holder_and_waiter(agent, bus)
    holder.close()  # the waiter gets the GPU
    waiter.wait_grant(timeout=10)
    try:
        wait_for(lambda: len(property_data(bus.address, "Clients")) == 1, "the holder gone")
        figures = gpu_figures(bus.address)
        assert figures["wait_cause"] == ""
        assert figures["waited_s"]["turn"] > 0
    finally:
        waiter.close()


async def test_client_details_signal_a_new_wait_cause_not_gpu_time_moving(agent, bus):
    connection = await MessageBus(bus_address=bus.address).connect()
    signals = await watch_properties_changed(connection, f"path='{names.OBJECT_PATH}'")
    holder = await AsyncShimClient.connect(agent.socket_path, (GPU0,), command="holder")
    try:
        holder.request()
        await holder.wait_grant()
        await asyncio.sleep(0.3)  # its GPU time grows on every read
        # A change of the agent's (TimeQuantum) while only figures moved: its
        # signal carries no ClientDetails.
        await asyncio.to_thread(
            busctl_on_agent, bus.address, "set-property", "TimeQuantum", "u", "20"
        )
        while True:
            signal = await asyncio.wait_for(signals.get(), 30)
            changed = signal.body[1]
            if "TimeQuantum" in changed:
                break
        assert names.PROP_CLIENT_DETAILS not in changed, changed

        # A waiter comes: why it waits is news, signalled with its figures.
        waiter = await AsyncShimClient.connect(agent.socket_path, (GPU0,), command="waiter")
        waiter.request()
        while True:
            changed = (await asyncio.wait_for(signals.get(), 30)).body[1]
            details = changed.get(names.PROP_CLIENT_DETAILS)
            causes = [
                gpu["wait_cause"].value
                for fields in (details.value.values() if details else ())
                for gpu in fields.get("per_gpu", Variant("a{sa{sv}}", {})).value.values()
            ]
            if any(causes):
                break
        await waiter.close()
    finally:
        await holder.close()
        connection.disconnect()
