"""Anti-thrash auto over real sockets: the engine in the test's loop, fake shims
that say what the real shim says (GPU_MEMORY, MEMORY_REPORT, HELLO's features).
docs/scheduling.md has the rules; tests/test_scheduler_auto.py tests them without
sockets or sleeps."""

from __future__ import annotations

import asyncio
import time

from agent_harness import GPU0, AsyncShimClient

from nvshare_agent.protocol import DropFlags, Features, GrantFlags, MessageType
from nvshare_agent.settings import AntiThrash, Settings

GIB = 1 << 30
AUTO = Settings(
    time_quantum_s=30, anti_thrash=AntiThrash.AUTO, idle_release_ms=1000, drop_grace_ms=2000
)
SHIM_FEATURES = int(Features.YIELD | Features.KEEPALIVE)


async def shim(path, name: str, total: int = 80 * GIB) -> AsyncShimClient:
    """A fake shim that announces what the real one does and reports the GPU's size."""
    client = await AsyncShimClient.connect(path, (GPU0,), name, features=SHIM_FEATURES)
    client.report_gpu_memory(GPU0, total)
    return client


async def granted_within(client: AsyncShimClient, seconds: float):
    asked = time.monotonic()
    client.request()
    grant = await client.wait_grant(timeout=seconds)
    return grant, time.monotonic() - asked


async def test_clients_whose_memory_fits_run_together_until_one_does_not_fit_then_take_turns(
    start_inproc_agent,
):
    agent, path = await start_inproc_agent(AUTO)
    a, b = await shim(path, "a"), await shim(path, "b")
    a.report_memory(GPU0, 2 * GIB)
    b.report_memory(GPU0, 2 * GIB)
    grant_a, waited_a = await granted_within(a, 0.1)
    grant_b, waited_b = await granted_within(b, 0.1)
    # Both at once, both shared and given back when idle.
    assert waited_a < 0.1 and waited_b < 0.1
    for grant in (grant_a, grant_b):
        assert grant.flags == GrantFlags.SHARED | GrantFlags.RELEASE_WHEN_IDLE
    assert agent.snapshot().gpus[0].mode == "shared"

    # A third client's allocation does not fit beside them.  While it does not run its
    # pages need not be on the GPU: nobody is asked to drop for it.
    c = await shim(path, "c")
    c.report_memory(GPU0, 76 * GIB)
    assert await a.nothing_within(0.1) and await b.nothing_within(0.01)
    assert agent.snapshot().gpus[0].mode == "exclusive"
    # It asks: owed more GPU time than both (it has had none), it fits beside neither.
    # Its running would page: each is asked to drop (it cuts in) once its turn has paid
    # for that (10 x bringing back 2 GiB at 49 GB/s: 0.44 s from its grant), not before.
    c.request()
    for holder in (a, b):
        dropped = await holder.expect(MessageType.DROP_REQUEST)
        assert dropped.flags == 0  # a drop, not a yield
    assert await c.nothing_within(0.05)
    a.release(grant_a)
    b.release(grant_b)
    grant_c = await c.wait_grant(timeout=5)
    # Not everyone fits: its shim keeps its queue short, for drops that drain fast.
    assert grant_c.flags == (
        GrantFlags.SHARED | GrantFlags.RELEASE_WHEN_IDLE | GrantFlags.SHORT_QUEUE
    )
    # Turns: a asks again and waits; the holder hears that someone waits.
    a.request()
    yield_c = await c.expect(MessageType.DROP_REQUEST)
    assert yield_c.flags == DropFlags.WHEN_IDLE and yield_c.idle_ms > 0
    assert await a.nothing_within(0.1)

    # The big allocation goes: it fits again, and a and b run together again.
    c.report_memory(GPU0, 0)
    c.release(grant_c, idle_ms=50)
    grant_a = await a.wait_grant(timeout=1)
    assert grant_a.flags & GrantFlags.SHARED
    _, waited_b = await granted_within(b, 0.1)
    assert waited_b < 0.1
    assert agent.snapshot().gpus[0].mode == "shared"
    for client in (a, b, c):
        await client.close()


async def test_capacity_unknown_takes_turns_until_a_shim_reports_it(start_inproc_agent):
    agent, path = await start_inproc_agent(AUTO)
    a = await AsyncShimClient.connect(path, (GPU0,), "a", features=SHIM_FEATURES)
    b = await AsyncShimClient.connect(path, (GPU0,), "b", features=SHIM_FEATURES)
    grant_a, _ = await granted_within(a, 1)
    # The turn; nothing is known to fit beside it, so light work may cut it short: its
    # shim keeps its queue short, for drops that drain in milliseconds.
    assert grant_a.flags == (
        GrantFlags.SHARED | GrantFlags.RELEASE_WHEN_IDLE | GrantFlags.SHORT_QUEUE
    )
    b.request()  # nothing fits beside a GPU of unknown size
    assert await b.nothing_within(0.05)
    a.report_gpu_memory(GPU0, 80 * GIB)
    # Memory fits now: b runs beside a at once.
    grant_b = await b.wait_grant(timeout=1)
    assert grant_b.flags & GrantFlags.SHARED
    for client in (a, b):
        await client.close()


async def test_a_waiting_shim_hears_keepalives(start_inproc_agent):
    agent, path = await start_inproc_agent(
        AUTO.replaced(anti_thrash=AntiThrash.ON, time_quantum_s=3600)
    )
    holder = await shim(path, "holder")
    waiter = await shim(path, "waiter")
    await granted_within(holder, 1)
    waiter.request()
    await asyncio.sleep(2.5)
    assert await waiter.nothing_within(0.01)  # recv notes the WELCOME and keepalives it meets
    assert waiter.welcome is not None and waiter.welcome.keepalive_ms == 1000
    assert waiter.keepalives >= 2
    assert holder.keepalives == 0  # only those who wait
    for client in (holder, waiter):
        await client.close()


async def test_a_grant_after_another_turn_that_did_not_fit_says_displaced(start_inproc_agent):
    # The shim prefetches at such a grant however soon it comes (shim/lock_machine.c):
    # the other's turn may have pushed this one's pages to the host.
    # Past the GPU's own memory only: under memory_limit alone nothing moves.
    for total, limit, displaced in (
        (80 * GIB, 0, 0),
        (80 * GIB, GIB, 0),
        (3 * GIB, 0, int(GrantFlags.DISPLACED)),
    ):
        settings = AUTO.replaced(anti_thrash=AntiThrash.ON, memory_limit_bytes=limit)
        agent, path = await start_inproc_agent(settings)
        a, b = await shim(path, "a", total), await shim(path, "b", total)
        a.report_memory(GPU0, 2 * GIB)
        b.report_memory(GPU0, 2 * GIB)
        await asyncio.sleep(0.05)  # the reports before the first grant
        grant_a, _ = await granted_within(a, 1)
        assert grant_a.flags == GrantFlags.EXCLUSIVE
        b.request()
        a.release(grant_a)
        grant_b = await b.wait_grant(timeout=1)
        assert grant_b.flags == GrantFlags.EXCLUSIVE | displaced  # a ran while b had memory
        a.request()
        b.release(grant_b)
        grant_a = await a.wait_grant(timeout=1)
        assert grant_a.flags == GrantFlags.EXCLUSIVE | displaced
        for client in (a, b):
            await client.close()
