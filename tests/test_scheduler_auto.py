"""The core's anti-thrash auto and usage-fair turns, and its bounds: time is an argument.

tests/test_scheduler.py covers on and off, which auto leaves unchanged."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from nvshare_agent import memory_fit
from nvshare_agent.actions import (
    AskToDrop,
    Gone,
    Grant,
    ModeChanged,
    Queued,
    Refuse,
    Revoke,
)
from nvshare_agent.core_state import FEATURE_USAGE
from nvshare_agent.lock_rules import (
    DRAIN_MS,
    HOLDS_PROVEN_S,
    LIGHT_FLOOR,
    LIGHT_TURN_PROOF_S,
    WINDOW_IDLE_MS,
)
from nvshare_agent.scheduler import (
    FEATURE_YIELD,
    LIGHT_CHECK_S,
    MAX_LEARNED_GPUS_PER_UID,
    YIELD_IDLE_MS,
    Scheduler,
)
from nvshare_agent.settings import AntiThrash, GpuOverrides, Settings
from nvshare_agent.usage import USAGE_WINDOW_S, YOUNG_FLOOR_S, UsageMeter

G0, G1 = b"\x00" * 15 + b"\x01", b"\x00" * 15 + b"\x02"
GIB = 1 << 30
TQ, GRACE, MIN_SLICE, LIGHT_WAIT = 30, 5.0, 0.05, 0.1
# A light waiter that cannot run beside the turn: the turn is asked to drop this long
# after it asked (its drain then fits in light_wait_ms).
BEFORE_DRAIN = LIGHT_WAIT - DRAIN_MS / 1000
AUTO = Settings(
    time_quantum_s=TQ,
    anti_thrash=AntiThrash.AUTO,
    idle_release_ms=1000,
    drop_grace_ms=int(GRACE * 1000),
    min_slice_ms=int(MIN_SLICE * 1000),
    light_wait_ms=int(LIGHT_WAIT * 1000),
)
CAPACITY = 80 * GIB
LINE = CAPACITY - memory_fit.reserve(CAPACITY)  # demand up to here fits
BAND = memory_fit.band(CAPACITY)


def of(kind, actions):
    return [a for a in actions if isinstance(a, kind)]


def one(kind, actions, client=None):
    found = [a for a in of(kind, actions) if client is None or a.client == client]
    assert len(found) == 1, actions
    return found[0]


def make(
    n_clients=3,
    settings=AUTO,
    capacity=CAPACITY,
    features=FEATURE_YIELD,
    hello_at=0.0,
    separate_users=False,
):
    """hello_at: when the clients came (a newcomer's use is read over its stay: usage.py).
    Clients are one user's (one share group), or each its own."""
    s = Scheduler(settings)
    if capacity:
        s.add_gpu(G0, "GPU", capacity)
    for c in range(1, n_clients + 1):
        uid = 1000 + c if separate_users else 1000
        s.connect(c, pid=100 + c, uid=uid, gid=1000, now=hello_at)
        s.hello(c, (G0,), f"cmd{c}", now=hello_at, features=features)
    return s


def hold_for(s, client, seconds, start):
    """client asks at `start`, gets the GPU, and releases busy `seconds` later."""
    grant = one(Grant, s.request(client, G0, start))
    s.release(client, G0, grant.lease, start + seconds)
    return start + seconds


def spin_guarded_tick(s: Scheduler):
    """s.tick, failing rather than hanging when it spins: a GPU's deadline that the
    rules do not act on comes back at once from the heap, for ever."""
    update = s._update
    updates_in_tick: list[int] = []

    def counted_update(gpu, now, actions):
        if updates_in_tick:
            updates_in_tick[0] += 1
            assert updates_in_tick[0] < 100, f"tick({now}) spins on {gpu}"
        update(gpu, now, actions)

    s._update = counted_update  # type: ignore[method-assign]

    def tick(at: float) -> list:
        updates_in_tick[:] = [0]
        try:
            actions = s.tick(at)
        finally:
            updates_in_tick.clear()
        assert s.next_deadline() is None or s.next_deadline() > at, "tick left work overdue"
        return actions

    return tick


# ---------------------------------------------------------------- usage


def test_usage_counts_busy_time_in_a_decaying_window():
    meter = UsageMeter()  # here long before: no newcomer's weighting
    meter.start(0.0)
    assert meter.at(USAGE_WINDOW_S) == pytest.approx(1 - math.exp(-1))
    meter.stop(USAGE_WINDOW_S)
    assert meter.at(2 * USAGE_WINDOW_S) == pytest.approx((1 - math.exp(-1)) * math.exp(-1))


def test_a_newcomer_counts_its_gpu_time_over_its_stay_not_the_whole_window():
    trainer, notebook = UsageMeter(since=0.0), UsageMeter(since=0.0)
    trainer.report(1.0, 1.0)  # one second at full tilt since it came
    assert trainer.at(1.0) == pytest.approx((1 - math.exp(-0.1)) / (1 - math.exp(-0.5)))
    assert trainer.at(1.0) > 2 * LIGHT_FLOOR  # busy at once, not light for seconds
    notebook.report(1.0, 0.15)  # its first 150 ms cell
    assert notebook.at(1.0) < 0.5 * LIGHT_FLOOR
    # Once here for longer than the window, the plain decaying figure.
    old = UsageMeter()
    old.report(1.0, 1.0)
    later = 30.0
    assert trainer.at(later) == pytest.approx(
        trainer.at(1.0) * (1 - math.exp(-0.5)) * math.exp(-2.9) / (1 - math.exp(-3.0)), rel=1e-9
    )
    assert old.at(later) == pytest.approx((1 - math.exp(-0.1)) * math.exp(-2.9))


def test_a_frozen_newcomer_thaws_at_the_figure_it_was_frozen_at():
    meter = UsageMeter(since=0.0)
    meter.report(1.0, 0.5)
    meter.freeze(1.0)
    frozen = meter.at(1.0)
    assert meter.at(20.0) == frozen  # waiting: no lighter for it
    meter.thaw(20.0)
    assert meter.at(20.0) == pytest.approx(frozen)


def test_the_idle_tail_of_a_hold_is_not_counted_as_use():
    bursty, busy = UsageMeter(), UsageMeter()
    bursty.start(0.0)
    bursty.stop(1.05, idle_s=1.0)  # a 50 ms burst, then a second idle before the release
    busy.start(0.0)
    busy.stop(0.05)
    assert bursty.at(2.0) == pytest.approx(busy.at(2.0))


# ---------------------------------------------------------------- memory fits: side by side


def test_two_clients_whose_memory_fits_are_both_granted_at_once():
    s = make()
    first = one(Grant, s.request(1, G0, 0.0))
    second = one(Grant, s.request(2, G0, 0.001))
    assert not first.exclusive and not second.exclusive
    assert first.release_when_idle and second.release_when_idle
    assert (first.role, second.role) == ("turn", "beside")
    assert s.snapshot(0.0).gpus[0].mode == "shared"


def test_a_light_client_runs_beside_a_busy_one_at_once():
    s = make()
    now = hold_for(s, 1, 60.0, 0.0)  # a trainer: a minute of use
    trainer = one(Grant, s.request(1, G0, now))
    notebook = one(Grant, s.request(2, G0, now + 0.5))
    assert notebook.role == "beside" and notebook.waited_s == 0.0
    assert trainer.client == 1 and 1 in s.gpus[G0].holders


def test_busy_clients_take_turns_of_a_quantum_while_memory_fits():
    s = make()
    now = 0.0
    for client in (1, 2):  # both have trained a while already, 2 last
        now = hold_for(s, client, 60.0, now)
    first = one(Grant, s.request(1, G0, now))
    actions = s.request(2, G0, now + 1)
    assert of(Queued, actions) and not of(Grant, actions)
    # 2 has used the GPU more of late: no better claim, no ask to release once idle.
    assert not of(AskToDrop, actions)
    # Nor later, when 1's use passes 2's: between equals a turn lasts its quantum (a
    # yield at the first 50 ms pause once cut turns short by chance: issue 35's b.).
    t = now + 1
    while True:
        t = s.next_deadline()
        drops = of(AskToDrop, s.tick(t))
        if drops:
            break
    assert t == pytest.approx(now + TQ)
    assert (drops[0].client, drops[0].when_idle_ms) == (1, 0)
    second = one(Grant, s.release(1, G0, first.lease, now + TQ + 0.05))
    assert second.client == 2 and second.role == "turn"


def test_a_client_beside_the_turn_is_asked_to_drop_once_it_is_no_longer_light():
    s = make()
    one(Grant, s.request(1, G0, 0.0))
    beside = one(Grant, s.request(2, G0, 0.0))  # two new trainers: the second goes beside at first
    dropped_at = None
    now = 0.0
    while dropped_at is None and now < 10:
        now = s.next_deadline()
        assert now is not None and now <= 10
        drops = of(AskToDrop, s.tick(now))
        if drops:
            assert drops[0].client == 2 and drops[0].lease == beside.lease
            dropped_at = now
    # It passed twice the floor after ~0.8 s of running beside (a newcomer's figure is
    # over its stay, at least YOUNG_FLOOR_S: usage.py).
    young = 1 - math.exp(-YOUNG_FLOOR_S / USAGE_WINDOW_S)
    passed_at = -USAGE_WINDOW_S * math.log(1 - 0.2 * young)
    assert dropped_at == pytest.approx(passed_at, abs=LIGHT_CHECK_S + 1e-9)
    s.release(2, G0, beside.lease, now + 0.05)
    assert of(Queued, s.request(2, G0, now + 0.06)), "it now waits for the turn"


def two_gpus_with_a_trainer_on_each_and_a_pipeline_over_both():
    """Clients 1 and 2 train on G0 and G1; 3 is a pipeline over both.  New, it runs beside
    each turn; no longer light on G0 at 5 s, it asks for G0's turn again while it still
    holds G1, then leaves G1 too (at 12 s); its turn on G0 comes at 20 s (1 releases).
    Returns the core and that turn's grant."""
    s = Scheduler(AUTO)
    s.add_gpu(G0, "GPU0", CAPACITY)
    s.add_gpu(G1, "GPU1", CAPACITY)
    for c, gpus in ((1, (G0,)), (2, (G1,)), (3, (G0, G1))):
        s.connect(c, 100 + c, 1000, 1000)
        s.hello(c, gpus, f"cmd{c}", 0.0, features=FEATURE_YIELD)
    first = one(Grant, s.request(1, G0, 0.0))
    one(Grant, s.request(2, G1, 0.0))
    stage0 = one(Grant, s.request(3, G0, 0.0))
    stage1 = one(Grant, s.request(3, G1, 0.01))
    assert (stage0.role, stage1.role) == ("beside", "beside")
    s.release(3, G0, stage0.lease, 5.0)
    assert of(Queued, s.request(3, G0, 5.0))
    s.release(3, G1, stage1.lease, 12.0)  # its use of G1 is a trainer's now
    turn = one(Grant, s.release(1, G0, first.lease, 20.0), client=3)
    assert turn.role == "turn"
    return s, turn


def test_a_client_whose_turn_others_want_on_one_gpu_runs_beside_the_turn_on_its_other():
    # A pipeline over two GPUs needs both at once: waiting a quantum on G1 would leave its
    # turn on G0, which 1 waits for, idle.  Its use of G1 is a trainer's, yet it goes beside
    # 2's turn there...
    s, turn = two_gpus_with_a_trainer_on_each_and_a_pipeline_over_both()
    s.request(1, G0, 20.01)
    beside = one(Grant, s.request(3, G1, 20.02))
    assert (beside.role, beside.exclusive) == ("beside", False)
    # ... and stays while that turn lasts, past any light check.
    for now in (21.0, 25.0, 29.9):
        assert not of(AskToDrop, s.tick(now))
    # Its turn on G0 over, it is busy work beside 2's turn: asked to leave at the next look.
    drop = one(AskToDrop, s.tick(20.0 + TQ), client=3)
    assert drop.gpu == G0
    s.release(3, G0, turn.lease, 20.0 + TQ + 0.01)
    later = 20.0 + TQ + 0.01 + LIGHT_CHECK_S
    assert one(AskToDrop, s.tick(later), client=3).reason == "no longer light"


def test_a_turn_nobody_else_wants_makes_no_one_light_elsewhere():
    s, turn = two_gpus_with_a_trainer_on_each_and_a_pipeline_over_both()
    # Nobody waits for G0: holding it idle while waiting for G1's turn wastes nothing.
    assert of(Queued, s.request(3, G1, 20.02))


def test_a_client_working_on_several_gpus_is_not_asked_to_release_when_idle():
    # Each stage of a pipeline is idle while the other works: no sign that it is done.  It
    # is not asked in the moment before it asks for G1 again either (the ask could not be
    # taken back once G1 is granted): it held G1 while it waited for G0.
    s, turn = two_gpus_with_a_trainer_on_each_and_a_pipeline_over_both()
    asked = s.request(1, G0, 20.01)  # 1 waits for G0 again at once
    beside = one(Grant, s.request(3, G1, 20.02))
    asked += s.release(3, G1, beside.lease, 21.0) + s.tick(21.0)
    assert not [a for a in of(AskToDrop, asked) if a.when_idle_ms], asked


def test_a_gpu_used_long_ago_does_not_make_a_client_work_across_gpus():
    # PyTorch's context on cuda:0 at start, then training on cuda:1: a client like any.
    s = Scheduler(AUTO)
    s.add_gpu(G0, "GPU0", CAPACITY)
    s.add_gpu(G1, "GPU1", CAPACITY)
    s.connect(1, 101, 1000, 1000)
    s.hello(1, (G0, G1), "cmd1", 0.0, features=FEATURE_YIELD)
    stray = one(Grant, s.request(1, G0, 0.0))
    s.release(1, G0, stray.lease, 1.0, idle_ms=1000)
    one(Grant, s.request(1, G1, 10.0))
    assert s.gpus[G1].holders[1].across_gpus is False
    # Held until just before it asked: it works across GPUs.
    held = one(Grant, s.request(1, G0, 10.5))
    s.release(1, G0, held.lease, 11.0)
    s.release(1, G1, s.gpus[G1].holders[1].number, 11.2)
    one(Grant, s.request(1, G1, 11.5))
    assert s.gpus[G1].holders[1].across_gpus is True


def test_an_older_shim_is_never_asked_to_release_when_idle():
    s = make(features=0)
    now = hold_for(s, 1, 60.0, 0.0)
    now = hold_for(s, 2, 60.0, now)
    s.request(1, G0, now)
    assert not of(AskToDrop, s.request(2, G0, now + 1))


# ---------------------------------------------------------------- switching on memory reports


def test_memory_of_a_client_that_does_not_run_does_not_stop_those_that_do():
    s = make(hello_at=-60.0)  # here a while: holding a second is not busy yet
    a, b = one(Grant, s.request(1, G0, 0.0)), one(Grant, s.request(2, G0, 0.0))
    actions = s.memory_report(3, G0, 78 * GIB, 0, now=1.0)
    switch = one(ModeChanged, actions)
    assert switch.mode == "exclusive" and switch.demand_bytes > LINE
    assert not of(AskToDrop, actions), "3 does not run: its pages make room as needed"
    # 3 is light, but its memory does not fit beside those running: it waits, and the
    # turn is cut short in time for a window within light_wait_ms.
    actions = s.request(3, G0, 1.1)
    assert of(Queued, actions)
    assert one(AskToDrop, actions, client=1).when_idle_ms == YIELD_IDLE_MS  # a yield first
    assert s.next_deadline() == pytest.approx(1.1 + BEFORE_DRAIN)
    assert one(AskToDrop, s.tick(1.1 + BEFORE_DRAIN)).reason == "light work waits"
    # The one beside is in 3's way too, and 3's light wait is up: it goes at once, as the
    # turn did (asked only to go once idle, a lease never idle kept light work waiting).
    window = one(AskToDrop, s.release(1, G0, a.lease, 1.2), client=2)
    assert (window.when_idle_ms, window.reason) == (0, "light work waits")
    grant = one(Grant, s.release(2, G0, b.lease, 1.3))
    assert grant.client == 3 and not grant.exclusive and grant.role == "beside"
    assert s.snapshot(1.3).gpus[0].mode == "exclusive"


def test_a_report_that_does_not_fit_asks_the_newest_lease_beside_the_turn_to_drop():
    s = make(hello_at=-60.0)  # here a while: holding a second is not busy yet
    one(Grant, s.request(1, G0, 0.0))
    one(Grant, s.request(2, G0, 0.0))
    one(Grant, s.request(3, G0, 0.0))
    contexts = 3 * memory_fit.CONTEXT_ESTIMATE_BYTES  # they stay, running or not
    s.memory_report(3, G0, GIB, 0, now=0.5)
    # 2 runs, so its memory must fit with the others': without 3's it does.
    actions = s.memory_report(2, G0, LINE - contexts - GIB + 1, 0, now=1.0)
    drops = of(AskToDrop, actions)
    assert [(d.client, d.reason) for d in drops] == [(3, "memory does not fit")]
    assert not of(AskToDrop, s.memory_report(2, G0, LINE - contexts, 0, now=1.1))
    drops = of(AskToDrop, s.memory_report(2, G0, LINE - contexts + 1, 0, now=1.2))
    assert [(d.client, d.reason) for d in drops] == [(2, "memory does not fit")]


def test_memory_fits_again_only_below_the_band():
    s = make(n_clients=1)
    s.request(1, G0, 0.0)  # its context counts from now on
    context = memory_fit.CONTEXT_ESTIMATE_BYTES
    assert one(ModeChanged, s.memory_report(1, G0, LINE - context + 1, 0, now=1)).mode == (
        "exclusive"
    )
    assert not of(ModeChanged, s.memory_report(1, G0, LINE - context, 0, now=2))
    assert not of(ModeChanged, s.memory_report(1, G0, LINE - context - BAND + 1, 0, now=3))
    back = one(ModeChanged, s.memory_report(1, G0, LINE - context - BAND, 0, now=4))
    assert back.mode == "shared" and back.capacity_bytes == CAPACITY


def test_processes_outside_nvshare_count_against_the_gpu():
    s = make(n_clients=1)
    s.request(1, G0, 0.0)
    actions = s.nvml_processes({G0: {101: 600 << 20, 999: 79 * GIB}}, now=1.0)
    assert one(ModeChanged, actions).mode == "exclusive"
    # Client 101's own NVML figure replaced the context estimate.
    assert s.gpus[G0].demand_bytes == (600 << 20) + 79 * GIB


def test_unknown_capacity_takes_exclusive_turns_until_a_shim_reports_it():
    s = make(capacity=0)
    assert one(Grant, s.request(1, G0, 0.0)).role == "turn"
    assert of(Queued, s.request(2, G0, 0.0))  # unknown capacity: nothing fits beside
    actions = s.gpu_memory(1, G0, CAPACITY, now=1.0)
    switch = one(ModeChanged, actions)
    assert switch.mode == "shared" and switch.capacity_bytes == CAPACITY
    assert one(Grant, actions).client == 2
    assert one(Grant, s.tick(1.0) + s.request(3, G0, 1.0)).client == 3  # beside the holder


def test_the_smallest_reported_capacity_wins():
    s = make(capacity=0)
    s.gpu_memory(1, G0, CAPACITY, now=0)
    s.gpu_memory(2, G0, 1 * GIB, now=0)
    assert s.gpus[G0].capacity_bytes == 1 * GIB


def test_memory_limit_caps_the_capacity():
    s = make()
    for client in (1, 2):
        s.memory_report(client, G0, 256 << 20, 0, 0.0)
        s.request(client, G0, 0.0)
    actions = s.change_settings(AUTO.replaced(memory_limit_bytes=1 * GIB), 1.0)
    switch = one(ModeChanged, actions)
    assert (switch.mode, switch.capacity_bytes) == ("exclusive", 1 * GIB)
    assert {d.client for d in of(AskToDrop, actions)} == {2}  # beside the turn, which stays


# ---------------------------------------------------------------- memory does not fit: turns


def exclusive_gpu(n_clients=3, **settings):
    # 512 MiB less the reserve cannot hold even one context: never fits.
    return make(n_clients, settings=AUTO.replaced(memory_limit_bytes=512 << 20, **settings))


def test_a_light_waiter_gets_the_gpu_within_its_light_wait():
    s = exclusive_gpu()
    trainer = one(Grant, s.request(1, G0, 0.0))
    assert trainer.role == "turn"
    actions = s.request(2, G0, 0.03)  # a notebook asks 30 ms into the trainer's turn
    assert of(Queued, actions)
    # The drop comes DRAIN_MS before its light wait is up, so that the drain fits in it.
    assert s.next_deadline() == pytest.approx(0.03 + BEFORE_DRAIN)
    drop = one(AskToDrop, s.tick(0.03 + BEFORE_DRAIN))
    assert (drop.client, drop.when_idle_ms, drop.reason) == (1, 0, "light work waits")
    notebook = one(Grant, s.release(1, G0, trainer.lease, 0.03 + LIGHT_WAIT))
    assert notebook.client == 2 and notebook.waited_s == pytest.approx(LIGHT_WAIT)
    assert notebook.role == "beside"  # a window between the trainer's turns


def test_light_work_waits_out_the_turns_minimum_slice_and_is_served_together():
    # Light work that keeps coming would otherwise cut every turn short at once.
    s = exclusive_gpu(n_clients=3, min_slice_ms=300)
    trainer = one(Grant, s.request(1, G0, 0.0))
    s.request(2, G0, 0.01)
    assert not s.tick(0.01 + LIGHT_WAIT)  # its use stops decaying: nothing else
    assert s.next_deadline() == pytest.approx(0.3)  # not 0.01 + BEFORE_DRAIN
    s.request(3, G0, 0.2)
    assert one(AskToDrop, s.tick(0.3)).reason == "light work waits"
    first = one(Grant, s.release(1, G0, trainer.lease, 0.32))
    assert first.client == 2  # they do not fit together either (the limit is tiny)
    s.request(1, G0, 0.321)  # the trainer asks again at once
    second = one(Grant, s.release(2, G0, first.lease, 0.33, idle_ms=WINDOW_IDLE_MS))
    assert second.client == 3  # the same window: light work before the turn
    assert one(Grant, s.release(3, G0, second.lease, 0.34, idle_ms=WINDOW_IDLE_MS)).client == 1


def test_the_trainer_comes_back_once_the_notebook_goes_idle():
    s = exclusive_gpu()
    now = hold_for(s, 1, 60.0, 0.0)
    trainer = one(Grant, s.request(1, G0, now))
    s.request(2, G0, now + 1)  # held a second already: dropped at once
    notebook = one(Grant, s.release(1, G0, trainer.lease, now + 1.05))
    actions = s.request(1, G0, now + 1.06)  # the trainer asks again right away
    assert of(Queued, actions)
    yield_ask = one(AskToDrop, actions)
    assert (yield_ask.client, yield_ask.when_idle_ms) == (2, WINDOW_IDLE_MS)  # at once
    back = one(Grant, s.release(2, G0, notebook.lease, now + 1.2, idle_ms=WINDOW_IDLE_MS))
    assert back.client == 1


def test_a_turn_marks_whoever_does_not_fit_beside_it_displaced_and_a_window_does_not():
    # The grant's DISPLACED makes the shim prefetch however short the absence was:
    # another's turn alone on the GPU may have pushed its pages to the host.
    s = exclusive_gpu()
    now = hold_for(s, 1, 60.0, 0.0)  # a trainer, busy a minute
    trainer = one(Grant, s.request(1, G0, now))
    assert trainer.role == "turn" and not trainer.displaced  # nobody else has run
    s.request(2, G0, now + 1)
    notebook = one(Grant, s.release(1, G0, trainer.lease, now + 1.05))
    assert notebook.role == "beside" and not notebook.displaced  # nothing on the GPU before
    s.request(1, G0, now + 1.06)
    back = one(Grant, s.release(2, G0, notebook.lease, now + 1.1, idle_ms=WINDOW_IDLE_MS))
    # A window is short and small: faults bring back the little it pushed out, where a
    # prefetch of the trainer's resident memory would cost ~0.7 ms a GiB at every window.
    assert (back.client, back.role, back.displaced) == (1, "turn", False)
    s.request(2, G0, now + 2)
    again = one(Grant, s.release(1, G0, back.lease, now + 2.05))
    assert again.client == 2 and again.displaced  # the trainer's turn came between


def test_turns_displace_each_other_only_where_memory_does_not_fit():
    for limit, displaced in ((0, False), (512 << 20, True)):
        s = make(2, settings=AUTO.replaced(anti_thrash=AntiThrash.ON, memory_limit_bytes=limit))
        for client in (1, 2):
            s.memory_report(client, G0, GIB, 0, now=0.0)
        first = one(Grant, s.request(1, G0, 0.0))
        s.request(2, G0, 0.1)
        second = one(Grant, s.release(1, G0, first.lease, 0.2))
        s.request(1, G0, 0.3)
        third = one(Grant, s.release(2, G0, second.lease, 0.4))
        assert (second.client, third.client) == (2, 1)
        # 2 had its memory on the GPU before 1's first turn, 1 before 2's.
        assert (first.displaced, second.displaced, third.displaced) == (False, *[displaced] * 2)


def test_waiters_are_served_least_recent_use_first():
    # Busy waiters, all past the light floor (light work under it takes the turn only
    # when no busy work waits: test_scheduler_mix.py).
    s = exclusive_gpu(n_clients=4)
    now = 0.0
    for client, seconds in ((2, 10.0), (3, 3.0), (4, 6.0)):
        now = hold_for(s, client, seconds, now)
    holder = one(Grant, s.request(1, G0, now))
    for client in (2, 3, 4):
        s.request(client, G0, now + 0.01 * client)
    order = []
    lease = holder.lease
    t = now + 1
    holder_client = 1
    for _ in range(3):
        grant = one(Grant, s.release(holder_client, G0, lease, t))
        order.append(grant.client)
        holder_client, lease = grant.client, grant.lease
        t += 0.2
    assert order == [3, 2, 4]  # uses 0.14, 0.26, 0.45 (4 held last and longest)


def test_a_waiter_that_waited_a_quantum_goes_before_lighter_ones():
    s = exclusive_gpu(n_clients=3)
    now = hold_for(s, 2, 60.0, 0.0)  # client 2 is busy: the heaviest
    holder = one(Grant, s.request(1, G0, now))
    s.request(2, G0, now)
    t = now + TQ  # quantum: the holder is asked to drop, client 2 has waited a quantum
    s.tick(t)
    s.request(3, G0, t + 0.01)  # light, but client 2 starves
    grant = one(Grant, s.release(1, G0, holder.lease, t + 0.02))
    assert grant.client == 2


def test_min_slice_zero_and_long_are_both_allowed():
    for ms in (0, 10_000):
        assert AUTO.replaced(min_slice_ms=ms).min_slice_ms == ms


# ---------------------------------------------------------------- the starvation bound


@pytest.mark.parametrize("seed", range(30))
def test_no_waiter_waits_longer_than_the_bound_under_a_random_walk(seed):
    """Clients that hold briefly or for long, ignore drops (and are revoked), come and
    go (an idle one leaves and a new one takes its place; a holder or a waiter crashes),
    while memory reports flip the GPU between fitting and not: every grant comes within
    quantum + n x (quantum + grace) of its request, and at every step no one still
    waiting has waited longer than that."""
    rng = random.Random(seed)
    tq, grace = 4, 1.0
    settings = AUTO.replaced(time_quantum_s=tq, drop_grace_ms=int(grace * 1000))
    s = Scheduler(settings)
    s.add_gpu(G0, "GPU", 8 * GIB)
    n = 6  # clients on the GPU at any time: one that goes is replaced at once
    now = 0.0
    # Per client: when it next acts, how it behaves, and since when it waits.
    plan: dict[int, dict] = {}
    ids = itertools.count(1)
    actions: list = []

    def join() -> None:
        c = next(ids)
        actions.extend(s.connect(c, 100 + c, 1000, 1000, now))
        features = FEATURE_YIELD if rng.random() < 0.7 else 0
        actions.extend(s.hello(c, (G0,), "x", now, features=features))
        plan[c] = {
            "at": now + rng.uniform(0, 2),
            "ignores_drops": rng.random() < 0.2,
            "waiting_since": None,
        }

    for _ in range(n):
        join()
    bound = tq + n * (tq + grace) + 1e-6
    worst, comings_and_goings = 0.0, 0
    tick = spin_guarded_tick(s)
    for _ in range(3000):
        due = s.next_deadline()
        at = min(p["at"] for p in plan.values())
        now = max(now, min(at, due) if due is not None else at)
        actions = tick(now)
        for c, p in list(plan.items()):
            if p["at"] > now:
                continue
            held = s.gpus[G0].holders.get(c)
            if rng.random() < 0.03:  # crashes, or leaves between its bursts
                actions += s.disconnect(c, now)
                del plan[c]
                join()
                comings_and_goings += 1
            elif held is not None:
                actions += s.release(c, G0, held.number, now, idle_ms=rng.choice((0, 50, 1000)))
                p["at"] = now + rng.choice((0.0, 0.01, 0.5, 3.0))
            elif c not in s.gpus[G0].waiters:
                actions += s.request(c, G0, now)
                p["at"] = now + 1e9 if rng.random() < 0.9 else now + rng.uniform(0, tq)
                p["waiting_since"] = now
            if c in plan and rng.random() < 0.05:
                actions += s.memory_report(c, G0, rng.choice((0, 1, 6)) * GIB, 0, now)
        for grant in of(Grant, actions):
            worst = max(worst, grant.waited_s)
            assert grant.waited_s <= bound, (grant, bound)
            if grant.client not in plan:  # granted, then gone in the same step
                continue
            p = plan[grant.client]
            p["waiting_since"] = None
            # Holds briefly or for long; one that ignores drops holds "forever".
            p["at"] = now + (1e9 if p["ignores_drops"] else rng.choice((0.02, 0.3, 2.0, 20.0)))
        for drop in of(AskToDrop, actions):
            p = plan.get(drop.client)
            if p is not None and drop.when_idle_ms == 0 and not p["ignores_drops"]:
                p["at"] = min(p["at"], now + rng.uniform(0, grace / 2))
        for revoke in of(Revoke, actions):
            if revoke.client in plan:
                plan[revoke.client]["at"] = now + rng.uniform(0, 1)
        # Not only those granted: one left waiting for ever would never show up above.
        for c, p in plan.items():
            if c in s.gpus[G0].waiters:
                assert now - p["waiting_since"] <= bound, (c, now - p["waiting_since"], bound)
    assert worst > tq / 2, "the walk never made anyone wait: it tests nothing"
    assert comings_and_goings > 10, "no one came or went"


def test_a_light_waiter_while_a_lease_beside_drains_sets_no_deadline_that_is_already_due():
    # A light client beside the turn grows past what fits and drains; a much lighter
    # waiter that fits beside neither then cuts the turn short after its minimum slice,
    # and the deadline says so: one that was already due came back at once for ever
    # (the agent's event loop once spun in tick()).
    s = make(3)
    hold_for(s, 1, 0.5, 0.0)
    one(Grant, s.request(1, G0, 0.5))
    beside = one(Grant, s.request(2, G0, 0.51))
    assert beside.role == "beside"
    drop = one(AskToDrop, s.memory_report(2, G0, 78 * GIB, 0, 0.52))
    assert (drop.client, drop.reason) == (2, "memory does not fit")
    s.memory_report(3, G0, 2 * GIB, 0, 0.53)
    tick = spin_guarded_tick(s)
    drops = of(AskToDrop, s.request(3, G0, 0.55))
    assert s.gpus[G0].waiters[3].cuts_in
    assert [(d.client, d.when_idle_ms) for d in drops] == [(1, YIELD_IDLE_MS)]  # a yield only
    due = s.next_deadline()
    assert due == pytest.approx(0.55 + BEFORE_DRAIN)
    drops = of(AskToDrop, tick(due))
    assert [(d.client, d.reason) for d in drops] == [(1, "light work waits")]


GPUS = [bytes(15) + bytes([i + 1]) for i in range(3)]
GPU_IDS = [f"GPU-00000000-0000-0000-0000-00000000000{i + 1}" for i in range(3)]


@pytest.mark.parametrize("seed", range(100))
def test_no_sequence_of_events_leaves_a_deadline_that_is_already_due(seed):
    """Every kind of event, on three GPUs with clients on one, two or all of them, under
    every mode and switches between them (node-wide and per GPU), quanta, slices and
    graces down to 0, memory (the clients' and others' by NVML) crossing the line both
    ways: each tick() acts on what is due and returns, leaving no deadline due.  A
    deadline that the rules do not act on would come back at once for ever: the agent
    would spin in tick() instead of scheduling."""
    rng = random.Random(seed)
    base = AUTO.replaced(
        time_quantum_s=rng.choice((1, 2, 30)),
        drop_grace_ms=rng.choice((0, 1, 500)),
        min_slice_ms=rng.choice((0, 1, 100)),
    )
    s = Scheduler(base)
    for uuid in GPUS:
        s.add_gpu(uuid, "GPU", 8 * GIB)
    tick = spin_guarded_tick(s)
    now, ids, clients = 0.0, itertools.count(1), set()
    modes = (AntiThrash.AUTO,) * 4 + (AntiThrash.ON, AntiThrash.OFF)
    for _ in range(2000):
        now += rng.choice((0.0, 0.0, 0.001, 0.05, 0.1, 0.25, 1.0, 3.0))
        tick(now)
        gpu = rng.choice(GPUS)
        event = rng.random()
        if event < 0.08 or not clients:
            c = next(ids)
            s.connect(c, 100 + c, 1000, 1000, now)
            named = tuple(rng.sample(GPUS, rng.choice((1, 2, 3))))
            s.hello(c, named, "x", now, features=rng.choice((0, FEATURE_YIELD, FEATURE_YIELD)))
            clients.add(c)
        elif event < 0.12:
            c = rng.choice(sorted(clients))
            s.disconnect(c, now)
            clients.discard(c)
        elif event < 0.45:
            c = rng.choice(sorted(clients))
            g = s.gpus[gpu]
            if gpu in s.clients[c].gpus and c not in g.holders and c not in g.waiters:
                s.request(c, gpu, now)
        elif event < 0.7:
            holders = s.gpus[gpu].holders
            if holders:
                c = rng.choice(sorted(holders))
                s.release(c, gpu, holders[c].number, now, idle_ms=rng.choice((0, 50, 2000)))
        elif event < 0.75:
            waiters = s.gpus[gpu].waiters
            if waiters:
                s.release(rng.choice(sorted(waiters)), gpu, 0, now)  # withdrawn
        elif event < 0.95:
            c = rng.choice(sorted(clients))
            if gpu in s.clients[c].gpus:
                s.memory_report(c, gpu, rng.choice((0, 1, 3, 5, 9)) * GIB, 0, now)
        elif event < 0.97:
            s.nvml_processes({gpu: {99999: rng.choice((0, 4, 9)) * GIB}}, now)
        else:
            settings = base.replaced(
                anti_thrash=rng.choice(modes),
                time_quantum_s=rng.choice((1, 2, 30)),
                min_slice_ms=rng.choice((0, 1, 100, 5000)),
                drop_grace_ms=rng.choice((0, 1, 500)),
            )
            if rng.random() < 0.5:
                own = GpuOverrides(anti_thrash=rng.choice(modes), time_quantum_s=rng.choice((1, 5)))
                settings = settings.with_gpu_overrides([(GPU_IDS[1], own)])
            s.change_settings(settings, now)
        tick(now)


# ---------------------------------------------------------------- bounds on what clients make us track


def test_a_client_that_sends_no_hello_is_refused_at_its_deadline():
    s = Scheduler(AUTO, hello_timeout_s=10.0)
    s.connect(1, 11, 0, 0, now=5.0)
    assert s.next_deadline() == 15.0
    assert not s.tick(14.9)
    assert one(Refuse, s.tick(15.0)).reason == "no HELLO within 10 s of connecting"
    s.connect(2, 12, 0, 0, now=20.0)
    s.hello(2, (G0,), "x", 20.0)
    assert s.next_deadline() is None


def test_once_the_inventory_is_known_other_gpus_are_refused():
    s = Scheduler(AUTO)
    s.add_gpu(G0, "GPU", CAPACITY)
    s.allow_gpu(G1)  # a MIG instance: named by clients, not scheduled on its own
    s.connect(1, 11, 0, 0)
    invented = b"\x07" * 16
    refusal = one(Refuse, s.hello(1, (G0, invented), "x", 0.0))
    assert refusal.reason == f"GPU {invented.hex()} is not on this node"
    s.connect(2, 12, 0, 0)
    assert not of(Refuse, s.hello(2, (G0, G1), "x", 0.0))


def test_one_uid_can_make_the_agent_track_only_so_many_unknown_gpus():
    s = Scheduler(AUTO, max_gpus_per_client=16)
    client = 0
    named = 0
    refused = None
    while refused is None:
        client += 1
        s.connect(client, client, 1000, 1000)
        gpus = tuple(i.to_bytes(16, "big") for i in range(named, named + 16))
        refusals = of(Refuse, s.hello(client, gpus, "x", 0.0))
        refused = refusals[0] if refusals else None
        named += 16
    assert (
        refused.reason
        == f"uid 1000 already named {MAX_LEARNED_GPUS_PER_UID} GPUs the agent cannot see"
    )
    assert len(s.gpus) == MAX_LEARNED_GPUS_PER_UID
    s.connect(999, 999, 2000, 2000)  # another user is not held back
    assert not of(Refuse, s.hello(999, (b"\xff" * 16,), "x", 0.0))
    for c in range(1, client + 1):
        s.disconnect(c, 1.0)
    assert len(s.gpus) == 1  # forgotten with the clients that named them


def test_clients_gone_at_once_are_not_granted_in_turn():
    s = make(n_clients=5, settings=AUTO.replaced(anti_thrash=AntiThrash.ON))
    holder = one(Grant, s.request(1, G0, 0.0))
    for c in (2, 3, 4, 5):
        s.request(c, G0, 0.1)
    actions = s.disconnect_many([1, 2, 3, 4], 1.0)
    assert [g.client for g in of(Grant, actions)] == [5]
    assert {g.client for g in of(Gone, actions)} == {1, 2, 3, 4}
    assert holder.lease not in [g.lease for g in of(Grant, actions)]


def test_two_new_busy_clients_do_not_take_the_gpu_from_each_other_slice_by_slice():
    # Both new: each has little use, so each is "light" by the floor; taking turns
    # by the minimum slice would cost a drain and a prefetch every 100 ms.  Only
    # much less use than the holder's lets a waiter in early: that happens once.
    s = exclusive_gpu(n_clients=2)
    leases = {1: one(Grant, s.request(1, G0, 0.0)).lease}
    s.request(2, G0, 0.001)
    now, early_drops = 0.0, 0
    while now < 5.0:
        due = s.next_deadline()
        now = due if due is not None and due < 5.0 else 5.0
        for drop in of(AskToDrop, s.tick(now)):
            if drop.when_idle_ms:
                continue
            early_drops += drop.reason == "light work waits"
            grant = one(Grant, s.release(drop.client, G0, drop.lease, now + 0.05))
            leases[grant.client] = grant.lease
            s.request(drop.client, G0, now + 0.06)  # busy: asks again at once
    assert early_drops == 1


def trainers_that_do_not_fit_together(
    seconds: float,
    window_work_s: float = 0.03,
    pause_every_s: float | None = None,
    trainers: int = 2,
    separate_users: bool = False,
    prefetch_s: float = 0.0,
    pause_s: float = 0.0,
):
    """Trainers (two by default) on a GPU where they do not fit together, measuring
    shims (use is their GPU time), in 5 ms steps: trainer k starts at k - 1 s.  Each
    keeps the GPU busy while it holds it, except that a trainer's step leaves it idle
    2 ms every `window_work_s`, which ends a window lease (WINDOW_IDLE_MS), and, given
    `pause_every_s`, idle YIELD_IDLE_MS (or `pause_s`, its GPU idle) that often (an
    evaluation, a slow batch), which ends a lease asked to yield; a turn granted
    displaced is a prefetch first, `prefetch_s` with no GPU time counted (the shim
    counts none); each asks again at once; a drop drains in 20 ms.  Returns the grants,
    with their times, and the GPU time each trainer got."""
    s = make(
        trainers,
        settings=AUTO.replaced(memory_limit_bytes=512 << 20),
        features=FEATURE_YIELD | FEATURE_USAGE,
        separate_users=separate_users,
    )
    clients = range(1, trainers + 1)
    step = 0.005
    busy_us = dict.fromkeys(clients, 0)
    held: dict[int, tuple] = {}  # client -> (grant, granted_at)
    draining: dict[int, float] = {}  # client -> when it releases
    grants: list[tuple[float, Grant]] = []

    def note(actions, now):
        for grant in of(Grant, actions):
            held[grant.client] = (grant, now)
            grants.append((now, grant))
        for drop in of(AskToDrop, actions):
            if drop.when_idle_ms == YIELD_IDLE_MS:
                yielding.add(drop.client)
            elif not drop.when_idle_ms:
                draining[drop.client] = now + 0.02
            elif drop.when_idle_ms == WINDOW_IDLE_MS:
                grant, since = held[drop.client]
                draining[drop.client] = since + window_work_s + WINDOW_IDLE_MS / 1000

    now = 0.0
    yielding: set[int] = set()
    note(s.request(1, G0, now), now)
    while now < seconds:
        now = round(now + step, 6)
        for client in list(held):
            grant, since = held[client]
            if client in yielding and pause_every_s:
                pauses = math.floor((now - since) / pause_every_s)
                if pauses and client not in draining:
                    draining[client] = since + pauses * pause_every_s + YIELD_IDLE_MS / 1000
            prefetching = grant.displaced and grant.role == "turn" and now - since <= prefetch_s
            pausing = pause_every_s and (now - since) % pause_every_s >= pause_every_s - pause_s
            if not (prefetching or pausing):
                busy_us[client] += int(step * 1e6)
                s.gpu_usage(client, G0, busy_us[client], now)
            if draining.get(client, now + 1) <= now:
                grant, _ = held.pop(client)
                del draining[client]
                yielding.discard(client)
                note(s.release(client, G0, grant.lease, now), now)
        for client in clients:
            if client not in held and client not in s.gpus[G0].waiters and now >= client - 1:
                note(s.request(client, G0, now), now)
        note(s.tick(now), now)
    return grants, busy_us


def test_a_busy_client_that_windows_starve_of_use_takes_the_next_turn():
    # Issue 35's b.: the second trainer is new, so its use is nil and it cuts in, in
    # windows that its idle steps keep short.  Once its use passes the floor it waits
    # for the turn instead, and when the first trainer's quantum is over (counted from
    # its turn's start: windows do not lengthen a turn) the turn goes to it, the one
    # with the least use, not to another window.
    grants, busy_us = trainers_that_do_not_fit_together(TQ + 5)
    windows = [t for t, g in grants if g.client == 2 and g.role == "beside"]
    turns_of_2 = [t for t, g in grants if g.client == 2 and g.role == "turn"]
    assert windows and windows[0] < 1.2, "new, it cuts in at first"
    assert turns_of_2, "it never took a turn"
    assert TQ <= turns_of_2[0] <= TQ + 0.1
    # Its windows stopped once it was no longer light: few, against 1's whole quantum.
    assert len(windows) < 200
    assert busy_us[2] < 0.1 * busy_us[1] + 5e6


class MeasuredMix:
    """Clients whose shims measure their GPU time, in 1 ms steps.  duty[c]: the
    fraction of each 10 ms it keeps the GPU busy while it holds a lease (1: a
    trainer; 0.03: a loader's batch every 10 ms).  A drop drains in 20 ms (a light
    client's in 1 ms), a yield ends once the client is idle that long, and every
    client asks again at once.  busy_s: the GPU time each got."""

    def __init__(self, s: Scheduler, duty: dict[int, float]):
        self.s, self.duty = s, duty
        self.busy_s = dict.fromkeys(duty, 0.0)
        self.held: dict[int, Grant] = {}
        self.grants: list[tuple[float, Grant]] = []
        self.releases: dict[int, float] = {}  # client -> when it gives its lease back
        self.now = 0.0

    def note(self, actions) -> None:
        for grant in of(Grant, actions):
            self.held[grant.client] = grant
            self.grants.append((self.now, grant))
        for drop in of(AskToDrop, actions):
            duty = self.duty[drop.client]
            if not drop.when_idle_ms:
                drain = 0.02 if duty > 0.5 else 0.001
                self.releases[drop.client] = self.now + drain
            elif duty < 1:  # idle within the next 10 ms, for as long as asked
                idle_after = 0.01 * duty
                if drop.when_idle_ms / 1000 <= 0.01 * (1 - duty):
                    self.releases[drop.client] = self.now + idle_after + drop.when_idle_ms / 1000

    def ask(self, client: int) -> None:
        self.note(self.s.request(client, G0, self.now))

    def run_until(self, until: float) -> None:
        while self.now < until - 1e-9:
            self.now = round(self.now + 0.001, 6)
            step = round(self.now * 1000)
            for client in self.held:  # busy at the start of each 10 ms, duty of it
                busy_ms = min(1.0, max(0.0, 10 * self.duty[client] - step % 10))
                self.busy_s[client] += busy_ms / 1000
            if step % 5 == 0:
                for client in self.held:
                    usage = int(self.busy_s[client] * 1e6)
                    self.note(self.s.gpu_usage(client, G0, usage, self.now))
            for client, when in list(self.releases.items()):
                if self.now >= when - 1e-9:
                    del self.releases[client]
                    grant = self.held.pop(client, None)
                    if grant is not None:
                        self.note(self.s.release(client, G0, grant.lease, self.now))
                        self.ask(client)
            due = self.s.next_deadline()
            if due is not None and due <= self.now:
                self.note(self.s.tick(self.now))


def test_light_work_that_took_the_turn_first_gives_it_to_a_busy_client_that_comes():
    # A loader (a batch every 10 ms, never idle 50 ms) alone takes the turn; a trainer
    # comes 5 s later.  Memory fits.  The turn once stayed the loader's for the whole
    # quantum (30 s), the trainer waiting behind it after its first 2 s beside.
    s = make(2, features=FEATURE_YIELD | FEATURE_USAGE)
    mix = MeasuredMix(s, {1: 0.03, 2: 1.0})
    mix.ask(1)
    mix.run_until(5.0)
    mix.ask(2)
    mix.run_until(40.0)
    turns = [(t, g.client) for t, g in mix.grants if g.role == "turn"]
    assert turns[0] == (0.0, 1)
    taken = next(t for t, client in turns if client == 2)
    assert taken < 5.0 + LIGHT_TURN_PROOF_S + 1.0, turns
    assert mix.busy_s[2] >= 0.97 * 35, mix.busy_s  # the loader beside it
    assert all(g.role == "beside" for t, g in mix.grants if g.client == 1 and t > taken)


def test_a_new_trainer_cut_short_for_light_work_keeps_light_work_within_its_wait():
    # Nothing fits.  A new trainer holds the turn; an inference server's requests cut
    # it short.  The trainer, light by its little use so far, asks again at once: it
    # once got a window (light work) and kept it 1.75 s while requests waited.
    s = make(
        2,
        settings=AUTO.replaced(memory_limit_bytes=512 << 20),
        features=FEATURE_YIELD | FEATURE_USAGE,
    )
    mix = MeasuredMix(s, {1: 1.0, 2: 0.02})
    mix.ask(1)
    waits = []
    for request in range(20):
        mix.run_until(0.5 + 0.05 * request)
        if 2 not in mix.held and 2 not in s.gpus[G0].waiters:
            mix.ask(2)
        asked = mix.now
        while 2 not in mix.held:
            mix.run_until(mix.now + 0.001)
        waits.append(mix.now - asked)
        mix.releases[2] = mix.now + 0.001  # a 1 ms request, then idle: a window ends
    # It may come back in a window (light by its little use so far), but a window in
    # light work's way is cut short on the turn's clock (rule 6).
    assert max(waits) <= LIGHT_WAIT + 0.01, waits


def test_light_work_that_fits_beside_the_turn_alone_makes_an_idle_lease_beside_it_yield():
    # The trainer (40 GiB) holds the turn, a light client (20 GiB) sits idle beside it;
    # another light client (30 GiB) fits beside the trainer, not beside both.  The
    # turn was once cut short for it while the idle lease beside stayed.
    s = make(3, features=FEATURE_YIELD | FEATURE_USAGE)
    for client, size in ((1, 40), (2, 20), (3, 30)):
        s.memory_report(client, G0, size * GIB, 0, now=0.0)
    trainer = one(Grant, s.request(1, G0, 0.0))
    for step in range(1, 1001):
        s.gpu_usage(1, G0, step * 10_000, step / 100)
        s.tick(step / 100)
    beside = one(Grant, s.request(2, G0, 10.0))
    assert beside.role == "beside"
    s.gpu_usage(2, G0, 1000, 10.01)  # 1 ms of work, then idle with its lease
    actions = s.request(3, G0, 10.5)
    assert of(Queued, actions)
    ask = one(AskToDrop, actions, client=2)
    assert (ask.when_idle_ms, ask.reason) == (WINDOW_IDLE_MS, "window")
    granted = one(Grant, s.release(2, G0, beside.lease, 10.502, idle_ms=WINDOW_IDLE_MS))
    assert (granted.client, granted.role) == (3, "beside")
    assert 1 in s.gpus[G0].holders and s.gpus[G0].holders[1].number == trainer.lease
    assert s.gpus[G0].holders[1].drop_requested_at is None


def test_two_trainers_that_do_not_fit_together_share_the_gpu_by_turns():
    grants, busy_us = trainers_that_do_not_fit_together(4 * TQ)
    share = busy_us[1] / (busy_us[1] + busy_us[2])
    assert 0.45 <= share <= 0.55, (share, busy_us)


def test_two_trainers_with_pauses_take_whole_quanta_and_share_the_gpu():
    # Issue 35's b. on the H100: trainers pause now and then (here 60 ms each second).
    # Their uses tie near 1, and a tie once made the holder yield at its next pause:
    # turns of 12 to 30 s by chance, and shares of 40 / 60 % over two minutes.
    grants, busy_us = trainers_that_do_not_fit_together(6 * TQ, pause_every_s=1.0)
    starts = []  # when the turn went to the other trainer (a turn goes on after windows)
    for t, grant in grants:
        if grant.role == "turn" and (not starts or starts[-1][1] != grant.client):
            starts.append((t, grant.client))
    # The first turn ends early: 2 is new, windows kept its use under half of 1's.
    lengths = [b[0] - a[0] for a, b in itertools.pairwise(starts)][1:]
    assert len(lengths) >= 4 and all(TQ <= x <= TQ + 0.1 for x in lengths), lengths
    share = busy_us[1] / (busy_us[1] + busy_us[2])
    assert 0.45 <= share <= 0.55, (share, busy_us)


@pytest.mark.parametrize(
    "cell_s, fit, yields", [(4.0, False, True), (10.0, False, False), (10.0, True, False)]
)
def test_a_trainer_yields_to_a_busy_waiter_with_half_its_use_or_less(cell_s, fit, yields):
    # A notebook's long cell (busy: over a quarter of the trainer's use) behind a
    # trainer: the trainer releases at its next 50 ms pause, not at its quantum's end.
    # A waiter with more than half a trainer's use is the trainer's equal, whether their
    # memory fits together or not: the turn lasts its quantum.
    s = make(3)
    now = hold_for(s, 1, 60.0, 0.0)
    one(Grant, s.request(1, G0, now))
    now = hold_for(s, 2, cell_s, now + 1.0)  # beside the turn: their memory fits
    if not fit:  # now it does not (each fits alone)
        s.memory_report(1, G0, int(0.6 * LINE), 0, now=now + 0.5)
        s.memory_report(2, G0, int(0.6 * LINE), 0, now=now + 0.6)
    actions = s.request(2, G0, now + 1.0)
    assert of(Queued, actions), actions
    trainer, waiter = s._usage(1, G0, now + 1.0), s._usage(2, G0, now + 1.0)
    assert trainer > 0.95 and 0.25 < waiter < 0.75 and (waiter <= trainer / 2) == yields
    asks = of(AskToDrop, actions)
    if yields:
        assert [(a.client, a.when_idle_ms, a.reason) for a in asks] == [
            (1, YIELD_IDLE_MS, "others wait")
        ]
    else:
        assert not asks


def services_on_one_gpu(
    work_s: float,
    period_s: float,
    memory_limit: int,
    seconds=120,
    measuring=True,
    second_pauses=(0.0, 0.0),
    step=0.005,
    first_starts=0.0,
):
    """Two services on a GPU, each with `work_s` of GPU work every `period_s` (the
    second half a period later, and no requests in its `second_pauses` (from, to); the
    first from `first_starts`),
    measuring shims; a lease asked to yield is released once idle that long, one asked
    to drop 20 ms later.  measuring=False: older shims (no use reports: the hold stands
    for use).  Returns every request's latency (arrival to its work done)."""
    s = make(
        2,
        settings=AUTO.replaced(memory_limit_bytes=memory_limit),
        features=FEATURE_YIELD | (FEATURE_USAGE if measuring else 0),
    )
    pending: dict[int, list[list[float]]] = {1: [], 2: []}  # [arrival, work left]
    arrivals = {1: first_starts, 2: period_s / 2}
    busy_s = {1: 0.0, 2: 0.0}
    held: dict[int, Grant] = {}
    idle_since: dict[int, float] = {}
    yield_after: dict[int, float] = {}
    drain_at: dict[int, float] = {}
    latencies: list[float] = []

    def note(actions, now):
        for action in actions:
            if isinstance(action, Grant):
                held[action.client], idle_since[action.client] = action, now
            elif isinstance(action, AskToDrop) and action.when_idle_ms:
                yield_after[action.client] = action.when_idle_ms / 1000
            elif isinstance(action, AskToDrop):
                drain_at[action.client] = now + 0.02

    now = 0.0
    while now < seconds:
        now = round(now + step, 6)
        for client in (1, 2):
            if arrivals[client] <= now:
                paused = client == 2 and second_pauses[0] <= arrivals[client] < second_pauses[1]
                if not paused:
                    pending[client].append([arrivals[client], work_s])
                arrivals[client] += period_s
            if client in held:
                if pending[client] and client not in drain_at:
                    pending[client][0][1] -= step
                    busy_s[client] += step
                    idle_since[client] = now
                    if pending[client][0][1] <= 1e-9:
                        latencies.append(now - pending[client].pop(0)[0])
                if measuring:
                    s.gpu_usage(client, G0, int(busy_s[client] * 1e6), now)
                idle = now - idle_since[client]
                if (
                    drain_at.get(client, now + 1) <= now
                    or idle >= AUTO.idle_release_ms / 1000
                    or idle >= yield_after.get(client, math.inf)
                ):
                    grant = held.pop(client)
                    drain_at.pop(client, None)
                    yield_after.pop(client, None)
                    note(s.release(client, G0, grant.lease, now), now)
            if client not in held and pending[client] and client not in s.gpus[G0].waiters:
                note(s.request(client, G0, now), now)
        note(s.tick(now), now)
    return latencies


@pytest.mark.parametrize("measuring", [True, False], ids=["measuring", "older-shims"])
@pytest.mark.parametrize("memory_limit", [0, 512 << 20])  # fits; does not
@pytest.mark.parametrize("work_s", [0.1, 0.2])
def test_two_busy_services_serve_each_other_in_their_gaps(memory_limit, work_s, measuring):
    # Two services, each busy by the rules (use 0.2-0.4: too much for light work), take
    # turns; neither keeps its lease busy, so each yields in its gaps: a request waits
    # for the other's, not for a quantum (as when a holder yielded only to a waiter
    # with half its use or less: 20-30 s).  Older shims too, whose holds stand for use.
    latencies = sorted(services_on_one_gpu(work_s, 0.5, memory_limit, measuring=measuring))
    assert len(latencies) > 400
    bound = HOLDS_PROVEN_S + LIGHT_CHECK_S + work_s
    assert latencies[int(0.99 * len(latencies))] <= bound, latencies[-10:]


def test_a_light_service_back_from_a_lull_does_not_wait_a_quantum_behind_another():
    # Two inference servers whose memory does not fit together, 1 ms of work every 30 ms
    # each: light (use ~0.03), and neither ever idle 50 ms.  The first starts while the
    # second pauses, and takes the turn alone.  The second, back from 5 s without
    # requests, is still light (its use ~0.02) but no longer under a quarter of the
    # holder's, so it cannot cut in: it waited the quantum (27 s) while the GPU sat idle.
    # The holder, itself under the floor after LIGHT_TURN_PROOF_S, hands it over.
    latencies = services_on_one_gpu(
        0.001, 0.03, 512 << 20, seconds=30, second_pauses=(3.0, 8.0), step=0.001, first_starts=5.0
    )
    # Every request answered (~1667 in all; one still waiting is not in the list), and
    # none waited past the light turn's proof and a look.
    assert len(latencies) >= 1660, len(latencies)
    assert max(latencies) <= LIGHT_TURN_PROOF_S + LIGHT_CHECK_S + 0.05, sorted(latencies)[-5:]


def test_a_lease_too_young_to_tell_is_judged_by_its_clients_last_one():
    # Whether a holder keeps the GPU busy decides whether it yields to an equal.  A
    # lease under HOLDS_PROVEN_S cannot tell yet: a trainer's turn resumed after a
    # window, or begun after a yield, is judged by its last lease (asked to yield in
    # its first moments, it kept the ask for the whole lease, and two trainers swapped
    # the GPU at every pause).  An older shim's hold is its use: never judged so.
    s = make(1, features=FEATURE_YIELD | FEATURE_USAGE)
    gpu = s.gpus[G0]

    def lease(start, busy_s, held_s):
        grant = one(Grant, s.request(1, G0, start))
        if busy_s:
            s.gpu_usage(
                1,
                G0,
                int((s._meter(s.clients[1], G0).total_s(start) + busy_s) * 1e6),
                start + busy_s,
            )
        young = s._keeps_the_gpu_busy(gpu, 1, gpu.holders[1], start + 0.1)
        s.release(1, G0, grant.lease, start + held_s)
        return young

    lease(0.0, 1.0, 1.0)  # kept busy
    assert lease(2.0, 0.05, 1.5) is True  # judged by the last: busy (itself it was not)
    assert lease(4.0, 0.05, 0.2) is False  # by the last: not busy
    assert lease(5.0, 0.0, 0.2) is False  # 0.2 s tells nothing: the one before stands
    old = make(1)  # an older shim
    grant = one(Grant, old.request(1, G0, 0.0))
    assert not old._keeps_the_gpu_busy(old.gpus[G0], 1, old.gpus[G0].holders[1], 5.0)
    assert grant.client == 1


def turn_lengths(grants) -> list[float]:
    """How long each turn lasted, from one trainer's turn to the next's (a turn goes on
    after windows); the first and the last left out."""
    starts = []
    for t, grant in grants:
        if grant.role == "turn" and (not starts or starts[-1][1] != grant.client):
            starts.append((t, grant.client))
    return [b[0] - a[0] for a, b in itertools.pairwise(starts)][1:]


def test_three_trainers_of_three_users_share_the_gpu_by_whole_turns():
    # A waiter that had waited TQ when a turn began (the share groups' order passed it
    # over) once made that turn yield at its first pause: the least charged trainer
    # lost every turn, 43 / 41 / 10 %.
    grants, busy_us = trainers_that_do_not_fit_together(
        12 * TQ, pause_every_s=1.0, trainers=3, separate_users=True
    )
    lengths = turn_lengths(grants)[4:]  # past the newcomers' first, short turns
    assert len(lengths) >= 8 and all(TQ <= x <= TQ + 0.1 for x in lengths), lengths
    total = sum(busy_us.values())
    assert all(0.30 <= busy / total <= 0.37 for busy in busy_us.values()), busy_us


def test_a_displaced_trainers_prefetch_does_not_make_its_turn_look_idle():
    # The shim counts no GPU time while it prefetches at a grant (before its gate
    # opens): a turn judged from its grant looked idle for its first half second, was
    # asked to yield, and the two trainers swapped at every pause.
    grants, busy_us = trainers_that_do_not_fit_together(
        6 * TQ, pause_every_s=1.0, pause_s=0.18, prefetch_s=0.6
    )  # busy 82 % of a lease: their uses stay under 0.8, the lease's figure decides
    lengths = turn_lengths(grants)
    assert len(lengths) >= 4 and all(TQ <= x <= TQ + 0.7 for x in lengths), lengths


def test_light_work_granted_beside_makes_the_turn_yield_for_nobody():
    # B trained a minute; A's turn has just begun.  B waits with no better claim (more
    # use than A's): A is not asked to release once idle.  Light work that comes
    # and is granted beside at once leaves B the best waiter: still no ask (the rule
    # once compared A with the light client, already granted, and A lost its turn to
    # a 50 ms pause).
    s = make(3)
    now = hold_for(s, 2, 60.0, 0.0)
    one(Grant, s.request(1, G0, now))
    actions = s.request(2, G0, now + 0.5)
    assert of(Queued, actions) and not of(AskToDrop, actions)
    actions = s.request(3, G0, now + 1.0)
    assert one(Grant, actions).role == "beside"
    assert not of(AskToDrop, actions), actions


def test_light_work_is_served_soon_after_a_starving_waiter_takes_the_turn():
    # B waited a quantum and takes the turn; a notebook asked meanwhile.  The rules once
    # kept judging by B as the best waiter after its grant: no window for a quantum.
    s = exclusive_gpu(n_clients=3)
    now = hold_for(s, 2, 60.0, 0.0)
    now = hold_for(s, 1, 60.0, now)
    a = one(Grant, s.request(1, G0, now))
    s.request(2, G0, now + 0.01)
    s.tick(now + TQ)
    s.request(3, G0, now + TQ + 0.005)  # a notebook that never used the GPU
    b = one(Grant, s.release(1, G0, a.lease, now + TQ + 0.2))  # A drained in 200 ms
    assert b.client == 2 and b.role == "turn"
    due = s.next_deadline()
    assert due == pytest.approx(now + TQ + 0.2 + MIN_SLICE)
    assert one(AskToDrop, s.tick(due)).reason == "light work waits"


def test_light_work_that_asks_as_a_turn_begins_cuts_in_once_the_turn_is_busy():
    # A notebook that used the GPU a little asks as a trainer's turn begins: not yet
    # "much lighter" than a turn with no use.  Judged again as the turn's use grows, it
    # cuts in within seconds (it once waited a whole quantum).
    s = make(2, settings=AUTO.replaced(memory_limit_bytes=512 << 20), features=FEATURE_USAGE)
    notebook = one(Grant, s.request(2, G0, 0.0))
    s.gpu_usage(2, G0, 300_000, 0.5)
    s.release(2, G0, notebook.lease, 0.5)
    trainer = one(Grant, s.request(1, G0, 1.0))
    s.request(2, G0, 1.005)
    now = 1.0
    while now < 1.0 + TQ:
        now = round(now + 0.005, 6)
        s.gpu_usage(1, G0, int((now - 1.0) * 1e6), now)
        drops = [d for d in of(AskToDrop, s.tick(now)) if not d.when_idle_ms]
        if drops:
            assert drops[0].reason == "light work waits"
            break
    assert now - 1.0 < 3.0, f"the notebook waited {now - 1.0:.1f} s"
    assert trainer.role == "turn"


def test_a_waiter_that_withdraws_is_no_longer_frozen():
    s = exclusive_gpu(n_clients=2)
    now = hold_for(s, 2, 60.0, 0.0)
    one(Grant, s.request(1, G0, now))
    s.request(2, G0, now + 0.01)
    s.tick(now + 0.2)  # past its light wait: its use frozen
    s.release(2, G0, 0, now + 0.3)  # it withdraws
    assert s._usage(2, G0, now + 600) < 0.01  # decayed, not frozen at a minute's use


def test_waiting_on_one_gpu_is_not_holding_it_for_another():
    # Frozen while it waited on G0, client 2 does not count as working across GPUs on G1.
    s = Scheduler(AUTO.replaced(memory_limit_bytes=512 << 20))
    s.add_gpu(G0, "GPU0", CAPACITY)
    s.add_gpu(G1, "GPU1", CAPACITY)
    for c, gpus in ((1, (G0,)), (2, (G0, G1)), (3, (G1,))):
        s.connect(c, pid=100 + c, uid=1000, gid=1000)
        s.hello(c, gpus, f"cmd{c}", now=0.0, features=FEATURE_YIELD)
    now = hold_for(s, 2, 60.0, 0.0) + 100.0
    one(Grant, s.request(1, G0, now))
    s.request(2, G0, now + 0.01)
    s.tick(now + 0.2)
    one(Grant, s.request(2, G1, now + 0.5))
    assert not s.gpus[G1].holders[2].across_gpus
