"""What the admin reads is what runs (issue 45): GetSettings, `nvsharectl status` and
its --json say where each value comes from (the file, run time, the default) and the
file's value beside one set at run time; ResetSetting and `nvsharectl reset-setting`
go back to the file's value, for good; a share section for a user this node lacks is
a warning (ConfigWarnings, status), not a bad file; text fits the terminal it is on."""

from __future__ import annotations

import fcntl
import json
import os
import struct
import subprocess
import sys
import termios

import pytest
from dbus_harness import (
    TIMEOUT_S,
    AgentProcess,
    busctl,
    dbus_send,
    nvsharectl,
    property_data,
    wait_for,
)

from nvshare_agent import dbus_names as names

MISSING_USER = "nobody-by-that-name"
CONFIG = (
    f"[scheduler]\ntime_quantum = 20\nanti_thrash = on\n\n[share:user:{MISSING_USER}]\nweight = 3\n"
)


def start_agent(world_dir, bus) -> AgentProcess:
    agent = AgentProcess(world_dir, bus.address)
    agent.start()
    wait_for(lambda: bus.name_has_owner() or agent.process.poll() is not None, "the agent")
    agent.assert_alive()
    return agent


@pytest.fixture
def configured_agent(world_dir, bus):
    (world_dir / "absent.conf").write_text(CONFIG)  # the harness's --config
    agent = start_agent(world_dir, bus)
    yield agent
    assert agent.stop() == 0, agent.log()


def get_settings(address: str) -> dict:
    reply = busctl(
        address,
        "--json=short",
        "call",
        names.BUS_NAME,
        names.OBJECT_PATH,
        names.INTERFACE,
        names.METHOD_GET_SETTINGS,
    )
    (rows,) = json.loads(reply.stdout)["data"]
    return {
        (row["section"]["data"], row["key"]["data"]): {k: v["data"] for k, v in row.items()}
        for row in rows
    }


def test_each_value_says_where_it_comes_from_and_reset_goes_back_to_the_file(
    configured_agent, bus, world_dir
):
    assert nvsharectl(bus.address, "set-tq", "7").returncode == 0
    rows = get_settings(bus.address)
    assert rows[("scheduler", "time_quantum")] == {
        "section": "scheduler",
        "key": "time_quantum",
        "value": 7,
        "source": "run time",
        "file_value": 20,
        "reset": "nvsharectl reset-setting time_quantum",
    }
    assert rows[("scheduler", "anti_thrash")]["source"] == "file"
    assert rows[("scheduler", "memory_limit")]["source"] == "default"
    assert rows[("scheduler", "memory_limit")]["reset"] == ""

    text = nvsharectl(bus.address, "status").stdout
    lines = text.splitlines()
    assert lines[0].startswith(f"CONFIG WARNING: config {world_dir / 'absent.conf'} line 5:")
    assert "time quantum: 7 s    anti-thrash: on    memory limit: none" in lines
    start = lines.index("settings: from the file or set at run time; the rest are defaults")
    assert lines[start + 2].split() == ["anti_thrash", "on", "file"]
    assert lines[start + 1].split() == [
        "time_quantum",
        "7",
        "s",
        "run",
        "time",
        "(file:",
        "20",
        "s)",
    ]
    assert lines[start + 3].strip().startswith("(nvsharectl reset-setting NAME")
    status = json.loads(nvsharectl(bus.address, "status", "--json").stdout)
    (tq,) = [row for row in status["settings"] if row["key"] == "time_quantum"]
    assert (tq["value"], tq["source"], tq["file_value"]) == (7, "run time", 20)

    result = nvsharectl(bus.address, "reset-setting", "time-quantum")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "time_quantum = 20 s (file)\n"
    assert property_data(bus.address, names.PROP_TIME_QUANTUM) == 20
    assert get_settings(bus.address)[("scheduler", "time_quantum")]["source"] == "file"
    # Again: nothing set at run time, nothing to take back; the same answer.
    assert nvsharectl(bus.address, "reset-setting", "time_quantum").returncode == 0

    # For good: after a restart, the file's value.
    assert configured_agent.stop() == 0
    configured_agent.start()
    wait_for(bus.name_has_owner, "the agent back")
    assert property_data(bus.address, names.PROP_TIME_QUANTUM) == 20


