"""The pure scheduling core: time is an argument, so nothing here sleeps."""

from __future__ import annotations

import random

import pytest

from nvshare_agent.actions import (
    AskToDrop,
    Gone,
    Grant,
    Greeted,
    Ignored,
    LockReleased,
    Queued,
    Refuse,
    Revoke,
    SendSettings,
    Withdrawn,
)
from nvshare_agent.scheduler import Scheduler
from nvshare_agent.settings import AntiThrash, GpuOverrides, Settings
from nvshare_agent.usage import CHECK_S

G0, G1 = b"\x00" * 15 + b"\x01", b"\x00" * 15 + b"\x02"
TQ, GRACE = 10, 2.0
SETTINGS = Settings(
    time_quantum_s=TQ,
    anti_thrash=AntiThrash.ON,
    idle_release_ms=100,
    drop_grace_ms=int(GRACE * 1000),
)


def of(kind, actions):
    return [a for a in actions if isinstance(a, kind)]


def make(n_clients=3, gpus=(G0,), settings=SETTINGS):
    s = Scheduler(settings)
    for c in range(1, n_clients + 1):
        s.connect(c, pid=100 + c, uid=1000, gid=1000)
        s.hello(c, gpus, f"cmd{c}", now=0.0)
    return s


def grant_of(actions, client=None):
    grants = of(Grant, actions)
    assert len(grants) == 1, actions
    if client is not None:
        assert grants[0].client == client
    return grants[0]


# ---------------------------------------------------------------- hello and protocol order


def test_hello_sends_settings_and_logs_the_client():
    s = Scheduler(SETTINGS)
    s.connect(1, 11, 12, 13)
    actions = s.hello(1, (G0,), "python", 0.0)
    assert actions == [Greeted(1, 11, 12, 13, "python", (G0,)), SendSettings(1, SETTINGS)]


def test_second_hello_and_frames_before_hello_are_refused():
    s = Scheduler(SETTINGS)
    s.connect(1, 11, 0, 0)
    assert of(Refuse, s.request(1, G0, 0.0))
    assert of(Refuse, s.release(1, G0, 1, 0.0))
    assert of(Refuse, s.memory_report(1, G0, 1, 0))
    s.hello(1, (G0,), "x", 0.0)
    assert of(Refuse, s.hello(1, (G0,), "x", 0.0))


def test_a_client_may_name_at_most_max_gpus():
    s = Scheduler(SETTINGS, max_gpus_per_client=2)
    s.connect(1, 11, 0, 0)
    s.hello(1, (G0, G1), "x", 0.0)
    assert of(Refuse, s.request(1, b"\x09" * 16, 0.0))
    assert not of(Refuse, s.request(1, G1, 0.0))


# ---------------------------------------------------------------- FCFS, quantum, grace


def test_free_gpu_is_granted_at_once_exclusively():
    s = make()
    g = grant_of(s.request(1, G0, 5.0), 1)
    assert g.exclusive and g.lease == 1 and g.waited_s == 0.0 and g.pid == 101


def test_waiters_are_granted_first_come_first_served():
    s = make(4)
    lease = grant_of(s.request(1, G0, 0.0)).lease
    for position, c in enumerate((3, 2, 4), start=1):
        assert s.request(c, G0, 0.1 * position) == [Queued(c, 100 + c, G0, position)]
    holder = 1
    for expected in (3, 2, 4):
        actions = s.release(holder, G0, lease, 1.0)
        assert of(LockReleased, actions)[0].reason == "released"
        g = grant_of(actions, expected)
        holder, lease = expected, g.lease


def test_a_turn_granted_while_others_still_wait_ends_after_its_quantum():
    # Granted at a release with two waiting: the new turn's end is due at once (it was
    # left to the next event, and with none coming the third waited for good).
    s = make()
    lease = grant_of(s.request(1, G0, 0.0)).lease
    s.request(2, G0, 1.0)
    s.request(3, G0, 1.0)
    grant_of(s.release(1, G0, lease, 2.0), 2)
    assert s.next_deadline() == 2.0 + TQ
    assert of(AskToDrop, s.tick(2.0 + TQ))


def test_the_engines_batches_are_looked_at_once():
    s = make()
    s.decide_later = True
    assert s.request(1, G0, 0.0) == [] and s.request(2, G0, 0.0) == [] and s.undecided
    assert s.next_deadline() is None  # not looked at yet
    actions = s.decide_pending(0.0)
    assert grant_of(actions, 1) and of(Queued, actions) == [Queued(2, 102, G0, 1)]
    assert s.next_deadline() == TQ and not s.undecided and s.decide_pending(0.0) == []


