"""The fair page with real shims on the stand-in driver (shim/fair_share.c,
agent/fair_pages.py): processes of two users whose memory fits run side by side
(anti-thrash off: every request is granted at once), and the page splits their GPU time
by their groups' weights.  The stand-in gives each process a GPU of its own, so a process
does fewer loops here only because the page held its launches: what is judged is the
ratio of the two processes' loops.

Runs its clients as two uids (setpriv, as test_shares.py): needs root."""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

import pytest
import test_shares
from agent_harness import wait_until
from test_shares import USER_A, USER_B, as_user, needs_root

from nvshare_agent import dbus_names as names

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dbus"))
from dbus_harness import DbusDaemon, busctl, busctl_on_agent

open_world = test_shares.open_world  # the socket folder, shim and stand-in other uids reach

SIDE_BY_SIDE = """\
[scheduler]
anti_thrash = off
share_by = user
{shares}"""
SECONDS = 4


def two_users(world, shares: str, b_sleep_ms: int = 0, b_launches: int = 4):
    """A busy process of user A (4 kernels of 2 ms a loop), one of user B (b_launches
    kernels, then sleeping b_sleep_ms), for SECONDS: the two clients, finished."""
    agent = world.start_agent(config=SIDE_BY_SIDE.format(shares=shares))
    seconds = ("--duration-ms", str(SECONDS * 1000))
    busy = ("--launches", "4", *seconds)
    debug = {"NVSHARE_DEBUG": "1"}  # the fair lines
    a = world.client("linked", *busy, prefix=as_user(USER_A), kernel_us=2000, **debug)
    b_args = ("--launches", str(b_launches), *seconds)
    b_args = (*b_args, "--sleep-ms", str(b_sleep_ms)) if b_sleep_ms else b_args
    b = world.client("linked", *b_args, prefix=as_user(USER_B), kernel_us=2000, **debug)
    loops = [int(c.finish_ok(timeout=60)["loops"]) for c in (a, b)]
    log = world.settled(agent, a, b)
    assert log.count("fair slot gpu=") == 2, log[-3000:]
    print(f"shares={shares!r} loops A {loops[0]} B {loops[1]}")  # for the record (-rP)
    return a, b


def loops_of_two_users(
    world, shares: str, b_sleep_ms: int = 0, b_launches: int = 4
) -> tuple[int, int]:
    """two_users: each one's loops."""
    a, b = two_users(world, shares, b_sleep_ms, b_launches)
    return int(a.result()["loops"]), int(b.result()["loops"])


@needs_root
@pytest.mark.root
@pytest.mark.slow  # 4 s
def test_weights_three_to_one_side_by_side_split_the_gpu_three_to_one(open_world):
    """A process's virtual time counts its time with work on the GPU over the number of
    processes then on it (on a GPU, the driver's equal slices).  Here each has a GPU of its
    own and runs at full pace while both have work, so 3 : 1 of GPU time by the weights
    is 2 : 1 of loops (A: half of the time both work, and all of the time B is held; ~0.6
    with B's queued work); 1 : 1 without the page, ~0.43 if time shared were charged whole."""
    a, b = loops_of_two_users(open_world, f"[share:user:{USER_A}]\nweight = 3\n")
    assert 0.5 <= b / a <= 0.75, (a, b)


@needs_root
@pytest.mark.root
@pytest.mark.slow  # 4 s
def test_equal_weights_side_by_side_are_not_held(open_world):
    """Level within the lead (5 ms of virtual time): both run as the driver interleaves
    them, each at its own pace here."""
    a, b = loops_of_two_users(open_world, "")
    assert 0.8 <= b / a <= 1.25, (a, b)


@needs_root
@pytest.mark.root
@pytest.mark.slow  # 4 s
def test_a_process_owed_more_holds_nobody_while_it_has_no_work(open_world):
    """Work-conserving: B (weight 3) works 8 ms then sleeps 40 ms; A (weight 1) is held
    only while B has work, and does most of what it does alone."""
    a, b = loops_of_two_users(open_world, f"[share:user:{USER_B}]\nweight = 3\n", b_sleep_ms=40)
    alone = SECONDS * 1000 / 8  # A's loops with a GPU of its own: 4 kernels of 2 ms
    assert a >= 0.6 * alone, (a, b, alone)


@needs_root
@pytest.mark.root
@pytest.mark.slow  # 4 s
def test_a_burst_back_from_idle_is_not_held(open_world):
    """Latency work first: B (weight 1) works 20 ms, then sleeps 30 ms, beside A (weight
    4) always busy.  B's virtual time runs ahead of A's every burst, but a burst begun
    after idle is not held for its first BURST_CREDIT_MS (30 ms) of virtual time, and
    B's 20 ms beside A are 10: B does what it does alone; held at the lead, it waited
    HOLD_MS at its launches (0.51x)."""
    a, b = loops_of_two_users(
        open_world, f"[share:user:{USER_A}]\nweight = 4\n", b_sleep_ms=30, b_launches=10
    )
    alone = SECONDS * 1000 / 50  # 10 kernels of 2 ms, then 30 ms asleep
    assert b >= 0.85 * alone, (a, b, alone)


