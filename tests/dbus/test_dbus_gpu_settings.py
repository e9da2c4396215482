"""Settings per GPU and the node-wide memory limit through the real bus: GpuSettings
(a{sa{sv}}, read-write, replaced whole), MemoryLimit (t), and each GPU's own values in
GpuDetails.  Set as root, as nobody (the policy refuses), and as nobody through a loose
policy (the agent refuses); a bad map changes nothing."""

import asyncio
import json
import sys
from pathlib import Path

import pytest
from dbus_harness import (
    NOBODY,
    busctl,
    busctl_on_agent,
    get_property,
    property_data,
    wait_for,
    watch_properties_changed,
)
from dbus_next import Message, MessageType, Variant
from dbus_next.aio import MessageBus

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_harness import GPU0, GPU1, ShimClient

from nvshare_agent import dbus_names as names
from nvshare_agent.protocol import format_uuid

U0, U1 = format_uuid(GPU0), format_uuid(GPU1)


def set_gpu_settings(address, *busctl_value, user=None, check=True):
    """busctl's notation for a{sa{sv}}: count, then id, count, key, type, value, ..."""
    return busctl_on_agent(
        address,
        "set-property",
        "--",
        names.PROP_GPU_SETTINGS,
        "a{sa{sv}}",
        *map(str, busctl_value),
        user=user,
        check=check,
    )


def gpu_settings(address) -> dict:
    """GpuSettings as plain values: id -> key -> value."""
    return {
        gpu_id: {key: typed["data"] for key, typed in fields.items()}
        for gpu_id, fields in property_data(address, names.PROP_GPU_SETTINGS).items()
    }


def test_introspection_offers_the_new_settings_as_writable(agent, bus):
    text = busctl(bus.address, "introspect", names.BUS_NAME, names.OBJECT_PATH).stdout
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.startswith(".")}
    assert rows[".MemoryLimit"][1:3] == ["property", "t"] and "writable" in rows[".MemoryLimit"]
    assert rows[".GpuSettings"][1:3] == ["property", "a{sa{sv}}"]
    assert "writable" in rows[".GpuSettings"] and "emits-change" in rows[".GpuSettings"]


def test_root_sets_a_gpus_own_settings_and_gpu_details_show_them(agent, bus):
    assert gpu_settings(bus.address) == {}
    with ShimClient(agent.socket_path, (GPU0, GPU1), "both"):
        wait_for(lambda: len(property_data(bus.address, "Gpus")) == 2, "both GPUs known")
        set_gpu_settings(
            bus.address, 2, "1", 1, "time_quantum_s", "u", 10,
            U0.upper(), 2, "anti_thrash", "s", "off", "memory_limit_bytes", "t", 1 << 30,
        )  # fmt: skip
        assert gpu_settings(bus.address) == {
            "1": {"time_quantum_s": 10},
            U0: {"anti_thrash": "off", "memory_limit_bytes": 1 << 30},
        }
        details = {
            uuid: {key: typed["data"] for key, typed in fields.items()}
            for uuid, fields in property_data(bus.address, names.PROP_GPU_DETAILS).items()
        }
        # No NVML here: "1" names no GPU, the UUID does.
        assert details[U0]["anti_thrash"] == "off" and details[U0]["time_quantum_s"] == 30
        assert details[U0]["memory_limit_bytes"] == 1 << 30 and details[U0]["index"] == -1
        assert details[U1]["anti_thrash"] == "auto" and details[U1]["memory_limit_bytes"] == 0
    saved = json.loads((agent.state_dir / "settings.json").read_text())
    assert saved == {
        "gpus": {
            "1": {"time_quantum_s": 10},
            U0: {"anti_thrash": "off", "memory_limit_bytes": 1 << 30},
        }
    }
    # Writing the map replaces it: what is left out is gone.
    set_gpu_settings(bus.address, 1, "1", 1, "time_quantum_s", "u", 12)
    assert gpu_settings(bus.address) == {"1": {"time_quantum_s": 12}}
    wait_for(lambda: "dbus set GpuSettings={'1': {'time_quantum_s': 12}}" in agent.log(), "log")


def test_root_sets_the_node_wide_memory_limit(agent, bus):
    assert get_property(bus.address, names.PROP_MEMORY_LIMIT) == "t 0"
    busctl_on_agent(bus.address, "set-property", names.PROP_MEMORY_LIMIT, "t", str(8 << 30))
    assert get_property(bus.address, names.PROP_MEMORY_LIMIT) == f"t {8 << 30}"
    result = busctl_on_agent(
        bus.address, "set-property", names.PROP_MEMORY_LIMIT, "s", "lots", check=False
    )
    assert (
        result.returncode != 0 and "memory limit must be a whole number of bytes" in result.stderr
    )


