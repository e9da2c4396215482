"""Settings and live state through the real bus, with busctl, dbus-send and dbus-next."""

import asyncio
import json
import subprocess

import pytest
from dbus_harness import (
    NOBODY,
    busctl,
    busctl_on_agent,
    dbus_send,
    get_property,
    nvsharectl,
    set_property,
    wait_for,
    watch_properties_changed,
)
from dbus_next import Message, Variant
from dbus_next.aio import MessageBus

from nvshare_agent import dbus_names as names
from nvshare_agent.dbus_connection import read_machine_id


def test_introspection_shows_typed_settings_state_and_methods(agent, bus):
    text = busctl(bus.address, "introspect", names.BUS_NAME, names.OBJECT_PATH).stdout
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.startswith(".")}
    assert rows[".TimeQuantum"][1:3] == ["property", "u"] and "writable" in rows[".TimeQuantum"]
    assert rows[".AntiThrash"][1:3] == ["property", "b"] and "writable" in rows[".AntiThrash"]
    assert rows[".Gpus"][1:3] == ["property", "a(sstauau)"] and "writable" not in rows[".Gpus"]
    assert rows[".Clients"][1:3] == ["property", "a(uuusa(sstd))"]
    assert "writable" not in rows[".Clients"]
    assert rows[".GetGpu"][1:4] == ["method", "s", "(sstauau)"]
    for name in (".TimeQuantum", ".AntiThrash", ".Gpus", ".Clients"):
        assert "emits-change" in rows[name]


def test_busctl_reads_and_changes_time_quantum(agent, bus):
    assert get_property(bus.address, "TimeQuantum") == "u 30"
    busctl_on_agent(bus.address, "set-property", "TimeQuantum", "u", "12")
    assert get_property(bus.address, "TimeQuantum") == "u 12"


def test_busctl_reads_and_changes_anti_thrash(agent, bus):
    assert get_property(bus.address, "AntiThrash") == "b true"
    busctl_on_agent(bus.address, "set-property", "AntiThrash", "b", "false")
    assert get_property(bus.address, "AntiThrash") == "b false"
    busctl_on_agent(bus.address, "set-property", "AntiThrash", "b", "true")
    assert get_property(bus.address, "AntiThrash") == "b true"


def test_busctl_reads_and_changes_anti_thrash_mode_and_the_boolean_follows(agent, bus):
    # auto is the default; the boolean (clients from before the third value) reads it as on.
    assert get_property(bus.address, "AntiThrashMode") == 's "auto"'
    assert get_property(bus.address, "AntiThrash") == "b true"
    for mode, boolean in (("off", "false"), ("on", "true"), ("auto", "true")):
        busctl_on_agent(bus.address, "set-property", "AntiThrashMode", "s", mode)
        assert get_property(bus.address, "AntiThrashMode") == f's "{mode}"'
        assert get_property(bus.address, "AntiThrash") == f"b {boolean}"
    # Setting the boolean picks on or off: what it always meant.
    busctl_on_agent(bus.address, "set-property", "AntiThrash", "b", "true")
    assert get_property(bus.address, "AntiThrashMode") == 's "on"'


def test_the_fair_page_is_switched_off_and_on_and_says_so_where_it_comes_from(agent, bus):
    assert get_property(bus.address, "FairPage") == 's "on"'
    busctl_on_agent(bus.address, "set-property", "FairPage", "s", "off")
    assert get_property(bus.address, "FairPage") == 's "off"'
    result = nvsharectl(bus.address, "fair-page", "on")
    assert (result.returncode, result.stdout) == (0, "fair page: on\n"), result.stderr
    result = nvsharectl(bus.address, "--json", "fair-page", "off")
    assert json.loads(result.stdout) == {"fair_page": "off"}
    status = json.loads(nvsharectl(bus.address, "status", "--json").stdout)
    assert status["fair_page"] == "off"
    (row,) = [row for row in status["settings"] if row["key"] == "fair_page"]
    assert (row["section"], row["value"], row["source"]) == ("scheduler", "off", "run time")
    assert row["reset"] == "nvsharectl reset-setting fair_page"
    result = nvsharectl(bus.address, "fair-page", "sometimes")
    assert result.returncode == 2 and get_property(bus.address, "FairPage") == 's "off"'
    assert "fair_page=off" in agent.log()  # the settings line says what runs


def test_busctl_reads_live_state(agent, bus):
    assert get_property(bus.address, "Gpus").startswith("a(sstauau) ")
    assert get_property(bus.address, "Clients") == "a(uuusa(sstd)) 0"


async def _call(connection, member, signature, body, interface="org.freedesktop.DBus.Properties"):
    return await asyncio.wait_for(
        connection.call(
            Message(
                destination=names.BUS_NAME,
                path=names.OBJECT_PATH,
                interface=interface,
                member=member,
                signature=signature,
                body=body,
            )
        ),
        30,
    )