def test_no_drop_request_while_nobody_waits():
    s = make()
    s.request(1, G0, 0.0)
    assert s.next_deadline() is None
    assert s.tick(TQ * 100) == []


def test_quantum_counts_from_the_grant_and_drop_then_grace_then_revoke():
    s = make()
    lease = grant_of(s.request(1, G0, 0.0)).lease
    s.request(2, G0, 3.0)
    assert s.next_deadline() == TQ
    assert s.tick(TQ - 0.001) == []
    drop = of(AskToDrop, s.tick(TQ))
    assert drop == [AskToDrop(1, 101, G0, lease, TQ)]
    assert s.next_deadline() == TQ + GRACE
    assert s.tick(TQ + GRACE - 0.001) == []
    actions = s.tick(TQ + GRACE)
    assert of(Revoke, actions) == [Revoke(1, 101, G0, lease, TQ + GRACE)]
    g = grant_of(actions, 2)
    assert g.waited_s == pytest.approx(TQ + GRACE - 3.0)
    assert s.next_deadline() is None


@pytest.mark.parametrize("leaves_by", ["withdrawing", "exiting"])
def test_holder_is_not_revoked_when_the_only_waiter_leaves_after_the_drop_request(leaves_by):
    s = make()
    lease = grant_of(s.request(1, G0, 0.0)).lease
    s.request(2, G0, 1.0)
    assert of(AskToDrop, s.tick(TQ))
    if leaves_by == "withdrawing":
        assert s.release(2, G0, 0, TQ + 0.1) == [Withdrawn(2, 102, G0)]
    else:
        assert s.disconnect(2, TQ + 0.1) == [Gone(2, 102, True)]
    assert s.next_deadline() is None  # no timer armed for a revoke that must not come
    assert s.tick(TQ + GRACE * 10) == []
    assert s.gpus[G0].holders[1].number == lease


def test_new_waiter_after_the_waiters_left_gets_an_overdue_holder_revoked_at_once():
    # The drop request stays pending: the holder has had its grace already.
    s = make()
    lease = grant_of(s.request(1, G0, 0.0)).lease
    s.request(2, G0, 1.0)
    s.tick(TQ)
    s.release(2, G0, 0, TQ + 0.1)
    actions = s.request(3, G0, TQ + GRACE * 10)
    assert of(Revoke, actions) == [Revoke(1, 101, G0, lease, TQ + GRACE * 10)]
    grant_of(actions, 3)


def test_new_waiter_within_the_grace_waits_for_the_original_deadline():
    s = make()
    grant_of(s.request(1, G0, 0.0))
    s.request(2, G0, 1.0)
    s.tick(TQ)
    s.release(2, G0, 0, TQ + 0.1)
    assert of(Queued, s.request(3, G0, TQ + 0.2))
    assert s.next_deadline() == TQ + GRACE
    grant_of(s.tick(TQ + GRACE), 3)


def test_holder_past_quantum_is_asked_to_drop_as_soon_as_someone_queues():
    s = make()
    s.request(1, G0, 0.0)
    actions = s.request(2, G0, TQ + 5)
    assert of(AskToDrop, actions) and of(Queued, actions)


def test_release_after_drop_reports_drop_to_release_time_and_grants_next():
    s = make()
    lease = grant_of(s.request(1, G0, 0.0)).lease
    s.request(2, G0, 1.0)
    s.tick(TQ)
    actions = s.release(1, G0, lease, TQ + 0.5)
    released = of(LockReleased, actions)[0]
    assert released.drop_to_release_s == pytest.approx(0.5) and released.held_s == pytest.approx(
        TQ + 0.5
    )
    grant_of(actions, 2)


def test_stale_release_after_revoke_is_ignored():
    s = make()
    old = grant_of(s.request(1, G0, 0.0)).lease
    s.request(2, G0, 0.0)
    s.tick(TQ)
    new = grant_of(s.tick(TQ + GRACE), 2).lease
    actions = s.release(1, G0, old, TQ + GRACE + 0.1)
    assert of(Ignored, actions) and not of(Grant, actions)
    assert s.gpus[G0].holders[2].number == new


def test_release_with_a_wrong_lease_or_unknown_gpu_is_ignored():
    s = make()
    lease = grant_of(s.request(1, G0, 0.0)).lease
    assert of(Ignored, s.release(1, G0, lease + 7, 1.0))
    assert of(Ignored, s.release(1, b"\x07" * 16, lease, 1.0))
    assert 1 in s.gpus[G0].holders