@needs_root
@pytest.mark.root
@pytest.mark.slow  # 4 s
def test_bursts_past_their_credit_are_held_by_weight(open_world):
    """The burst credit is virtual time, not wall time: B (weight 1) works 80 ms, then
    sleeps 12 ms, beside A (weight 3) always busy.  Each burst is back from idle, but its
    credit is spent 60 ms in (30 ms of virtual time), and B is held by the weights for the
    rest; with a credit of 200 ms of wall time it kept 0.97x its pace alone."""
    a, b = loops_of_two_users(
        open_world, f"[share:user:{USER_A}]\nweight = 3\n", b_sleep_ms=12, b_launches=40
    )
    alone = SECONDS * 1000 / 92  # 40 kernels of 2 ms, then 12 ms asleep
    assert b <= 0.8 * alone, (a, b, alone)


@needs_root
@pytest.mark.root
@pytest.mark.slow  # 4 s
def test_a_cell_back_from_idle_runs_on_what_the_others_ran_meanwhile(open_world):
    """Latency first: B (weight 1) works 60 ms (a notebook's cell), then sleeps 600 ms,
    beside A (weight 4) always busy.  While B sleeps the least virtual time (A's) runs on
    150 ms; back, B may run that much (up to MAX_CREDIT_MS) before it is held, and its
    cell, charged at most 60 ms, is not.  With a credit of BURST_CREDIT_MS (30 ms) alone,
    B was held in 40-55 % of its busy looks.  Its first second is its first cell, and a
    newcomer was not away; in its last A ends."""
    _, b = two_users(open_world, f"[share:user:{USER_A}]\nweight = 4\n", 600, 30)
    seconds = fair_states(b)[1:-1]
    backlogged = sum(looks for looks, _ in seconds)
    held = sum(held for _, held in seconds)
    assert len(seconds) >= 2 and held <= 0.15 * backlogged, fair_states(b)


def fair_states(client) -> list[tuple[int, int]]:
    """(looks backlogged, looks held) of each of the shim's once-a-second fair lines, but
    its first (no second yet)."""
    return [
        (int(backlogged), int(held))
        for backlogged, held in re.findall(
            r"fair gpu=\d+ .*? backlogged=(\d+) held=(\d+)", client.stderr
        )
    ][1:]


def fair_lines(client) -> list[tuple[int, int]]:
    """(weight, looks held) of each of the shim's once-a-second fair lines (NVSHARE_DEBUG)."""
    return [
        (int(weight), int(held))
        for weight, held in re.findall(r"fair gpu=\d+ weight=(\d+) .*? held=(\d+)", client.stderr)
    ]


@needs_root
@pytest.mark.root
@pytest.mark.slow  # 7 s
def test_a_weight_and_the_switch_set_over_dbus_reach_shims_holding_a_slot(open_world):
    """Two busy processes of weight 1, side by side; then user A's weight 3 over D-Bus:
    A's shim reads it from its slot, and B, owed less now, is held.  Then the page off:
    the agent marks the slots not in use, and B is held no more."""
    bus = DbusDaemon(Path(tempfile.mkdtemp(prefix="nvs-bus-", dir="/tmp")))
    bus.start()
    try:
        agent = open_world.start_agent(config=SIDE_BY_SIDE.format(shares=""), bus=bus.address)
        busy = ("--launches", "4", "--duration-ms", "7000")
        a, b = (
            open_world.client(
                "linked", *busy, prefix=as_user(uid), kernel_us=2000, NVSHARE_DEBUG="1"
            )
            for uid in (USER_A, USER_B)
        )
        agent.wait_for_log("fair slot gpu=", count=2)
        wait_until(lambda: fair_lines(a), what=f"a fair line of A's\n{a.describe()}")
        assert fair_lines(a)[-1][0] == 1
        busctl(
            bus.address, "call", names.BUS_NAME, names.OBJECT_PATH, names.SHARES_INTERFACE,
            "SetShare", "sa{sv}", f"user:{USER_A}", "1", "weight", "u", "3",
        )  # fmt: skip
        agent.wait_for_log(rf"fair weight gpu=\S+ pid={a.pid} weight=3")
        wait_until(lambda: fair_lines(a)[-1][0] == 3, what=f"A's weight 3\n{a.describe()}")
        wait_until(lambda: any(held for _, held in fair_lines(b)), what="B held")
        busctl_on_agent(bus.address, "set-property", "FairPage", "s", "off")
        after = len(fair_lines(b)) + 1  # the next line may count looks from before
        wait_until(lambda: len(fair_lines(b)) > after, what=f"B's lines\n{b.describe()}")
        assert [held for _, held in fair_lines(b)[after:]] == [0] * (len(fair_lines(b)) - after)
        for client in (a, b):
            client.finish_ok(timeout=60)
    finally:
        bus.stop()