async def test_library_client_reads_and_changes_both_settings(agent, bus):
    connection = await MessageBus(bus_address=bus.address).connect()
    try:
        await _call(connection, "Set", "ssv", [names.INTERFACE, "TimeQuantum", Variant("u", 45)])
        await _call(connection, "Set", "ssv", [names.INTERFACE, "AntiThrash", Variant("b", False)])
        reply = await _call(connection, "GetAll", "s", [names.INTERFACE])
        values = {key: variant.value for key, variant in reply.body[0].items()}
        assert values["TimeQuantum"] == 45 and values["AntiThrash"] is False
        assert values["Gpus"] == [] or all(len(gpu) == 5 for gpu in values["Gpus"])
        assert values["Clients"] == []
    finally:
        connection.disconnect()


async def test_subscriber_sees_properties_changed_for_each_setting(agent, bus):
    connection = await MessageBus(bus_address=bus.address).connect()
    signals = await watch_properties_changed(connection, f"path='{names.OBJECT_PATH}'")
    try:
        await asyncio.to_thread(
            busctl_on_agent, bus.address, "set-property", "TimeQuantum", "u", "7"
        )
        signal = await asyncio.wait_for(signals.get(), 30)
        path, (interface, changed, _) = signal.path, signal.body
        assert (path, interface) == (names.OBJECT_PATH, names.INTERFACE)
        assert changed["TimeQuantum"].value == 7 and "AntiThrash" not in changed

        await asyncio.to_thread(
            busctl_on_agent, bus.address, "set-property", "AntiThrash", "b", "false"
        )
        changed = (await asyncio.wait_for(signals.get(), 30)).body[1]
        assert changed["AntiThrash"].value is False and "TimeQuantum" not in changed
    finally:
        connection.disconnect()


BAD_VALUES = [
    # (property, dbus-send value, words the sentence must contain)
    ("TimeQuantum", "uint32:0", "1..86400 seconds, got 0"),
    ("TimeQuantum", "int32:-5", "1..86400 seconds, got -5"),
    ("TimeQuantum", "uint32:86401", "1..86400 seconds, got 86401"),
    ("TimeQuantum", "uint32:4294967295", "got 4294967295"),
    ("TimeQuantum", "int64:-9223372036854775808", "got -9223372036854775808"),
    ("TimeQuantum", "string:ten", "whole number of seconds"),
    ("TimeQuantum", "double:2.5", "whole number of seconds"),
    ("AntiThrash", "string:maybe", "on or off"),
    ("AntiThrash", "uint32:1", "on or off"),
    ("AntiThrashMode", "string:sometimes", "on, off or auto, got 'sometimes'"),
    ("AntiThrashMode", "boolean:true", "on, off or auto"),
    ("FairPage", "string:sometimes", "fair_page must be on or off, got 'sometimes'"),
    ("FairPage", "boolean:false", "fair page must be on or off (D-Bus type 's')"),
]


@pytest.mark.parametrize("prop_name, value, sentence", BAD_VALUES)
def test_bad_value_gets_invalid_argument_and_agent_keeps_serving(
    agent, bus, prop_name, value, sentence
):
    before = get_property(bus.address, prop_name)
    result = set_property(bus.address, prop_name, value)
    assert result.returncode != 0
    assert f"Error {names.ERROR_INVALID_ARGUMENT}: " in result.stderr
    assert sentence in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert get_property(bus.address, prop_name) == before


@pytest.mark.parametrize(
    "prop_name, busctl_value, sentence",
    [
        ("TimeQuantum", ["i", "-5"], "time quantum must be 1..86400 seconds, got -5"),
        ("TimeQuantum", ["s", "ten"], "time quantum must be a whole number of seconds"),
        ("AntiThrash", ["s", "maybe"], "anti-thrash must be on or off"),
    ],
)
def test_busctl_shows_the_sentence_for_a_bad_value(agent, bus, prop_name, busctl_value, sentence):
    result = busctl(
        bus.address,
        "set-property",
        "--",
        names.BUS_NAME,
        names.OBJECT_PATH,
        names.INTERFACE,
        prop_name,
        *busctl_value,
        check=False,
    )
    assert result.returncode != 0
    assert sentence in result.stderr


def test_unknown_gpu_gets_named_error(agent, bus):
    result = dbus_send(
        bus.address,
        "GetGpu",
        "string:GPU-00000000-0000-0000-0000-000000000000",
        interface=names.INTERFACE,
    )
    assert result.returncode != 0
    assert f"Error {names.ERROR_UNKNOWN_GPU}: no GPU with UUID" in result.stderr
    assert get_property(bus.address, "TimeQuantum") == "u 30"


def test_live_state_cannot_be_set(agent, bus):
    result = busctl_on_agent(
        bus.address, "set-property", "Clients", "a(uuusa(sstd))", "0", check=False
    )
    assert result.returncode != 0 and "read-only" in result.stderr
    result = set_property(bus.address, "NoSuchThing", "uint32:1")
    assert "Error org.freedesktop.DBus.Error.UnknownProperty" in result.stderr