def test_duplicate_requests_while_holding_or_waiting_are_ignored():
    s = make()
    s.request(1, G0, 0.0)
    assert of(Ignored, s.request(1, G0, 1.0))[0].reason == "duplicate request while holding"
    s.request(2, G0, 1.0)
    assert of(Ignored, s.request(2, G0, 2.0))[0].reason == "duplicate request while waiting"
    assert list(s.gpus[G0].waiters) == [2]


def test_waiter_can_withdraw_with_lease_zero():
    s = make()
    s.request(1, G0, 0.0)
    s.request(2, G0, 0.0)
    assert s.release(2, G0, 0, 1.0) == [Withdrawn(2, 102, G0)]
    assert not s.gpus[G0].waiters


def test_early_release_then_request_again_queues_behind_others():
    s = make()
    lease = grant_of(s.request(1, G0, 0.0)).lease
    s.request(2, G0, 0.5)
    grant_of(s.release(1, G0, lease, 1.0), 2)
    assert of(Queued, s.request(1, G0, 1.5))


# ---------------------------------------------------------------- disconnects and GPUs


def test_holder_disconnect_grants_the_next_waiter():
    s = make()
    lease = grant_of(s.request(1, G0, 0.0)).lease
    s.request(2, G0, 0.0)
    actions = s.disconnect(1, 2.0)
    assert of(LockReleased, actions)[0] == LockReleased(1, 101, G0, lease, 2.0, None, "disconnect")
    grant_of(actions, 2)
    assert actions[-1] == Gone(1, 101, True, 2.0)  # no GPU_USAGE from it: its 2 s held count
    assert s.disconnect(1, 3.0) == []  # twice is harmless


def test_waiter_disconnect_leaves_the_queue():
    s = make()
    lease = grant_of(s.request(1, G0, 0.0)).lease
    s.request(2, G0, 0.0)
    s.request(3, G0, 0.0)
    s.disconnect(2, 1.0)
    grant_of(s.release(1, G0, lease, 2.0), 3)


def test_all_queued_clients_and_the_holder_vanish_together():
    s = make(50)
    s.request(1, G0, 0.0)
    for c in range(2, 51):
        s.request(c, G0, 0.0)
    for c in range(1, 51):
        s.disconnect(c, 1.0)
    assert not s.clients and G0 not in s.gpus


def test_gpus_are_independent():
    s = make(2, gpus=(G0, G1))
    s.request(1, G0, 0.0)
    assert of(Queued, s.request(2, G0, 0.0))
    grant_of(s.request(2, G1, 0.0), 2)
    s.tick(TQ)  # client 1's quantum on G0 ends; G1 is untouched
    assert s.gpus[G1].holders[2].drop_requested_at is None


def test_gpus_learned_from_clients_are_forgotten_with_them_but_inventory_stays():
    s = Scheduler(SETTINGS)
    s.add_gpu(G1, "H100", 80 << 30)
    s.connect(1, 11, 0, 0)
    s.hello(1, (G0, G1), "x", 0.0)
    s.disconnect(1, 1.0)
    assert list(s.gpus) == [G1]
    snap = s.snapshot(1.0)
    assert snap.gpus[0].name == "H100" and snap.gpus[0].memory_total_bytes == 80 << 30


# ---------------------------------------------------------------- anti-thrash

OFF = SETTINGS.replaced(anti_thrash=AntiThrash.OFF)


def test_anti_thrash_off_grants_everyone_shared_with_no_quantum():
    s = make(3, settings=OFF)
    for c in (1, 2, 3):
        assert not grant_of(s.request(c, G0, 0.0), c).exclusive
    assert s.next_deadline() is None and s.tick(TQ * 10) == []


def test_switching_off_grants_the_waiters_and_cancels_pending_drops():
    s = make()
    s.request(1, G0, 0.0)
    s.request(2, G0, 0.0)
    s.tick(TQ)  # client 1 asked to drop
    actions = s.change_settings(OFF, TQ + 0.1)
    assert actions[0] == SendSettings(None, OFF)
    assert not grant_of(actions, 2).exclusive
    assert s.next_deadline() is None
    assert not of(Revoke, s.tick(TQ + GRACE * 10))


def test_switching_on_drains_shared_holders_before_an_exclusive_grant():
    s = make(3, settings=OFF)
    leases = {c: grant_of(s.request(c, G0, 0.0)).lease for c in (1, 2, 3)}
    actions = s.change_settings(SETTINGS, 1.0)
    assert sorted(a.client for a in of(AskToDrop, actions)) == [1, 2, 3]
    s.release(1, G0, leases[1], 1.1)
    assert of(Queued, s.request(1, G0, 1.2))  # still shared by 2 and 3: wait
    assert not of(Grant, s.release(2, G0, leases[2], 1.3))
    actions = s.tick(1.0 + GRACE)  # 3 ignored the drop: revoked, then 1 alone
    assert of(Revoke, actions)[0].client == 3
    assert grant_of(actions, 1).exclusive


