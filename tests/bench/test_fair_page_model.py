"""bench/fair_page_model.py: the fair page as policy_sim plays it, look by look."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import fair_page_model as model
import policy_sim

from nvshare_agent.settings import Settings

STEP = 0.001


def play(page, seconds, start, work_of):
    """Steps of 1 ms from start: work_of(now) -> {client: has work}; those with work that
    may run share the step evenly.  Returns the time after."""
    now = start
    for _ in range(round(seconds / STEP)):
        now += STEP
        with_work = work_of(now)
        page.look(with_work, {number: 1 for number in with_work}, now)
        running = [n for n, has in with_work.items() if has and page.may_run(n, now)]
        for number in running:
            page.ran(number, STEP / len(running), STEP)
    return now


def test_a_newcomer_was_not_away_and_gets_only_the_floor():
    """Else each new process of a stream of short jobs ran unheld for the whole credit."""
    page = model.FairPage()
    now = play(page, 2.0, 0.0, lambda now: {1: True})
    play(page, 0.005, now, lambda now: {1: True, 2: True})
    assert page.slots[2].credit == model.BURST_CREDIT_S
    assert page.slots[2].vtime >= page.slots[1].vtime - model.LEAD_S  # level, not 0


def test_back_from_idle_a_credit_of_what_the_least_ran_on_meanwhile():
    page = model.FairPage()
    now = play(page, 0.5, 0.0, lambda now: {1: True, 2: True})
    least_then = page.slots[1].vtime
    now = play(page, 0.1, now, lambda now: {1: True, 2: False})  # 2 away 100 ms
    ran = page.slots[1].vtime - least_then
    play(page, 0.002, now, lambda now: {1: True, 2: True})
    assert page.slots[2].credit == pytest.approx(ran, abs=0.003)
    assert model.BURST_CREDIT_S < page.slots[2].credit < model.MAX_CREDIT_S


@pytest.mark.parametrize("asked_after", [-0.05, 0.0, 0.5])
def test_the_credit_counts_only_what_the_least_ran_on_before_it_asked_again(asked_after):
    """Two trainers that do not fit together, each back from every other 0.5 s turn with a
    credit of ~250 ms, kept a notebook's cell beside them short-queued (H200): time spent
    waiting for a turn, or for its grant's prefetch, was wanted."""
    page = model.FairPage()
    now = play(page, 0.5, 0.0, lambda now: {1: True, 2: True})
    went_idle = now + STEP
    least_then = page.slots[1].vtime
    now = play(page, 0.2, now, lambda now: {1: True})  # 2 without a lease
    ran = page.slots[1].vtime - least_then
    page.asked(2, went_idle + 0.2 * asked_after)  # before it went idle, at once, or halfway
    play(page, 0.002, now, lambda now: {1: True, 2: True})
    want = min(max(ran * max(asked_after, 0.0), model.BURST_CREDIT_S), model.MAX_CREDIT_S)
    assert page.slots[2].credit == pytest.approx(want, abs=0.005)


def test_back_to_find_nobody_with_work_it_is_level_with_the_latest_looking():
    """Not at the virtual time of its last turn: everyone beside it was pulled back to it."""
    page = model.FairPage()
    now = play(page, 0.3, 0.0, lambda now: {1: True, 2: True})
    now = play(page, 0.3, now, lambda now: {1: True})  # 2 without a lease, 1 runs on
    now = play(page, 0.05, now, lambda now: {1: False})  # 1 holds, idle
    play(page, 0.002, now, lambda now: {1: False, 2: True})
    assert page.slots[2].vtime >= page.slots[1].vtime


def test_a_short_gap_keeps_its_place_but_never_more_than_the_lead_behind():
    """A loader's batch every ~10 ms fell behind by each gap and held everyone at each."""
    page = model.FairPage()
    now = play(page, 0.3, 0.0, lambda now: {1: True, 2: True})

    def loader(now):  # 2 ms of work, then 6 ms idle: gaps under IDLE_S
        return {1: True, 2: (now * 1000) % 8 < 2}

    play(page, 2.0, now, loader)
    assert page.slots[1].vtime - page.slots[2].vtime <= model.LEAD_S + 0.003


def test_a_held_one_runs_in_the_step_the_one_ahead_of_it_goes_idle():
    """Its shim's look rings the page's bell: the GPU is not left idle for a look (up to
    4 % of a mix's time in policy_sim while held work waited)."""
    page = model.FairPage()
    weights = {1: 1, 2: 3}  # 1's weight is less: held beside 2 once past its credit
    now = 0.0
    for _ in range(1000):  # till 1 waits: held, its queued work out
        now += STEP
        page.look({1: True, 2: True}, weights, now)
        if now > 0.1 and not page.may_run(1, now):
            break
        running = [n for n in (1, 2) if page.may_run(n, now)]
        for number in running:
            page.ran(number, STEP / len(running), STEP)
    assert page.slots[1].held and not page.may_run(1, now)
    now += STEP
    page.look({1: True, 2: False}, weights, now)  # 2's gap: its sync between two steps
    assert page.may_run(1, now)


def test_weights_side_by_side_split_the_gpu_by_the_page():
    """Two 90 %-busy processes at 3 : 1 run side by side (neither saturates, so no turns):
    the driver's equal slices without the page, ~0.64 / 0.32 with it (their ideal 0.70 /
    0.29).  Held, the weight-1 one runs in the other's gaps (its syncs): before its shim
    was woken there, 0.68 / 0.27 with the GPU idle 1.3 % of the time (H200: 0.70 / 0.22)."""
    settings = Settings(time_quantum_s=30)
    clients = ["duty:0.02:0.9*3", "duty:0.02:0.9"]
    on = policy_sim.simulate(clients, 20.0, settings, 80.0)["clients"]
    off = policy_sim.simulate(clients, 20.0, settings, 80.0, fair_page=False)["clients"]
    assert on["1 duty"]["share"] >= 1.8 * on["2 duty"]["share"]
    assert on["1 duty"]["of_ideal"] >= 0.85 and on["2 duty"]["of_ideal"] >= 0.85
    assert off["1 duty"]["share"] == pytest.approx(off["2 duty"]["share"], rel=0.1)
