"""Settings per GPU over real sockets: the engine in the test's loop (changes at run
time, as D-Bus makes them) and the agent as a process (the config file, NVML's
numbering through the fake NVML).  The rules themselves are tested without sockets
in tests/test_scheduler_gpu_settings.py."""

from __future__ import annotations

import json
import sys
import time

import pytest
from agent_harness import GPU0, GPU1, AgentProcess, AsyncShimClient, ShimClient
from test_nvml import FAKE_NVML

from nvshare_agent.protocol import GrantFlags, MessageType, format_uuid
from nvshare_agent.settings import AntiThrash, GpuOverrides, Settings, SettingsError

U0, U1 = format_uuid(GPU0), format_uuid(GPU1)
# A long grace: a stalled CI machine must not turn a release into a revoke.
NODE = Settings(
    time_quantum_s=30, anti_thrash=AntiThrash.ON, idle_release_ms=100, drop_grace_ms=30_000
)


async def both_gpus(path, name):
    return await AsyncShimClient.connect(path, (GPU0, GPU1), name)


async def test_a_client_on_both_gpus_is_asked_to_drop_each_by_that_gpus_quantum(
    start_inproc_agent,
):
    settings = NODE.with_gpu_overrides([(U0, GpuOverrides(time_quantum_s=1))])
    agent, path = await start_inproc_agent(settings)
    holder, waiter = await both_gpus(path, "holder"), await both_gpus(path, "waiter")
    grants = {}
    for gpu in (GPU0, GPU1):
        holder.request(gpu)
        grants[gpu] = await holder.wait_grant(gpu)
        waiter.request(gpu)
    asked = time.monotonic()
    drop = await holder.expect(MessageType.DROP_REQUEST, timeout=10)
    assert drop.gpu == GPU0 and time.monotonic() - asked >= 0.8
    holder.release(grants[GPU0])
    assert (await waiter.wait_grant(GPU0)).gpu == GPU0
    assert await holder.nothing_within(0.5)  # GPU 1's quantum is the node's 30 s
    gpus = {gpu.uuid: gpu for gpu in agent.snapshot().gpus}
    assert gpus[U0].time_quantum_s == 1 and gpus[U1].time_quantum_s == 30
    assert (len(gpus[U1].holder_pids), len(gpus[U1].queue_pids)) == (1, 1)  # still the first
    for client in (holder, waiter):
        await client.close()


async def test_a_gpu_switched_off_at_run_time_grants_its_waiters_and_is_saved(
    start_inproc_agent, tmp_path
):
    agent, path = await start_inproc_agent(NODE)
    a, b = await both_gpus(path, "a"), await both_gpus(path, "b")
    for gpu in (GPU0, GPU1):
        a.request(gpu)
        await a.wait_grant(gpu)
        b.request(gpu)
    assert await b.nothing_within(0.1)
    await agent.change_settings(
        gpu_overrides=[(U1.upper(), GpuOverrides(anti_thrash=AntiThrash.OFF))]
    )
    grant = await b.wait_grant(GPU1, timeout=5)
    assert grant.flags == GrantFlags.SHARED
    assert await b.nothing_within(0.2)  # GPU 0 stays on: b still waits there
    saved = json.loads((tmp_path / "state" / "settings.json").read_text())
    assert saved == {"gpus": {U1: {"anti_thrash": "off"}}}
    assert agent.settings.gpu_overrides == ((U1, GpuOverrides(anti_thrash=AntiThrash.OFF)),)
    # A bad entry refuses the whole change; nothing moves.
    with pytest.raises(SettingsError, match="GPU 1: time quantum must be 1..86400"):
        await agent.change_settings(
            gpu_overrides=[
                (U0, GpuOverrides(time_quantum_s=5)),
                ("1", GpuOverrides(time_quantum_s=0)),
            ]
        )
    assert agent.settings.gpu_overrides == ((U1, GpuOverrides(anti_thrash=AntiThrash.OFF)),)
    assert json.loads((tmp_path / "state" / "settings.json").read_text()) == saved
    for client in (a, b):
        await client.close()


# ---------------------------------------------------------------- the agent as a process

CONFIG_BY_UUID = f"""\
[scheduler]
time_quantum = 30
anti_thrash = on
idle_release_ms = 100
drop_grace_ms = 30000

[gpu:{U0}]
time_quantum = 1
"""


def test_a_gpu_section_of_the_config_applies_to_that_gpu_only(start_agent):
    agent = start_agent(config=CONFIG_BY_UUID)
    holder = ShimClient(agent.socket_path, (GPU0, GPU1), "holder")
    waiter = ShimClient(agent.socket_path, (GPU0, GPU1), "waiter")
    for gpu in (GPU0, GPU1):
        holder.request(gpu)
        holder.wait_grant(gpu)
        waiter.request(gpu)
    assert holder.expect(MessageType.DROP_REQUEST).gpu == GPU0
    agent.wait_for_log(rf"drop gpu={U0} pid=\d+ lease=\d+ held_ms=\d")
    assert holder.nothing_within(0.5)
    assert f"drop gpu={U1}" not in agent.log()
    agent.wait_for_log(
        rf"gpu settings gpu={U0} index=- time_quantum_s=1 anti_thrash=on .* own=time_quantum_s"
    )
    holder.close()
    waiter.close()


def test_settings_by_index_without_an_inventory_are_one_warning(start_agent):
    agent = start_agent(config="[scheduler]\ntime_quantum = 30\n\n[gpu:0]\ntime_quantum = 1\n")
    agent.wait_for_log(r"WARNING settings for GPU 0 by NVML index apply to no GPU")
    with ShimClient(agent.socket_path, (GPU0,)) as client:
        client.request()
        client.wait_grant()
    assert agent.log().count("by NVML index apply to no GPU") == 1


def test_settings_by_index_follow_nvmls_numbering(start_agent):
    # The fake NVML lists an H100 (0), a MIG instance (1) and an L4 (2).
    agent = start_agent(
        config="[scheduler]\nanti_thrash = on\n\n[gpu:2]\nanti_thrash = off\ntime_quantum = 9\n",
        env={
            "FAKE_NVML": "two-gpus",
            "PYTHONPATH": f"{FAKE_NVML}:{':'.join(p for p in sys.path if p)}",
        },
    )
    agent.wait_for_log(
        r"gpu settings gpu=GPU-11111111-2222-3333-4444-555555555555 index=2 time_quantum_s=9 "
        r"anti_thrash=off memory_limit_bytes=0 own=time_quantum_s,anti_thrash"
    )
    assert "gpu settings gpu=GPU-0d84ee44" not in agent.log()
    assert "by NVML index apply to no GPU" not in agent.log()


def test_a_bad_gpu_section_is_one_error_line_naming_it(tmp_path):
    config = "[scheduler]\ntime_quantum = 30\n\n[gpu:the-big-one]\ntime_quantum = 1\n"
    agent = AgentProcess(tmp_path / "a", config=config).start()
    assert agent.stop() == 0
    assert (
        f"ERROR config error: config {agent.config_path} line 4: [gpu:the-big-one]: a GPU is "
        "named by its UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx) or its NVML index "
        "(0..1023), got 'the-big-one'; serving with"
    ) in agent.log()