def test_switching_on_with_nobody_waiting_and_everyone_releasing_leaves_the_gpu_free():
    s = make(2, settings=OFF)
    leases = {c: grant_of(s.request(c, G0, 0.0)).lease for c in (1, 2)}
    s.change_settings(SETTINGS, 1.0)
    for c in (1, 2):
        s.release(c, G0, leases[c], 1.5)
    assert not s.gpus[G0].holders
    assert grant_of(s.request(2, G0, 2.0), 2).exclusive


def test_switching_on_with_nobody_waiting_revokes_no_one_until_someone_waits():
    s = make(3, settings=OFF)
    leases = {c: grant_of(s.request(c, G0, 0.0)).lease for c in (1, 2)}
    s.change_settings(SETTINGS, 1.0)
    assert s.next_deadline() is None
    assert s.tick(1.0 + GRACE * 10) == []
    assert set(s.gpus[G0].holders) == {1, 2}
    # The first waiter makes room: the overdue shared holders go, it gets the GPU alone.
    actions = s.request(3, G0, 1.0 + GRACE * 10)
    assert sorted(r.lease for r in of(Revoke, actions)) == sorted(leases.values())
    assert grant_of(actions, 3).exclusive


def test_lone_exclusive_holder_keeps_its_lease_across_off_and_on():
    s = make()
    s.request(1, G0, 0.0)
    s.change_settings(OFF, 1.0)
    actions = s.change_settings(SETTINGS, 2.0)
    assert not of(AskToDrop, actions)
    assert 1 in s.gpus[G0].holders


def test_shorter_quantum_applies_to_the_current_holder():
    s = make()
    s.request(1, G0, 0.0)
    s.request(2, G0, 0.0)
    actions = s.change_settings(SETTINGS.replaced(time_quantum_s=1), 5.0)
    assert of(AskToDrop, actions)


# ---------------------------------------------------------------- snapshot


def test_snapshot_reports_states_memory_and_holding_time():
    s = make(3, gpus=(G0,))
    s.request(1, G0, 0.0)
    s.request(2, G0, 0.0)
    s.memory_report(1, G0, 300, 12)
    s.tick(TQ)
    snap = s.snapshot(TQ + 1)
    assert snap.gpus[0].holder_pids == (101,) and snap.gpus[0].queue_pids == (102,)
    by_pid = {c.pid: c.gpus[0] for c in snap.clients}
    assert by_pid[101].state == "draining" and by_pid[101].allocated_bytes == 312
    assert by_pid[101].holding_seconds == pytest.approx(TQ + 1)
    assert by_pid[102].state == "waiting" and by_pid[103].state == "idle"


def test_memory_report_beyond_64_bits_is_refused_and_keeps_the_last_good_total():
    s = make(1)
    s.memory_report(1, G0, 2**64 - 2, 1)
    assert (
        of(Refuse, s.memory_report(1, G0, 2**64 - 1, 1))[0].reason
        == f"MEMORY_REPORT of {2**64} bytes does not fit in 64 bits"
    )
    assert s.snapshot(0.0).clients[0].gpus[0].allocated_bytes == 2**64 - 1


def test_clients_that_never_said_hello_are_not_in_the_snapshot():
    s = Scheduler(SETTINGS)
    s.connect(1, 11, 0, 0)
    assert s.snapshot(0.0).clients == ()


# ---------------------------------------------------------------- random walks


