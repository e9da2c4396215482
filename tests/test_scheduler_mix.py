"""Issue 35's CPU-side points on the core, with clients that do what a node's real mix
does: trainers keep the GPU busy all the time, inference servers a few ms every 50 ms,
notebooks run cells; most of them measure it (FEATURE_USAGE, Scheduler.gpu_usage).
Time is an argument: nothing here sleeps.

A file of its own because tests/test_scheduler_auto.py, whose helpers these use, had
passed 1,000 lines; docs/scheduling.md states the rules and the bounds shown here."""

from __future__ import annotations

import pytest
from test_scheduler_auto import (
    AUTO,
    BEFORE_DRAIN,
    G0,
    GIB,
    LIGHT_WAIT,
    hold_for,
    make,
    of,
    one,
)

from nvshare_agent.actions import AskToDrop, Grant, Queued

# ---------------------------------------------------------------- what light work waits for


def test_light_work_waits_no_longer_than_its_light_wait_behind_a_window_never_idle():
    # Nothing fits beside anything.  A new trainer (2), light by its nil use, cuts the
    # busy turn of 1 short and runs in a window; never idle, it never yields.  A notebook
    # (3) that asks then cuts in as well, and does not fit beside it: it once waited
    # until 2's use showed it busy (~2 s); the window is cut short for it as a turn is.
    s = make(3, settings=AUTO.replaced(memory_limit_bytes=512 << 20))
    now = hold_for(s, 1, 60.0, 0.0)
    turn = one(Grant, s.request(1, G0, now))
    s.request(2, G0, now + 0.5)
    assert s.gpus[G0].waiters[2].cuts_in
    drop = one(AskToDrop, s.tick(now + 0.5 + BEFORE_DRAIN))
    assert (drop.client, drop.reason) == (1, "light work waits")
    window = one(Grant, s.release(1, G0, turn.lease, now + 0.6))
    assert (window.client, window.role) == (2, "beside")
    assert of(Queued, s.request(1, G0, now + 0.6))  # busy: it waits for its turn
    asked = now + 1.0
    assert of(Queued, s.request(3, G0, asked)) and s.gpus[G0].waiters[3].cuts_in
    assert s.next_deadline() == pytest.approx(asked + BEFORE_DRAIN)
    drop = one(AskToDrop, s.tick(asked + BEFORE_DRAIN))
    assert (drop.client, drop.when_idle_ms, drop.reason) == (2, 0, "light work waits")
    notebook = one(Grant, s.release(2, G0, window.lease, asked + LIGHT_WAIT - 0.005))
    assert notebook.client == 3 and notebook.waited_s < LIGHT_WAIT


def test_a_turn_cut_short_for_light_work_does_not_come_back_before_it():
    # 1 trains (30 GiB), a server (2, 2 GiB) runs beside its turn, and 3 (76 GiB, new: it
    # cuts in) fits beside neither.  1's turn is cut short for 3 and 1 asks again at once:
    # 1 fits beside the server, 3 does not.  1 once took the turn back at once, 3 still
    # kept out, and lost it again each minimum slice while the server came and went.
    s = make(3)
    for client, size in ((1, 30 * GIB), (2, 2 * GIB), (3, 76 * GIB)):
        s.memory_report(client, G0, size, 0, 0.0)
    now = hold_for(s, 1, 60.0, 0.0)
    turn = one(Grant, s.request(1, G0, now))
    server = one(Grant, s.request(2, G0, now + 0.1))
    assert server.role == "beside"
    asked = now + 0.5
    assert of(Queued, s.request(3, G0, asked)) and s.gpus[G0].waiters[3].cuts_in
    drop = one(AskToDrop, s.tick(asked + BEFORE_DRAIN))
    assert (drop.client, drop.reason) == (1, "light work waits")
    released = asked + LIGHT_WAIT - 0.005
    actions = s.release(1, G0, turn.lease, released)
    assert one(AskToDrop, actions, client=2)  # in 3's way: it goes
    actions = s.request(1, G0, released)
    assert of(Queued, actions) and not of(Grant, actions)
    light = one(Grant, s.release(2, G0, server.lease, released + 0.002))
    assert light.client == 3 and light.waited_s < LIGHT_WAIT


def test_light_work_does_not_jump_ahead_of_older_light_work_that_does_not_fit_beside_it():
    # 1, a notebook that ran a cell, holds the turn (alone, it took it), 2 runs beside it;
    # 3, a new trainer (76 GiB), light by its nil use, cuts in and fits beside neither.
    # The turn and then 2 are asked to go for it.  A new notebook (4) asks meanwhile: it
    # fits beside 2, not beside 3.  It was granted at once, and each such grant pushed 3
    # back by another minimum slice; it waits its turn in the window order instead.
    s = make(4)
    for client, size in ((1, GIB), (2, GIB), (3, 76 * GIB), (4, GIB)):
        s.memory_report(client, G0, size, 0, 0.0)
    hold_for(s, 1, 0.5, 0.0)
    turn = one(Grant, s.request(1, G0, 1.0))
    beside = one(Grant, s.request(2, G0, 1.0))
    assert (turn.role, beside.role) == ("turn", "beside")
    asked = 1.1
    assert of(Queued, s.request(3, G0, asked)) and s.gpus[G0].waiters[3].cuts_in
    assert one(AskToDrop, s.tick(asked + BEFORE_DRAIN)).client == 1
    drop = one(AskToDrop, s.release(1, G0, turn.lease, asked + 0.08))
    assert (drop.client, drop.reason) == (2, "light work waits")
    actions = s.request(4, G0, asked + 0.09)
    assert of(Queued, actions) and not of(Grant, actions)
    assert s.gpus[G0].waiters[4].cuts_in
    trainer = one(Grant, s.release(2, G0, beside.lease, asked + 0.1))
    assert trainer.client == 3 and trainer.waited_s == pytest.approx(LIGHT_WAIT)
    # 4 waits for 3's window as 3 did for 2: at most its light wait less the drain.
    assert s.next_deadline() == pytest.approx(asked + 0.09 + BEFORE_DRAIN)
    drop = one(AskToDrop, s.tick(asked + 0.09 + BEFORE_DRAIN))
    assert (drop.client, drop.reason) == (3, "light work waits")
