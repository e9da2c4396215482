"""Lock scheduling over real UNIX sockets, with the Agent running in the test's loop
(so a test can change settings through the same facade the D-Bus API uses)."""

from __future__ import annotations

import asyncio

import pytest
from agent_harness import GPU0, GPU1, AsyncShimClient, ShimClient

from nvshare_agent import protocol
from nvshare_agent.protocol import GrantFlags, MessageType
from nvshare_agent.settings import AntiThrash, Settings, SettingsError

LONG_QUANTUM = Settings(
    time_quantum_s=3600, anti_thrash=AntiThrash.ON, idle_release_ms=100, drop_grace_ms=300
)


async def clients(path, n, gpus=(GPU0,)):
    return [await AsyncShimClient.connect(path, gpus, command=f"c{i}") for i in range(n)]


async def test_hello_is_answered_with_the_current_settings(start_inproc_agent):
    agent, path = await start_inproc_agent()
    (c,) = await clients(path, 1)
    assert c.settings.anti_thrash == 1
    assert c.settings.time_quantum_ms == 1000 and c.settings.drop_grace_ms == 300
    assert c.settings.idle_release_ms == 100


async def test_waiters_are_granted_in_request_order(start_inproc_agent):
    agent, path = await start_inproc_agent(LONG_QUANTUM)
    cs = await clients(path, 4)
    cs[0].request()
    grant = await cs[0].wait_grant()
    assert grant.flags == GrantFlags.EXCLUSIVE
    for c in (cs[2], cs[1], cs[3]):  # queue order differs from connect order on purpose
        c.request()
        await asyncio.sleep(0)  # let the agent read each request before the next is sent
        await _until(
            lambda: len(agent.snapshot().gpus[0].queue_pids) == [cs[2], cs[1], cs[3]].index(c) + 1
        )
    holder = (cs[0], grant)
    for expected in (cs[2], cs[1], cs[3]):
        holder[0].release(holder[1])
        holder = (expected, await expected.wait_grant())
    for c in cs:
        await c.close()


async def test_quantum_expiry_asks_the_holder_to_drop_then_grants_the_next(start_inproc_agent):
    # A long grace, so that a stalled CI machine cannot turn the release into a revoke.
    agent, path = await start_inproc_agent(
        Settings(
            time_quantum_s=1, anti_thrash=AntiThrash.ON, idle_release_ms=100, drop_grace_ms=30_000
        )
    )
    a, b = await clients(path, 2)
    a.request()
    grant_a = await a.wait_grant()
    b.request()
    drop = await a.expect(MessageType.DROP_REQUEST)
    assert drop.lease == grant_a.lease
    assert await b.nothing_within(0.05)  # not before the holder releases
    a.release(grant_a)
    grant_b = await b.wait_grant()
    assert grant_b.lease > grant_a.lease


async def test_holder_that_ignores_drop_is_revoked_after_grace(start_inproc_agent):
    agent, path = await start_inproc_agent()
    a, b = await clients(path, 2)
    a.request()
    grant_a = await a.wait_grant()
    b.request()
    await a.expect(MessageType.DROP_REQUEST)
    revoked = await a.expect(MessageType.REVOKED)
    assert revoked.lease == grant_a.lease
    await b.wait_grant()
    # The late release crosses the revoke: it is stale and must not free b's lease.
    a.release(grant_a)
    a.request()
    await _until(lambda: len(agent.snapshot().gpus[0].queue_pids) == 1)  # a waits: b kept its lease
    assert len(agent.snapshot().gpus[0].holder_pids) == 1
    assert await a.nothing_within(0.05)


@pytest.mark.parametrize("waiter_leaves_by", ["withdrawing", "exiting"])
def test_holder_is_not_revoked_once_the_only_waiter_has_left(start_agent, waiter_leaves_by):
    """The real agent process (quantum 1 s, grace 300 ms): a revoke only makes room for a waiter."""
    agent = start_agent()
    with ShimClient(agent.socket_path, command="holder") as holder:
        holder.request()
        grant = holder.wait_grant()
        waiter = ShimClient(agent.socket_path, command="waiter")
        waiter.request()
        holder.expect(MessageType.DROP_REQUEST)
        if waiter_leaves_by == "withdrawing":
            waiter.send_raw(protocol.encode_lock(MessageType.RELEASED, GPU0, 0))
            agent.wait_for_log(r"withdraw gpu=")
        else:
            waiter.close()
            agent.wait_for_log(r"disconnect pid=")
        assert holder.nothing_within(1.5), "the holder heard from the agent with no one waiting"
        holder.release(grant)
        agent.wait_for_log(rf"release gpu=\S+ pid=\d+ lease={grant.lease} ")
        waiter.close()
    assert " revoke " not in agent.log()


async def test_no_drop_request_while_nobody_waits(start_inproc_agent):
    agent, path = await start_inproc_agent()
    (a,) = await clients(path, 1)
    a.request()
    await a.wait_grant()
    assert await a.nothing_within(1.5)  # past the 1 s quantum: alone, it keeps the GPU


async def test_early_release_hands_over_at_once_and_requeues(start_inproc_agent):
    agent, path = await start_inproc_agent(LONG_QUANTUM)
    a, b = await clients(path, 2)
    a.request()
    grant_a = await a.wait_grant()
    b.request()
    await _until(lambda: len(agent.snapshot().gpus[0].queue_pids) == 1)
    a.release(grant_a)  # idle: gives the GPU back long before the quantum
    grant_b = await b.wait_grant()
    a.request()  # needs it again: waits behind b
    await _until(lambda: len(agent.snapshot().gpus[0].queue_pids) == 1)
    b.release(grant_b)
    await a.wait_grant()