@pytest.mark.parametrize("seed", range(40))
def test_random_event_sequences_keep_the_invariants(seed):
    """Any interleaving: one exclusive holder at most, leases unique, nobody both
    holds and waits, nothing overdue after a tick, and no waiter starves once holders stop;
    also while one GPU switches modes and quanta of its own."""
    rng = random.Random(seed)
    s = Scheduler(SETTINGS)
    s.add_gpu(G0, "big", 80 << 30)
    s.add_gpu(G1, "small", 8 << 30)
    now, next_client, live, leases = 0.0, 1, {}, set()
    for _ in range(400):
        now += rng.choice((0.0, 0.01, 0.5, 3.0, TQ))
        event = rng.random()
        if event < 0.1 or not live:
            s.connect(next_client, next_client, 0, 0, now)
            s.hello(next_client, (G0, G1), "x", now, features=rng.choice((0, 1)))
            live[next_client] = {}
            next_client += 1
            continue
        client = rng.choice(list(live))
        gpu = rng.choice((G0, G1))
        if event < 0.45:
            actions = s.request(client, gpu, now)
        elif event < 0.7:
            held = s.gpus[gpu].holders.get(client)
            actions = s.release(
                client, gpu, held.number if held and rng.random() < 0.9 else rng.randrange(5), now
            )
        elif event < 0.78:
            actions = s.disconnect(client, now)
            del live[client]
        elif event < 0.83:
            # Node-wide, and G1 (NVML's GPU 1) with a mode and quantum of its own or not.
            settings = SETTINGS.replaced(anti_thrash=rng.choice(list(AntiThrash)))
            if rng.random() < 0.5:
                settings = settings.with_gpu_overrides(
                    [
                        (
                            "1",
                            GpuOverrides(
                                time_quantum_s=rng.choice((None, 1, TQ)),
                                anti_thrash=rng.choice([None, *AntiThrash]),
                            ),
                        )
                    ]
                )
            actions = s.change_settings(settings, now)
        elif event < 0.86:
            # Reports that make the GPU's memory fit (auto side by side) or not.
            actions = s.memory_report(client, gpu, rng.choice((0, 1 << 30, 1 << 40)), 0, now)
        else:
            deadline = s.next_deadline()
            if deadline is not None and rng.random() < 0.5:
                now = max(now, deadline)
            actions = s.tick(now)
            # tick() leaves nothing overdue behind.
            assert s.next_deadline() is None or s.next_deadline() > now
        for g in of(Grant, actions):
            assert g.lease not in leases
            leases.add(g.lease)
        for r in of(Revoke, actions):
            # A revoke only ever makes room for someone who waits.
            assert s.gpus[r.gpu].waiters or any(g.gpu == r.gpu for g in of(Grant, actions)), actions
        _check_invariants(s, now)
    # Drain: every holder releases (or is revoked by time); every waiter ends up granted.
    for _ in range(1000):
        waiting = any(g.waiters for g in s.gpus.values())
        if not waiting:
            break
        for gpu in s.gpus.values():
            for client, held in list(gpu.holders.items()):
                s.release(client, gpu.uuid, held.number, now)
        now += GRACE + TQ
        s.tick(now)
        _check_invariants(s, now)
    assert not any(g.waiters for g in s.gpus.values())


def _check_invariants(s: Scheduler, now: float) -> None:
    for gpu in s.gpus.values():
        # Each GPU by the mode it runs by: the node's, or its own.
        on = gpu.settings.anti_thrash is AntiThrash.ON
        off = gpu.settings.anti_thrash is AntiThrash.OFF
        auto = gpu.settings.anti_thrash is AntiThrash.AUTO
        if auto:
            staying = [c for c, h in gpu.holders.items() if h.drop_requested_at is None]
            # Two that keep the GPU busy take turns where turns pay, and a waiter waits only
            # for a holder in its way, or behind one that has waited a quantum (work-
            # conserving).  Uses move between events (a report decides nothing): where
            # either does not hold now, the GPU is looked at again within CHECK_S.
            quantum = gpu.settings.time_quantum_s
            overdue = any(now >= w.requested_at + quantum for w in gpu.waiters.values())
            if len([c for c in staying if s.policy.saturating(gpu, c, now)]) > 1 or any(
                not overdue and not s.policy.in_the_way(gpu, c, now) for c in gpu.waiters
            ):
                assert gpu.deadline is not None and gpu.deadline <= now + CHECK_S
            if not s.policy.fits(gpu, staying, keeping=True):
                # What runs at once does not fit: all but the first granted are on their
                # way out, but for those whose going would free nothing (no managed memory).
                assert [c for c in staying[1:] if s.clients[c].managed.get(gpu.uuid, 0)] == []
        assert not set(gpu.holders) & set(gpu.waiters)
        exclusive = [h for h in gpu.holders.values() if h.mode == "exclusive"]
        if on and len(gpu.holders) > 1:
            # Only while draining a switch back on: everyone has been asked to drop.
            assert all(h.drop_requested_at is not None for h in gpu.holders.values())
        assert (
            len(exclusive) <= 1
            or off
            or all(h.drop_requested_at is not None for h in gpu.holders.values())
        )
        if on and gpu.waiters:
            assert gpu.holders, "a waiter with a free GPU"
        if off:
            assert not gpu.waiters
        for client in list(gpu.holders) + list(gpu.waiters):
            assert client in s.clients
