"""A memory cap lowered over D-Bus (nvsharectl share set --memory-cap) while a capped
process runs: its next allocation past the new cap is refused, one that fitted the old
cap included, and cuMemGetInfo shows the new cap.  A real shim on the stand-in driver."""

import os
import sys
from pathlib import Path

from dbus_harness import nvsharectl, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "shim"))
from shim_harness import Client, client_env

MIB = 1 << 20


def test_a_cap_lowered_while_a_process_runs_refuses_its_next_allocation_past_it(
    agent, bus, world_dir
):
    group = f"user:{os.geteuid()}"
    result = nvsharectl(bus.address, "share", "set", group, "--memory-cap", "64M")
    assert result.returncode == 0, result.stderr
    go = world_dir / "go"
    env = client_env(agent.socket_path, world_dir / "standin.log", NVSHARE_DEBUG=1)
    # 48 MiB: under the cap it starts with, past the one it is given meanwhile.
    client = Client(world_dir, "capped", (go, 48 * MIB, 4096), env=env)
    try:
        told = "memory cap gpu=0 cap_bytes={}"
        wait_for(lambda: told.format(64 * MIB) in client.stderr, "the first cap at the shim")
        result = nvsharectl(bus.address, "share", "set", group, "--memory-cap", "32M")
        assert result.returncode == 0, result.stderr
        wait_for(lambda: told.format(32 * MIB) in client.stderr, "the lowered cap at the shim")
        go.touch()
        found = client.finish_ok()
    finally:
        client.kill()
    assert found["big"] == "CUDA_ERROR_OUT_OF_MEMORY", client.describe()
    assert int(found["total"]) == 32 * MIB and found["small"] == "CUDA_SUCCESS"
