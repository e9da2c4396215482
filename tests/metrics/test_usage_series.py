"""Who used the GPU and who waited, per process: the counters follow the
process while it is connected and leave no series behind when it is gone.
The exporter is a process per scrape, so what a scrape holds is the agent's
state alone: an agent that forgot nothing would grow a series per process
that ever came."""

from __future__ import annotations

import multiprocessing
import os
import time

from agent_harness import GPU0, ShimClient
from dbus_harness import NOBODY, busctl_on_agent, wait_for
from metrics_harness import exchange, get, samples
from other_users import other_user_env, python_as

from nvshare_agent import protocol

GONE = 10_000  # processes that come and go (the brief: their series must not stay)
PER_CLIENT = ("nvshare_client_",)


def scrape(bus) -> dict:
    answer = exchange(
        python_as(NOBODY, "-m", "nvshare_metrics", "--bus", bus.address),
        get(),
        env=other_user_env(),
    )
    assert answer.status == 200 and answer.returncode == 0, answer
    return samples(answer.body.decode())


def per_client(found: dict) -> dict:
    return {key: value for key, value in found.items() if key[0].startswith(PER_CLIENT)}


def test_gpu_time_and_waits_count_while_connected_and_end_with_the_process(fast_agent, bus):
    uuid = protocol.format_uuid(GPU0)
    busctl_on_agent(bus.address, "set-property", "TimeQuantum", "u", "3600")
    holder = ShimClient(fast_agent.socket_path, command="holder")
    waiter = ShimClient(fast_agent.socket_path, command="waiter")
    holder.request()
    grant = holder.wait_grant()
    waiter.request()
    time.sleep(0.3)  # a wait and a turn long enough to measure
    first = scrape(bus)
    time.sleep(0.3)
    second = scrape(bus)

    def only(found: dict, name: str, **labels) -> float:
        (value,) = [
            value
            for (family, pairs), value in found.items()
            if family == name and set(labels.items()) <= pairs
        ]
        return value

    held_before = only(first, "nvshare_client_gpu_seconds_total", command="holder", gpu=uuid)
    held_after = only(second, "nvshare_client_gpu_seconds_total", command="holder", gpu=uuid)
    assert 0.25 <= held_before < held_after  # it held the GPU busy all along
    # Anti-thrash on, both busy: the waiter waits its turn, and the wait grows.
    waited_before = only(first, "nvshare_client_wait_seconds_total", cause="turn", gpu=uuid)
    waited_after = only(second, "nvshare_client_wait_seconds_total", cause="turn", gpu=uuid)
    assert 0.25 <= waited_before < waited_after
    holder.release(grant)
    waiter.release(waiter.wait_grant(timeout=10))
    holder.close()
    waiter.close()
    wait_for(lambda: not per_client(scrape(bus)), "the per-process series gone")


def test_a_share_groups_counters_go_on_when_its_processes_go(fast_agent, bus):
    # The fake shims run here, as root: one group, user:0.  One stays, so that the
    # GPU (learned from clients here: no NVML) stays known.
    uuid = protocol.format_uuid(GPU0)
    group = {("gpu", uuid), ("group", "user:0")}
    busctl_on_agent(bus.address, "set-property", "TimeQuantum", "u", "3600")
    stays = ShimClient(fast_agent.socket_path, command="stays")
    stays.report_memory(GPU0, 1 << 20)
    holder = ShimClient(fast_agent.socket_path, command="holder")
    waiter = ShimClient(fast_agent.socket_path, command="waiter")
    holder.request()
    grant = holder.wait_grant()
    waiter.request()
    time.sleep(0.3)  # a turn and a wait long enough to measure
    before = scrape(bus)
    gpu_time = before[("nvshare_share_gpu_seconds_total", frozenset(group))]
    waited = before[("nvshare_share_wait_seconds_total", frozenset(group | {("cause", "turn")}))]
    # While they are all here, at least what its processes' own counters say, added up
    # (a scrape reads the groups, Shares1, a moment after the clients, Scheduler1).
    assert gpu_time >= sum(
        v for (name, _), v in before.items() if name == "nvshare_client_gpu_seconds_total"
    )
    assert gpu_time >= 0.25 and waited >= 0.25
    holder.release(grant)
    waiter.release(waiter.wait_grant(timeout=10))
    holder.close()
    waiter.close()
    wait_for(
        lambda: scrape(bus)[("nvshare_clients", frozenset())] == 1, "the holder and waiter gone"
    )
    after = scrape(bus)
    # Their series ended; their group's go on, with what they did in it.
    assert after[("nvshare_share_gpu_seconds_total", frozenset(group))] >= gpu_time
    turn = frozenset(group | {("cause", "turn")})
    assert after[("nvshare_share_wait_seconds_total", turn)] >= waited
    stays.close()


def come_and_go(socket_path, rounds: int) -> None:
    """In a child process, so that the connections are not the staying process's: a
    process's gone connections stay with it while it has another (process_past.py)."""
    for _ in range(rounds):
        holder = ShimClient(socket_path, command="holder")
        waiter = ShimClient(socket_path, command="waiter")
        holder.request()
        grant = holder.wait_grant()
        waiter.request()
        holder.release(grant)
        waiter.wait_grant(timeout=10)
        holder.close()
        waiter.close()


def test_ten_thousand_gone_processes_leave_no_series(fast_agent, bus):
    # One process stays (so that the GPU stays known); each round, one holds,
    # another waits behind it, and both go: a process with no connection left.
    stays = ShimClient(fast_agent.socket_path, command="stays")
    stays.report_memory(GPU0, 1 << 20)
    alone = per_client(scrape(bus))
    assert {dict(labels).get("pid") for _, labels in alone} == {str(os.getpid())}
    rss_before = fast_agent.rss_bytes()
    child = multiprocessing.get_context("fork").Process(
        target=come_and_go, args=(fast_agent.socket_path, GONE // 2)
    )
    child.start()
    child.join(300)
    assert child.exitcode == 0, child.exitcode
    on = frozenset({("gpu", protocol.format_uuid(GPU0))})
    wait_for(lambda: scrape(bus)[("nvshare_clients", frozenset())] == 1, "only one client left")
    found = scrape(bus)
    assert found[("nvshare_grants_total", on)] == GONE
    # The same series as before the 10,000 came and went: none of theirs.
    assert set(per_client(found)) == set(alone)
    # And the agent no bigger for them (Python's allocator keeps some: 16 MiB at most;
    # 2026-11-29: 29.7 MiB before, 30.0 MiB after).
    rss_after = fast_agent.rss_bytes()
    print(f"agent RSS {rss_before / 2**20:.1f} MiB before, {rss_after / 2**20:.1f} MiB after")
    assert rss_after <= rss_before + (16 << 20), (rss_before, rss_after)
    stays.close()
    assert fast_agent.alive()
