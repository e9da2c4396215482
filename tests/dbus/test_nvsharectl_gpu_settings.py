"""nvsharectl and settings per GPU: --gpu on set-tq, anti-thrash and memory-limit, reset,
and each GPU's own values in status; the real CLI against the real agent on a private bus."""

import json
import sys
from pathlib import Path

from dbus_harness import NOBODY, get_property, nvsharectl, property_data, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_harness import GPU0, GPU1, ShimClient

from nvshare_agent import dbus_names as names
from nvshare_agent.protocol import format_uuid

U0, U1 = format_uuid(GPU0), format_uuid(GPU1)


def gpu_settings(address) -> dict:
    return {
        gpu_id: {key: typed["data"] for key, typed in fields.items()}
        for gpu_id, fields in property_data(address, names.PROP_GPU_SETTINGS).items()
    }


def ok(address, *args, user=None):
    result = nvsharectl(address, *args, user=user)
    assert result.returncode == 0, (args, result.stderr)
    return result.stdout


def test_gpu_option_changes_one_gpus_own_settings_and_reset_takes_them_away(agent, bus):
    assert ok(bus.address, "set-tq", "10", "--gpu", "1") == (
        "GPU 1  (not on this node now)\n  own:     tq 10 s\n"
    )
    ok(bus.address, "anti-thrash", "off", "--gpu", "01")
    ok(bus.address, "memory-limit", "40G", "--gpu", "1")
    assert gpu_settings(bus.address) == {
        "1": {"time_quantum_s": 10, "anti_thrash": "off", "memory_limit_bytes": 40 << 30}
    }
    # The node's settings are untouched.
    assert get_property(bus.address, "TimeQuantum") == "u 30"
    assert get_property(bus.address, names.PROP_MEMORY_LIMIT) == "t 0"
    assert json.loads(ok(bus.address, "--json", "reset", "--gpu", "1", "time-quantum")) == {
        "gpu": "1",
        "settings": {"anti_thrash": "off", "memory_limit_bytes": 40 << 30},
    }
    ok(bus.address, "set-tq", "5", "--gpu", U1.upper())
    assert gpu_settings(bus.address) == {
        "1": {"anti_thrash": "off", "memory_limit_bytes": 40 << 30},
        U1: {"time_quantum_s": 5},
    }
    assert ok(bus.address, "reset", "--gpu", "1") == "GPU 1: no settings of its own\n"
    assert gpu_settings(bus.address) == {U1: {"time_quantum_s": 5}}
    assert ok(bus.address, "reset", "--gpu", "7") == "GPU 7: no settings of its own\n"


def test_status_shows_each_gpus_own_values(agent, bus):
    with ShimClient(agent.socket_path, (GPU0, GPU1), "both"):
        wait_for(lambda: len(property_data(bus.address, "Gpus")) == 2, "both GPUs known")
        line = ok(bus.address, "anti-thrash", "on", "--gpu", U1)
        assert (
            line == f"GPU 1  {U1}\n  tq:      30 s   anti-thrash: on (own)   memory limit: none\n"
        )
        ok(bus.address, "memory-limit", "8G")  # node-wide
        text = ok(bus.address, "status")
        assert text.startswith("time quantum: 30 s    anti-thrash: auto    memory limit: 8.0 GiB")
        blocks = {
            block.split()[2]: block for block in text.split("\n\n") if block.startswith("GPU ")
        }
        assert "  tq:      30 s   anti-thrash: auto   memory limit: 8.0 GiB\n" in blocks[U0]
        assert "  tq:      30 s   anti-thrash: on (own)   memory limit: 8.0 GiB\n" in blocks[U1]
        assert all(len(line) <= 80 for line in text.splitlines())
        status = json.loads(ok(bus.address, "status", "--json"))
        assert status["memory_limit_bytes"] == 8 << 30
        assert status["gpu_settings"] == {U1: {"anti_thrash": "on"}}
        gpus = {gpu["uuid"]: gpu for gpu in status["gpus"]}
        assert gpus[U1]["own_settings"] == ["anti_thrash"] and gpus[U0]["own_settings"] == []
        assert (gpus[U1]["anti_thrash"], gpus[U1]["time_quantum_s"]) == ("on", 30)
        assert gpus[U0]["memory_limit_bytes"] == 8 << 30 and gpus[U0]["index"] == -1


def test_node_wide_memory_limit(agent, bus):
    assert ok(bus.address, "memory-limit", "512M") == (
        "time quantum: 30 s    anti-thrash: auto    memory limit: 512.0 MiB\n"
    )
    assert get_property(bus.address, names.PROP_MEMORY_LIMIT) == f"t {512 << 20}"
    ok(bus.address, "memory-limit", "none")
    assert get_property(bus.address, names.PROP_MEMORY_LIMIT) == "t 0"


def test_bad_values_and_ids_exit_2_with_one_line(agent, bus):
    for args, line in (
        (
            ["set-tq", "5", "--gpu", "first"],
            "nvsharectl: invalid value for --gpu: a GPU is named by its UUID "
            "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx) or its NVML index (0..1023), got 'first'",
        ),
        (
            ["set-tq", "0", "--gpu", "1"],
            "nvsharectl: invalid value: GPU 1: time quantum must be 1..86400 seconds, got 0",
        ),
        (
            ["set-tq", "-5", "--gpu", "1"],
            "nvsharectl: invalid value: GPU 1: time quantum must be 1..86400 seconds, got -5",
        ),
        (
            ["memory-limit", "lots"],
            "nvsharectl: invalid value: a size is a whole number of bytes with an optional "
            "K, M, G or T suffix, got 'lots'",
        ),
        (
            ["reset", "time-quantum"],
            "nvsharectl: Missing option '--gpu'; see 'nvsharectl reset --help'",
        ),
        (
            ["reset", "--gpu", "1", "colour"],
            "nvsharectl: Invalid value for '[time-quantum|anti-thrash|memory-limit]': 'colour' "
            "is not one of 'time-quantum', 'anti-thrash', 'memory-limit'; "
            "see 'nvsharectl reset --help'",
        ),
    ):
        result = nvsharectl(bus.address, *args)
        assert (result.returncode, result.stdout, result.stderr) == (2, "", line + "\n"), args
    assert gpu_settings(bus.address) == {}


def test_nobody_may_not_change_a_gpus_settings(agent, bus):
    result = nvsharectl(bus.address, "set-tq", "5", "--gpu", "1", user=NOBODY)
    assert result.returncode == 1 and "permission denied" in result.stderr
    assert gpu_settings(bus.address) == {}