def test_a_share_for_a_missing_user_is_a_warning_and_the_rest_of_the_file_applies(
    configured_agent, bus
):
    assert property_data(bus.address, names.PROP_CONFIG_PROBLEM) == ""
    (warning,) = property_data(bus.address, names.PROP_CONFIG_WARNINGS)
    assert f"[share:user:{MISSING_USER}] skipped: no user named '{MISSING_USER}'" in warning
    assert property_data(bus.address, names.PROP_TIME_QUANTUM) == 20
    assert json.loads(nvsharectl(bus.address, "status", "--json").stdout)["config_warnings"] == [
        warning
    ]


def test_a_gpu_and_a_share_value_go_back_to_the_files(world_dir, bus):
    (world_dir / "absent.conf").write_text(
        "[gpu:1]\ntime_quantum = 5\n[share:user:0]\nweight = 3\n"
    )
    agent = start_agent(world_dir, bus)
    try:
        assert nvsharectl(bus.address, "set-tq", "9", "--gpu", "1").returncode == 0
        assert nvsharectl(bus.address, "share", "set", "user:root", "--weight", "4").returncode == 0
        rows = get_settings(bus.address)
        assert rows[("gpu:1", "time_quantum")]["reset"] == (
            "nvsharectl reset-setting time_quantum --gpu 1"
        )
        assert rows[("share:user:0", "weight")]["file_value"] == 3

        result = nvsharectl(bus.address, "reset-setting", "time_quantum", "--gpu", "1")
        assert result.stdout == "[gpu:1] time_quantum = 5 s (file)\n", result.stderr
        result = nvsharectl(bus.address, "reset-setting", "weight", "--share", "user:root")
        assert result.returncode == 0, result.stderr
        rows = get_settings(bus.address)
        assert (
            rows[("share:user:0", "weight")]["value"],
            rows[("share:user:0", "weight")]["source"],
        ) == (3, "file")
    finally:
        assert agent.stop() == 0, agent.log()


@pytest.mark.parametrize(
    "args, sentence",
    [
        (("speed",), "invalid value: [scheduler] has no setting 'speed' (known: time_quantum"),
        (("weight", "--gpu", "1"), "invalid value: [gpu:1] has no setting 'weight'"),
        (("weight", "--share", "process:1"), "invalid value: a share group is user:NAME"),
        (("time_quantum", "--gpu", "x"), "invalid value for --gpu: a GPU is named by its UUID"),
        (
            ("weight", "--gpu", "1", "--share", "user:0"),
            "reset-setting takes --gpu or --share, not both",
        ),
    ],
)
def test_a_setting_that_is_none_is_one_line_and_exit_2(agent, bus, args, sentence):
    result = nvsharectl(bus.address, "reset-setting", *args)
    assert result.returncode == 2 and result.stderr.startswith(f"nvsharectl: {sentence}"), (
        result.stderr
    )
    assert len(result.stderr.strip().splitlines()) == 1


def test_reset_setting_over_d_bus_names_what_is_wrong(agent, bus):
    result = dbus_send(
        bus.address,
        names.METHOD_RESET_SETTING,
        "string:scheduler",
        "string:speed",
        interface=names.INTERFACE,
    )
    assert names.ERROR_INVALID_ARGUMENT in result.stderr, result.stderr
    assert "[scheduler] has no setting 'speed'" in result.stderr


# ---------------------------------------------------------------- the terminal's width

LONG_UNIT = "unit:" + "a-very-long-jupyter-server-name-" * 3 + "alice.service"


def on_a_terminal(address: str, columns: int, *args: str) -> str:
    """nvsharectl's output on a terminal `columns` wide (a pseudo-terminal)."""
    main, side = os.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "nvshare_cli", "--bus", address, *args],
            stdout=side,
            stderr=subprocess.PIPE,
            env=env,
        )
        os.close(side)
        chunks = []
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the other side closed
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert process.wait(timeout=TIMEOUT_S) == 0, process.stderr.read()
    finally:
        os.close(main)
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_text_fits_the_terminal_it_is_on_and_80_columns_elsewhere(agent, bus):
    assert nvsharectl(bus.address, "share", "set", LONG_UNIT, "--weight", "2").returncode == 0
    wide = on_a_terminal(bus.address, 200, "share")
    (line,) = [line for line in wide.splitlines() if "weight 2" in line]
    assert line.endswith(LONG_UNIT) and len(line) > 80, wide
    narrow = on_a_terminal(bus.address, 60, "share")
    (line,) = [line for line in narrow.splitlines() if "weight 2" in line]
    assert len(line) == 60 and line.endswith("…"), narrow
    piped = nvsharectl(bus.address, "share").stdout
    (line,) = [line for line in piped.splitlines() if "weight 2" in line]
    assert len(line) == 80 and line.endswith("…"), piped