def test_flood_of_bad_calls_leaves_agent_serving(agent, bus):
    for value in ["uint32:0", "string:x", "double:1e300", "boolean:true", "int64:99999999999"]:
        assert set_property(bus.address, "TimeQuantum", value).returncode != 0
    assert (
        dbus_send(
            bus.address, "Set", "string:", "string:TimeQuantum", "variant:uint32:5"
        ).returncode
        != 0
    )
    assert dbus_send(bus.address, "GetGpu", "uint32:7", interface=names.INTERFACE).returncode != 0
    busctl_on_agent(bus.address, "set-property", "TimeQuantum", "u", "9")
    assert get_property(bus.address, "TimeQuantum") == "u 9"


def test_unknown_property_interface_or_path_is_a_plain_error_not_a_logged_traceback(agent, bus):
    # Anyone may call Get/GetAll: a bad one must not write an ERROR (with a
    # traceback) to the journal, or any user could flood it.
    calls = [
        (
            "Get",
            names.OBJECT_PATH,
            [f"string:{names.INTERFACE}", "string:NoSuchThing"],
            "UnknownProperty",
        ),
        (
            "Get",
            names.OBJECT_PATH,
            ["string:org.example.Nope", "string:TimeQuantum"],
            "UnknownInterface",
        ),
        ("GetAll", names.OBJECT_PATH, ["string:org.example.Nope"], "UnknownInterface"),
        ("GetAll", "/no/such/path", [f"string:{names.INTERFACE}"], "UnknownObject"),
        ("Get", names.OBJECT_PATH, ["string:", "string:TimeQuantum"], "NotSupported"),
    ]
    for member, path, args, error in calls:
        result = subprocess.run(
            [
                *NOBODY,
                "dbus-send",
                f"--bus={bus.address}",
                f"--dest={names.BUS_NAME}",
                "--print-reply",
                path,
                f"org.freedesktop.DBus.Properties.{member}",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert f"Error org.freedesktop.DBus.Error.{error}: " in result.stderr, (
            member,
            path,
            args,
            result,
        )
    # A change the agent logs after them: the log is written in order, so once
    # this line is there, so is anything the bad calls made it write.
    busctl_on_agent(bus.address, "set-property", "TimeQuantum", "u", "11")
    wait_for(lambda: "dbus set TimeQuantum=11" in agent.log(), "the agent to log the change")
    assert " ERROR " not in agent.log() and "Traceback" not in agent.log(), agent.log()[-3000:]


def test_a_change_that_cannot_be_saved_is_refused_and_changes_nothing(agent, bus):
    # A directory where the state file belongs: the save fails even for root,
    # which ignores mode bits (as a full or read-only disk would fail it).
    blocker = agent.state_dir / "settings.json"
    blocker.mkdir(parents=True)
    result = set_property(bus.address, "TimeQuantum", "uint32:12")
    assert result.returncode != 0
    assert (
        f"Error {names.ERROR_SAVE_FAILED}: settings not changed: could not save them to "
        f"{blocker}: Is a directory"
    ) in result.stderr
    assert get_property(bus.address, "TimeQuantum") == "u 30"
    cli = nvsharectl(bus.address, "anti-thrash", "off")
    assert cli.returncode == 1 and cli.stdout == ""
    assert cli.stderr.count("\n") == 1 and "settings not changed: could not save them" in cli.stderr
    assert get_property(bus.address, "AntiThrash") == "b true"
    wait_for(
        lambda: "ERROR settings not changed: could not save them" in agent.log(),
        "the agent's log line",
    )
    # Once the disk is fixed, the same change goes through and is saved.
    blocker.rmdir()
    assert set_property(bus.address, "TimeQuantum", "uint32:12").returncode == 0
    assert get_property(bus.address, "TimeQuantum") == "u 12"
    assert json.loads(blocker.read_text()) == {"time_quantum_s": 12}


def test_peer_methods_answer_at_once_and_log_nothing(agent, bus):
    # dbus-next 0.2.3 forwarded GetMachineId to the bus daemon, which the system
    # policy refuses; its error reply was malformed: the caller timed out and the
    # agent logged a traceback, for any user's call.
    for member, expected in (("Ping", ""), ("GetMachineId", f's "{read_machine_id()}"')):
        result = busctl(
            bus.address,
            "--timeout=5",
            "call",
            names.BUS_NAME,
            names.OBJECT_PATH,
            "org.freedesktop.DBus.Peer",
            member,
            user=NOBODY,
            check=False,
        )
        assert (result.returncode, result.stdout.strip()) == (0, expected), (member, result.stderr)
    busctl_on_agent(bus.address, "set-property", "TimeQuantum", "u", "11")
    wait_for(lambda: "dbus set TimeQuantum=11" in agent.log(), "the agent to log the change")
    assert " ERROR " not in agent.log() and "Traceback" not in agent.log(), agent.log()[-3000:]


def test_machine_id_comes_from_the_first_file_that_holds_one(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text("0123456789abcdef0123456789abcdef\n")
    bad.write_text("not an id\n")
    assert read_machine_id([tmp_path / "absent", bad, good]) == "0123456789abcdef0123456789abcdef"
    with pytest.raises(OSError, match="holds no machine id"):
        read_machine_id([bad])
