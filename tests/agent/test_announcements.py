"""What the agent sends a shim that announced no additions in HELLO (an older shim):
the agent's own announcement, WELCOME, which such a shim ignores, and none of the
additions it would misread: no KEEPALIVE, no WHEN_IDLE drop (docs/protocol.md,
"Additions without a new version"; issue 36, point 7)."""

from __future__ import annotations

import asyncio

import pytest
from agent_harness import GPU0, AsyncShimClient

from nvshare_agent.engine import AGENT_FEATURES
from nvshare_agent.protocol import DropFlags, Features, MessageType
from nvshare_agent.settings import AntiThrash, Settings

GIB = 1 << 30
AUTO = Settings(
    time_quantum_s=1, anti_thrash=AntiThrash.AUTO, idle_release_ms=1000, drop_grace_ms=30_000
)
NEW_SHIM = int(Features.YIELD | Features.KEEPALIVE)


async def two_shims(agent, path, older_features: int):
    """A shim with the given features and one that announces what today's shim does,
    whose memory does not fit together: they take exclusive turns."""
    older = await AsyncShimClient.connect(path, (GPU0,), "older", features=older_features)
    newer = await AsyncShimClient.connect(path, (GPU0,), "newer", features=NEW_SHIM)
    newer.report_gpu_memory(GPU0, 80 * GIB)
    newer.report_memory(GPU0, 8 * GIB)
    older.report_memory(GPU0, 76 * GIB)
    for _ in range(500):
        gpus = agent.snapshot().gpus
        if gpus and gpus[0].memory_demand_bytes >= 84 * GIB and gpus[0].mode == "exclusive":
            return older, newer
        await asyncio.sleep(0.01)
    raise AssertionError("the GPU did not turn to exclusive turns")


async def test_a_shim_that_announced_nothing_hears_welcome_but_no_keepalives(
    start_inproc_agent,
):
    agent, path = await start_inproc_agent(AUTO.replaced(time_quantum_s=3600))
    older, newer = await two_shims(agent, path, 0)
    newer.request()
    grant = await newer.wait_grant()
    older.request()
    await asyncio.sleep(2.5)  # waits (a shim that asked would hear two keepalives)
    assert await older.nothing_within(0.01)
    # The announcement itself goes to every shim, right after SETTINGS.
    assert older.welcome is not None and older.welcome.features == AGENT_FEATURES
    assert older.keepalives == 0
    newer.release(grant)
    await older.wait_grant()
    for client in (older, newer):
        await client.close()


@pytest.mark.parametrize(
    "older_features, drop_flags",
    [
        (0, 0),
        (int(Features.YIELD | Features.USAGE), int(DropFlags.WHEN_IDLE)),
        (int(Features.YIELD), 0),
    ],
    ids=["announced-nothing", "announced-yield-and-usage", "announced-yield-only"],
)
async def test_only_a_shim_that_announced_yield_is_asked_to_give_back_when_idle(
    start_inproc_agent, older_features, drop_flags
):
    agent, path = await start_inproc_agent(AUTO)
    older, newer = await two_shims(agent, path, older_features)
    newer.request()
    newer_grant = await newer.wait_grant()
    await asyncio.sleep(0.5)  # uses the GPU: it will not count as light work
    older.request()
    await newer.expect(MessageType.DROP_REQUEST)  # light work waits
    newer.release(newer_grant)
    grant = await older.wait_grant()
    newer.request()
    # Others wait: a shim that announced YIELD, its lease shown light by its GPU time (a
    # 10 ms burst, then idle), is asked to give the GPU back once idle.  One that did not
    # would take that for a drop now, so it keeps its turn until the quantum ends and then
    # hears a plain drop; so does one that measures nothing: its hold is all the agent
    # sees of it, and a hold is not light.
    if older_features & Features.USAGE:
        older.report_usage(GPU0, 10_000)
    drop = await older.expect(MessageType.DROP_REQUEST, timeout=5)
    assert drop.lease == grant.lease and drop.flags == drop_flags, drop
    for client in (older, newer):
        await client.close()