BAD_MAPS = [
    # (busctl's a{sa{sv}} arguments, words the one-line sentence must contain)
    ((1, "1", 1, "time_quantum_s", "u", 0), "GPU 1: time quantum must be 1..86400 seconds, got 0"),
    (
        (1, "1", 1, "time_quantum_s", "s", "ten"),
        "GPU '1': time_quantum_s must be of D-Bus type 'u'",
    ),
    ((1, "1", 1, "colour", "s", "red"), "GPU '1': unknown setting 'colour' (known: time_quantum_s"),
    ((1, "1", 1, "anti_thrash", "s", "maybe"), "anti-thrash mode must be on, off or auto"),
    ((1, "the-big-one", 1, "time_quantum_s", "u", 5), "a GPU is named by its UUID"),
    (
        (2, "1", 1, "time_quantum_s", "u", 5, "01", 1, "time_quantum_s", "u", 6),
        "name the same GPU",
    ),
    # One good entry beside a bad one: the whole write is refused.
    (
        (2, U1, 1, "time_quantum_s", "u", 5, "2", 1, "memory_limit_bytes", "i", -1),
        "GPU 2: memory_limit must be 0 (no limit) or 1M..16T (1 MiB..16 TiB), got -1 bytes",
    ),
]


@pytest.mark.parametrize("value, sentence", BAD_MAPS)
def test_a_bad_map_is_refused_whole_and_changes_nothing(agent, bus, value, sentence):
    set_gpu_settings(bus.address, 1, "3", 1, "anti_thrash", "s", "on")
    result = set_gpu_settings(bus.address, *value, check=False)
    assert result.returncode != 0 and sentence in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert gpu_settings(bus.address) == {"3": {"anti_thrash": "on"}}
    saved = json.loads((agent.state_dir / "settings.json").read_text())
    assert saved == {"gpus": {"3": {"anti_thrash": "on"}}}


def test_a_map_of_the_wrong_type_is_invalid_argument(agent, bus):
    result = busctl_on_agent(
        bus.address, "set-property", names.PROP_GPU_SETTINGS, "a{ss}", "1", "1", "10", check=False
    )
    assert result.returncode != 0
    assert "GPU settings map GPU ids to their settings (D-Bus type 'a{sa{sv}}')" in result.stderr


def test_nobody_may_not_set_gpu_settings_the_policy_refuses(agent, bus):
    result = set_gpu_settings(
        bus.address, 1, "0", 1, "time_quantum_s", "u", 5, user=NOBODY, check=False
    )
    assert result.returncode != 0 and "Access denied" in result.stderr
    result = busctl_on_agent(
        bus.address, "set-property", names.PROP_MEMORY_LIMIT, "t", "1", user=NOBODY, check=False
    )
    assert result.returncode != 0 and "Access denied" in result.stderr
    assert gpu_settings(bus.address) == {}
    assert get_property(bus.address, names.PROP_GPU_SETTINGS, user=NOBODY) == "a{sa{sv}} 0"


def test_nobody_may_not_set_gpu_settings_the_agent_refuses_too(
    agent_on_permissive_bus, permissive_bus
):
    address = permissive_bus.address
    result = set_gpu_settings(
        address, 1, "0", 1, "time_quantum_s", "u", 5, user=NOBODY, check=False
    )
    assert result.returncode != 0
    assert "needs root or group nvshare-admin (caller uid 65534)" in result.stderr
    assert gpu_settings(address) == {}
    set_gpu_settings(address, 1, "0", 1, "time_quantum_s", "u", 5)  # root: the same bus lets it
    assert gpu_settings(address) == {"0": {"time_quantum_s": 5}}


async def test_watchers_see_gpu_settings_and_gpu_details_change(agent, bus):
    shim = ShimClient(agent.socket_path, (GPU0,), "one")
    connection = await MessageBus(bus_address=bus.address).connect()
    signals = await watch_properties_changed(connection, f"path='{names.OBJECT_PATH}'")
    try:
        wait_for(lambda: len(property_data(bus.address, "Gpus")) == 1, "the GPU known")
        await asyncio.sleep(0.3)  # the connect's own change notice passes first
        while not signals.empty():
            signals.get_nowait()
        value = Variant("a{sa{sv}}", {U0: {"time_quantum_s": Variant("u", 3)}})
        reply = await connection.call(
            Message(
                destination=names.BUS_NAME,
                path=names.OBJECT_PATH,
                interface="org.freedesktop.DBus.Properties",
                member="Set",
                signature="ssv",
                body=[names.INTERFACE, names.PROP_GPU_SETTINGS, value],
            )
        )
        assert reply.message_type == MessageType.METHOD_RETURN, reply.body
        changed = (await asyncio.wait_for(signals.get(), 30)).body[1]
        assert changed[names.PROP_GPU_SETTINGS].value[U0]["time_quantum_s"].value == 3
        assert changed[names.PROP_GPU_DETAILS].value[U0]["time_quantum_s"].value == 3
        assert names.PROP_TIME_QUANTUM not in changed
    finally:
        connection.disconnect()
        shim.close()
