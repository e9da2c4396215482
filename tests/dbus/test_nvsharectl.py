"""nvsharectl end to end: the real CLI against the real agent on a private bus."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dbus_harness import (
    TIMEOUT_S,
    busctl_on_agent,
    get_property,
    nvsharectl,
    property_data,
    wait_for,
)
from dbus_next import Message

from nvshare_agent import dbus_names as names
from nvshare_agent import protocol
from nvshare_agent.statistics import WAIT_BUCKETS_S
from nvshare_cli import render
from nvshare_cli.client import _error_from_reply

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_harness import GPU0, ShimClient


def test_status_shows_settings_and_fits_80_columns(agent, bus):
    result = nvsharectl(bus.address, "status")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("time quantum: 30 s    anti-thrash: auto")
    assert all(len(line) <= 80 for line in result.stdout.splitlines())
    assert "no clients" in result.stdout


def test_no_command_shows_status(agent, bus):
    result = nvsharectl(bus.address)
    assert result.returncode == 0 and result.stdout.startswith("time quantum: 30 s")


def test_status_json_for_scripts(agent, bus):
    for args in (["--json", "status"], ["status", "--json"], ["--json"]):
        result = nvsharectl(bus.address, *args)
        assert result.returncode == 0, result.stderr
        status = json.loads(result.stdout)
        assert status["time_quantum_s"] == 30 and status["anti_thrash"] is True
        assert isinstance(status["gpus"], list) and status["clients"] == []


def test_clients_lists_none_when_idle(agent, bus):
    assert nvsharectl(bus.address, "clients").stdout.strip() == "no clients"
    assert json.loads(nvsharectl(bus.address, "clients", "--json").stdout) == []


def test_set_tq_and_anti_thrash_commands(agent, bus):
    result = nvsharectl(bus.address, "set-tq", "15")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "time quantum: 15 s    anti-thrash: auto    memory limit: none"
    result = nvsharectl(bus.address, "anti-thrash", "off")
    assert result.returncode == 0 and "anti-thrash: off" in result.stdout
    assert get_property(bus.address, "TimeQuantum") == "u 15"
    assert get_property(bus.address, "AntiThrash") == "b false"
    result = nvsharectl(bus.address, "--json", "anti-thrash", "on")
    assert json.loads(result.stdout) == {
        "anti_thrash": True,
        "anti_thrash_mode": "on",
        "memory_limit_bytes": 0,
        "time_quantum_s": 15,
    }


def test_original_flags_T_and_S_still_work(agent, bus):
    result = nvsharectl(bus.address, "-T", "10")
    assert result.returncode == 0, result.stderr
    assert get_property(bus.address, "TimeQuantum") == "u 10"
    result = nvsharectl(bus.address, "-S", "off")
    assert result.returncode == 0 and get_property(bus.address, "AntiThrash") == "b false"
    result = nvsharectl(bus.address, "-T", "20", "-S", "on", "--json")
    assert json.loads(result.stdout) == {
        "anti_thrash": True,
        "anti_thrash_mode": "on",
        "memory_limit_bytes": 0,
        "time_quantum_s": 20,
    }


def test_auto_comes_back_by_command_and_by_the_original_flag(agent, bus):
    for off, auto in (
        (["anti-thrash", "off"], ["anti-thrash", "auto"]),
        (["-S", "off"], ["-S", "auto"]),
    ):
        assert nvsharectl(bus.address, *off).returncode == 0
        assert get_property(bus.address, "AntiThrashMode") == 's "off"'
        result = nvsharectl(bus.address, *auto)
        assert result.returncode == 0, result.stderr
        assert "anti-thrash: auto" in result.stdout
        assert get_property(bus.address, "AntiThrashMode") == 's "auto"'


def test_status_says_how_each_gpu_is_scheduled_and_why(agent, bus):
    client = ShimClient(agent.socket_path, command="notebook")
    client.send_raw(protocol.encode_gpu_memory(GPU0, 80 << 30))
    client.report_memory(GPU0, 2 << 30)
    client.request()
    client.wait_grant()
    wait_for(lambda: "mode:    shared (auto: memory fits" in nvsharectl(bus.address).stdout, "mode")
    lines = nvsharectl(bus.address, "status").stdout.splitlines()
    (mode,) = [line for line in lines if line.startswith("  mode:")]
    # Its 2 GiB and the context's estimated 512 MiB, of the 80 GiB its shim reported.
    assert mode == "  mode:    shared (auto: memory fits, 2.5 GiB of 80.0 GiB)"
    busctl_on_agent(bus.address, "set-property", "AntiThrashMode", "s", "on")
    wait_for(
        lambda: "  mode:    exclusive (anti-thrash on)" in nvsharectl(bus.address).stdout,
        "the mode line after anti-thrash on",
    )
    client.close()


def test_values_the_agent_rejects_exit_2_with_its_sentence(agent, bus):
    for args, sentence in (
        (["set-tq", "0"], "time quantum must be 1..86400 seconds, got 0"),
        (["-T", "-3"], "time quantum must be 1..86400 seconds, got -3"),
        (["-T", "100000"], "time quantum must be 1..86400 seconds, got 100000"),
        (["set-tq", "99999999999"], "time quantum must be 1..86400 seconds, got 99999999999"),
        # A negative number is a value, not an unknown option.
        (["set-tq", "-5"], "time quantum must be 1..86400 seconds, got -5"),
    ):
        result = nvsharectl(bus.address, *args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr == f"nvsharectl: invalid value: {sentence}\n"
    assert get_property(bus.address, "TimeQuantum") == "u 30"


def test_bad_usage_exits_2_with_one_line(agent, bus):
    for args, line in (
        (
            ["-S", "maybe"],
            "nvsharectl: Invalid value for '-S' / '--anti-thrash': 'maybe' is not "
            "one of 'on', 'off', 'auto'; see 'nvsharectl --help'",
        ),
        (
            ["anti-thrash", "sometimes"],
            "nvsharectl: Invalid value for 'on|off|auto': 'sometimes' is "
            "not one of 'on', 'off', 'auto'; see 'nvsharectl anti-thrash --help'",
        ),
        (
            ["set-tq", "ten"],
            "nvsharectl: Invalid value for 'SECONDS': 'ten' is not a valid "
            "integer; see 'nvsharectl set-tq --help'",
        ),
        (["set-tq"], "nvsharectl: Missing argument 'SECONDS'; see 'nvsharectl set-tq --help'"),
        # Click words this one over four lines.
        (
            ["anti-thrash"],
            "nvsharectl: Missing argument 'on|off|auto'. Choose from: on, off, auto; "
            "see 'nvsharectl anti-thrash --help'",
        ),
        (
            ["no-such-command"],
            "nvsharectl: No such command 'no-such-command'; see 'nvsharectl --help'",
        ),
        (
            ["status", "--frobnicate"],
            "nvsharectl: No such option: --frobnicate; see 'nvsharectl status --help'",
        ),
        (["-T", "5", "status"], "nvsharectl: -T/-S cannot be combined with a command"),
    ):
        result = nvsharectl(bus.address, *args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert (result.stdout, result.stderr) == ("", line + "\n"), args
    assert get_property(bus.address, "AntiThrash") == "b true"


def test_output_that_cannot_be_written_is_one_line(agent, bus):
    for args in (["status"], ["--help"]):
        with open("/dev/full", "w") as full:
            result = subprocess.run(
                [sys.executable, "-m", "nvshare_cli", "--bus", bus.address, *args],
                stdout=full,
                stderr=subprocess.PIPE,
                text=True,
                timeout=TIMEOUT_S,
            )
        assert result.returncode == 1, args
        assert result.stderr == "nvsharectl: cannot write the output: No space left on device\n", (
            args
        )


@pytest.mark.parametrize(
    "shell, home, line",
    [
        ("bash", "/dev/null", "cannot install shell completion: /dev/null: File exists"),
        ("pwsh", None, "cannot install shell completion: pwsh: No such file or directory"),
    ],
)
def test_shell_completion_that_cannot_be_installed_is_one_line(tmp_path, shell, home, line):
    # PATH without pwsh; HOME /dev/null, where no rc file can be written.
    env = {**os.environ, "PATH": str(tmp_path), "HOME": home or str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "nvshare_cli", "--install-completion", shell],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
    )
    assert (result.returncode, result.stdout, result.stderr) == (1, "", f"nvsharectl: {line}\n")


def test_agent_not_running_says_what_to_check(bus):
    result = nvsharectl(bus.address, "status")
    assert result.returncode == 1
    line = result.stderr.strip()
    assert line.startswith("nvsharectl: the nvshare agent is not running")
    assert "is nvshare.socket enabled?" in line and "\n" not in line


def test_unreachable_bus_exits_1(world_dir):
    result = nvsharectl(f"unix:path={world_dir}/no-bus-here", "set-tq", "5")
    assert result.returncode == 1
    assert result.stderr.startswith("nvsharectl: cannot connect to the bus at unix:path=")


def test_shell_completion_comes_from_typer(world_dir):
    result = nvsharectl("system", "--show-completion", "bash")
    assert result.returncode == 0 and "_NVSHARECTL_COMPLETE" in result.stdout


def test_control_characters_in_a_command_never_reach_the_terminal():
    # The agent replaces them at HELLO; nvsharectl does too, whichever agent answered.
    status = render.status_as_dict(
        {
            names.PROP_TIME_QUANTUM: 30,
            names.PROP_ANTI_THRASH: True,
            names.PROP_GPUS: [["GPU-a", "H100", 0, [7], []]],
            names.PROP_CLIENTS: [
                [7, 0, 0, "evil\x1b]0;pwned\x07\nrow", [["GPU-a", "holding", 0, 1.0]]]
            ],
        }
    )
    text = render.status_text(status)
    assert "evil\ufffd]0;pwned\ufffd\ufffdrow" in text
    assert all(char.isprintable() for line in text.splitlines() for char in line)
    assert len(text.splitlines()) == 9


def test_empty_bus_address_is_bad_usage_not_the_session_bus(world_dir):
    for args in (["status"], ["status", "--bus", ""], ["clients", "--bus", ""]):
        result = nvsharectl("", *args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr == (
            "nvsharectl: --bus needs 'system' or a D-Bus address "
            "such as unix:path=/run/dbus/system_bus_socket\n"
        ), args
    result = nvsharectl(f"unix:path={world_dir}/no-bus-here", "status", "--bus", "")
    assert result.returncode == 2, result.stderr


@pytest.mark.parametrize(
    "bus, env, line",
    [
        (
            "unix:path=/run/x\nsecond line",
            {},
            "--bus 'unix:path=/run/x\\nsecond line' is not a D-Bus address"
            " (control or non-ASCII characters); "
            "use 'system' or an address such as unix:path=/run/dbus/system_bus_socket",
        ),
        (
            "sytem",
            {},
            "--bus 'sytem' is not a D-Bus address (no transport, such as unix:); "
            "use 'system' or an address such as unix:path=/run/dbus/system_bus_socket",
        ),
        (
            "system",
            {"DBUS_SYSTEM_BUS_ADDRESS": "sytem"},
            "DBUS_SYSTEM_BUS_ADDRESS='sytem' is not a D-Bus address (no transport, such as unix:)",
        ),
    ],
    ids=["newline", "typo", "environment"],
)
def test_a_bus_address_that_is_no_address_is_bad_usage_in_one_line(bus, env, line):
    # A newline in the address used to make the error two lines.
    result = subprocess.run(
        [sys.executable, "-m", "nvshare_cli", "--bus", bus, "status"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, **env},
    )
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"nvsharectl: {line}\n")


def test_an_agent_error_with_a_traceback_is_still_one_line():
    # dbus-next puts the traceback of an unexpected exception into the error text.
    call = Message(destination=names.BUS_NAME, path=names.OBJECT_PATH, member="GetAll", serial=1)
    reply = Message.new_error(
        call,
        "com.dubstepdish.dbus.next.ServiceError",
        "The service interface raised an error: boom.\n['  File \"x.py\", line 1\\n']",
    )
    error = _error_from_reply(reply)
    assert str(error) == (
        "the agent refused: The service interface raised an error: boom. "
        "(com.dubstepdish.dbus.next.ServiceError)"
    )


def test_status_json_gives_each_gpus_statistics_as_the_agent_counts_them(agent, bus):
    # anti-thrash on: the second client waits for the first to release.
    busctl_on_agent(bus.address, "set-property", "AntiThrashMode", "s", "on")
    first = ShimClient(agent.socket_path, command="first")
    second = ShimClient(agent.socket_path, command="second")
    first.request()
    grant = first.wait_grant()
    second.request()
    me = os.getpid()
    wait_for(lambda: any(gpu[4] == [me] for gpu in property_data(bus.address, "Gpus")), "a wait")
    first.release(grant)
    second.release(second.wait_grant())
    uuid = protocol.format_uuid(GPU0)
    wait_for(
        lambda: (
            property_data(bus.address, "Statistics").get(uuid, {}).get("grants", {}).get("data")
            == 2
        ),
        "two grants counted",
    )
    result = nvsharectl(bus.address, "status", "--json")
    assert result.returncode == 0, result.stderr
    (gpu,) = json.loads(result.stdout)["gpus"]
    statistics = gpu["statistics"]
    assert (statistics["grants"], statistics["drops"], statistics["revokes"]) == (2, 0, 0)
    # The +Inf bucket is every wait; JSON has no infinity, so it is the count.
    assert statistics["wait_seconds_count"] == 2
    bounds = [bound for bound, _ in statistics["wait_seconds_buckets"]]
    assert bounds == list(WAIT_BUCKETS_S)
    counts = [count for _, count in statistics["wait_seconds_buckets"]]
    assert counts == sorted(counts) and counts[-1] <= 2  # cumulative
    on_the_bus = property_data(bus.address, "Statistics")[uuid]
    assert statistics["wait_seconds_sum"] == on_the_bus["wait_seconds_sum"]["data"]
    assert [[b, c] for b, c in on_the_bus["wait_seconds_buckets"]["data"][:-1]] == [
        [b, c] for b, c in statistics["wait_seconds_buckets"]
    ]
    assert statistics["wait_seconds_sum"] > 0  # the second one waited for the first
    first.close()
    second.close()


def test_a_gpu_with_nothing_counted_yet_shows_zero_statistics():
    status = render.status_as_dict(
        {
            names.PROP_TIME_QUANTUM: 30,
            names.PROP_ANTI_THRASH: True,
            names.PROP_GPUS: [["GPU-x", "name", 0, [], []]],
            names.PROP_CLIENTS: [],
            names.PROP_STATISTICS: {},
        }
    )
    statistics = status["gpus"][0]["statistics"]
    assert statistics["grants"] == statistics["wait_seconds_count"] == 0
    assert [count for _, count in statistics["wait_seconds_buckets"]] == [0] * len(WAIT_BUCKETS_S)
    # An agent from before Statistics: no key at all, rather than made-up zeros.
    older = render.status_as_dict(
        {
            names.PROP_TIME_QUANTUM: 30,
            names.PROP_ANTI_THRASH: True,
            names.PROP_GPUS: [["GPU-x", "name", 0, [], []]],
            names.PROP_CLIENTS: [],
        }
    )
    assert "statistics" not in older["gpus"][0]