async def test_anti_thrash_off_grants_everyone_shared_and_back_on_restores_exclusive(
    start_inproc_agent,
):
    agent, path = await start_inproc_agent(LONG_QUANTUM)
    a, b, c = await clients(path, 3)
    a.request()
    grant_a = await a.wait_grant()
    b.request()
    await _until(lambda: len(agent.snapshot().gpus[0].queue_pids) == 1)

    await agent.change_settings(anti_thrash=AntiThrash.OFF)
    for client in (a, b, c):
        assert (await client.expect(MessageType.SETTINGS)).anti_thrash == 0
    grant_b = await b.wait_grant()
    assert grant_b.flags == GrantFlags.SHARED
    c.request()
    grant_c = await c.wait_grant()
    assert grant_c.flags == GrantFlags.SHARED
    assert len(agent.snapshot().gpus[0].holder_pids) == 3

    await agent.change_settings(anti_thrash=AntiThrash.ON)
    for client in (a, b, c):
        assert (await client.expect(MessageType.SETTINGS)).anti_thrash == 1
    # Every holder is asked to drop: three processes share the GPU.
    drops = {client: await client.expect(MessageType.DROP_REQUEST) for client in (a, b, c)}
    a.release(grant_a)
    a.request()  # queues: the GPU is still shared by b and c
    assert await a.nothing_within(0.1)
    b.release(grant_b)
    # c ignores its drop request: revoked after the grace, then a holds exclusively.
    revoked = await c.expect(MessageType.REVOKED)
    assert revoked.lease == drops[c].lease
    grant = await a.wait_grant()
    assert grant.flags == GrantFlags.EXCLUSIVE
    assert len(agent.snapshot().gpus[0].holder_pids) == 1


async def test_holder_disconnect_frees_the_lock_at_once(start_inproc_agent):
    agent, path = await start_inproc_agent(LONG_QUANTUM)
    a, b = await clients(path, 2)
    a.request()
    await a.wait_grant()
    b.request()
    await _until(lambda: len(agent.snapshot().gpus[0].queue_pids) == 1)
    await a.close()
    await b.wait_grant()


async def test_waiter_disconnect_leaves_the_queue(start_inproc_agent):
    agent, path = await start_inproc_agent(LONG_QUANTUM)
    a, b, c = await clients(path, 3)
    a.request()
    grant_a = await a.wait_grant()
    b.request()
    await _until(lambda: len(agent.snapshot().gpus[0].queue_pids) == 1)
    c.request()
    await _until(lambda: len(agent.snapshot().gpus[0].queue_pids) == 2)
    await b.close()
    await _until(lambda: len(agent.snapshot().gpus[0].queue_pids) == 1)
    a.release(grant_a)
    await c.wait_grant()


async def test_two_gpus_are_independent(start_inproc_agent):
    agent, path = await start_inproc_agent(LONG_QUANTUM)
    a, b = await clients(path, 2, gpus=(GPU0, GPU1))
    a.request(GPU0)
    await a.wait_grant(GPU0)
    b.request(GPU0)
    b.request(GPU1)  # b waits on GPU0 but must get GPU1 right away
    await b.wait_grant(GPU1)
    a.request(GPU1)
    await _until(
        lambda: (
            {g.uuid: len(g.queue_pids) for g in agent.snapshot().gpus}
            == {g.uuid: 1 for g in agent.snapshot().gpus}
        )
    )


async def test_duplicate_request_is_ignored(start_inproc_agent):
    agent, path = await start_inproc_agent(LONG_QUANTUM)
    a, b = await clients(path, 2)
    a.request()
    grant = await a.wait_grant()
    a.request()
    b.request()
    b.request()
    await _until(lambda: len(agent.snapshot().gpus[0].queue_pids) == 1)
    assert await a.nothing_within(0.05)
    a.release(grant)
    await b.wait_grant()


async def test_settings_changes_are_pushed_validated_and_reported(start_inproc_agent):
    agent, path = await start_inproc_agent(LONG_QUANTUM)
    (a,) = await clients(path, 1)
    seen = []
    agent.subscribe(lambda: seen.append(agent.settings.time_quantum_s))
    await agent.change_settings(time_quantum_s=7)
    assert (await a.expect(MessageType.SETTINGS)).time_quantum_ms == 7000
    await _until(lambda: seen == [7])
    with pytest.raises(SettingsError, match="time quantum must be 1..86400 seconds, got 0"):
        await agent.change_settings(time_quantum_s=0)
    assert agent.settings.time_quantum_s == 7
    assert await a.nothing_within(0.05)


async def test_snapshot_describes_clients_and_gpus(start_inproc_agent):
    agent, path = await start_inproc_agent(LONG_QUANTUM)
    a, b = await clients(path, 2)
    a.request()
    await a.wait_grant()
    b.request()
    await _until(lambda: len(agent.snapshot().gpus[0].queue_pids) == 1)
    snap = agent.snapshot()
    assert snap.gpus[0].uuid == "GPU-00000000-0000-4000-8000-00000000a000"
    states = sorted(c.gpus[0].state for c in snap.clients)
    assert states == ["holding", "waiting"]
    assert {c.command for c in snap.clients} == {"c0", "c1"}


async def _until(predicate, timeout: float = 15.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out waiting for a condition"
        await asyncio.sleep(0.005)
