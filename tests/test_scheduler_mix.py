"""Issue 35's CPU-side points on the core, with clients that do what a node's real mix
does: trainers keep the GPU busy all the time, inference servers a few ms every 50 ms,
notebooks run cells; most of them measure it (FEATURE_USAGE, Scheduler.gpu_usage).
Time is an argument: nothing here sleeps.

A file of its own because tests/test_scheduler_auto.py, whose helpers these use, had
passed 1,000 lines; docs/scheduling.md states the rules and the bounds shown here."""

from __future__ import annotations

import itertools
import random

import pytest
from test_scheduler_auto import (
    AUTO,
    BEFORE_DRAIN,
    G0,
    GIB,
    LIGHT_WAIT,
    TQ,
    MeasuredMix,
    hold_for,
    make,
    of,
    one,
    spin_guarded_tick,
)

from nvshare_agent.actions import AskToDrop, Grant, Queued, Revoke
from nvshare_agent.core_state import FEATURE_USAGE, FEATURE_YIELD
from nvshare_agent.scheduler import Scheduler
from nvshare_agent.settings import AntiThrash

# ---------------------------------------------------------------- light and busy: GPU time


def steady_client_beside_a_trainer(features: int) -> tuple[Scheduler, Grant, list]:
    """A trainer (1) holds the turn from 0, its GPU busy all the time; a steady client
    (2), an inference server, asks at 1 s and holds its lease for 60 s: a 1 ms kernel
    every 50 ms, never idle a second, so it never gives the lease back.  Where the shims
    measure, each reports its GPU time every 100 ms.  Returns the core, 2's grant and
    the (time, ask to drop) it got."""
    s = make(2, features=features)
    one(Grant, s.request(1, G0, 0.0))
    steady = one(Grant, s.request(2, G0, 1.0))
    busy_us = {1: 0, 2: 0}
    drops = []
    for step in range(1, 60_001):  # 1 ms steps, 1 s to 61 s
        now = 1.0 + step / 1000
        busy_us[1] += 1000
        busy_us[2] += 1000 if step % 50 == 0 else 0
        while (due := s.next_deadline()) is not None and due <= now:
            drops += [(due, d) for d in of(AskToDrop, s.tick(due)) if d.client == 2]
        if step % 100 == 0 and features & FEATURE_USAGE:
            for client in (1, 2):
                s.gpu_usage(client, G0, busy_us[client], now)
    return s, steady, drops


def test_a_steady_client_that_holds_its_lease_a_minute_beside_a_trainer_stays_light():
    s, steady, drops = steady_client_beside_a_trainer(FEATURE_YIELD | FEATURE_USAGE)
    assert (steady.role, steady.waited_s) == ("beside", 0.0)
    assert drops == [], "dropped as no longer light"
    assert s.gpus[G0].holders[2].number == steady.lease  # the same lease, 60 s on
    assert s._usage(2, G0, 61.0) < 0.03 < 0.9 < s._usage(1, G0, 61.0)  # 2 % against ~1


def test_without_gpu_time_the_steady_clients_hold_stands_in_and_it_counts_busy():
    # The contrast: an older shim reports no GPU time, so holding its lease counts as
    # use (as all leases did before issue 35): the same client is soon no longer light.
    _, _, drops = steady_client_beside_a_trainer(FEATURE_YIELD)
    (at, drop), *_ = drops
    assert drop.reason == "no longer light" and at < 1.0 + 3.0


@pytest.mark.parametrize("lease_s", [0.1, None], ids=["leases of 100 ms", "one lease"])
def test_a_trainer_is_busy_by_its_gpu_time_whatever_its_leases(lease_s):
    # 1 trains and holds the turn.  2 trains too, from 0.5 s, its GPU busy all the while
    # it holds a lease: either it gives the lease back every 100 ms and asks again at
    # once (short leases), or it keeps it.  Memory fits: new, with no use yet, it runs
    # beside the turn; once its use shows it busy, it is no longer let beside (its
    # request waits) or it is asked to leave, and waits for the turn, which it takes
    # when 1's quantum is over.
    s = make(2, features=FEATURE_YIELD | FEATURE_USAGE)
    held = {1: one(Grant, s.request(1, G0, 0.0))}
    busy_us = {1: 0, 2: 0}
    releases: dict[int, float] = {}  # asked to drop: when its queued work has drained
    judged_busy_at, turn = None, None
    for step in range(1, int((TQ + 1) * 1000)):  # 1 ms steps
        now = step / 1000
        for client in held:
            busy_us[client] += 1000
        actions = []
        if step % 100 == 0:
            for client in (1, 2):
                s.gpu_usage(client, G0, busy_us[client], now)
        if 2 in held and lease_s and step % round(lease_s * 1000) == 0:
            actions += s.release(2, G0, held.pop(2).lease, now)
        for client, at in list(releases.items()):
            if now >= at - 1e-9:
                del releases[client]
                actions += s.release(client, G0, held.pop(client).lease, now)
        for client in (1, 2):
            if client not in held and client not in s.gpus[G0].waiters and step >= 500:
                actions += s.request(client, G0, now)  # both busy: they ask again at once
        while (due := s.next_deadline()) is not None and due <= now:
            actions += s.tick(due)
        for drop in of(AskToDrop, actions):
            if drop.when_idle_ms == 0:
                releases[drop.client] = now + 0.02
            if drop.client == 2:
                assert (drop.reason, judged_busy_at) == ("no longer light", None)
                judged_busy_at = now
        if 2 in s.gpus[G0].waiters and judged_busy_at is None:
            judged_busy_at = now  # its request waits: no longer let beside
        for grant in of(Grant, actions):
            held[grant.client] = grant
            if grant.client == 2 and judged_busy_at is not None:
                turn = grant
        if turn is not None:
            break
    assert judged_busy_at is not None and 0.5 < judged_busy_at < 4.0, judged_busy_at
    assert turn is not None and turn.role == "turn" and now == pytest.approx(TQ, abs=0.05)


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


# ---------------------------------------------------------------- a node's mix, walked at random

STEP_S = 0.001
# What a holder asked to drop still runs: the work its shim has queued (the queue bound
# keeps it short: shim/queue_bound.c), at most about a trainer's step, under DRAIN_MS.
QUEUED_S = 0.02
# A measuring shim reports its GPU time at most this often, and at every release
# (shim/usage_meter.c, shim/lock_client.c).
REPORT_S = 0.1
IDLE_RELEASE_S = 1.0
TRAINER, SERVER, NOTEBOOK = "trainer", "server", "notebook"
# Memory per kind in each staging of the 80 GiB GPU (managed bytes; each client's
# context counts 512 MiB more, 2.5 GiB for five): everything fits; trainers do not fit
# two together but light work fits beside any of them (issue 35's b.); light work fits
# beside no trainer, but beside other light work (windows, batched).
MEMORY = {
    "fits": {TRAINER: 10 * GIB, SERVER: 2 * GIB, NOTEBOOK: 2 * GIB},
    "pairs": {TRAINER: 40 * GIB, SERVER: 2 * GIB, NOTEBOOK: 2 * GIB},
    "windows": {TRAINER: 76 * GIB, SERVER: 1 * GIB, NOTEBOOK: 1 * GIB},
}


class MixClient:
    """One process of the mix, as its shim acts: it asks for the GPU when it has work
    and no lease, runs its work while it holds one and reports the GPU time (if it
    measures), gives the lease back once idle idle_release_ms (a shared lease without
    release_when_idle it keeps, unless it is an older shim: docs/protocol.md), once
    its queued work has run when asked to drop, once idle as long as asked when asked
    to yield (only if it announced YIELD).  Work: a trainer always has some; an
    inference server 1-3 ms every ~50 ms; a notebook a cell of 15 or 150 ms every
    0.7-2.3 s (issue 35's mix)."""

    def __init__(self, kind: str, features: int, now: float, rng: random.Random):
        self.kind, self.features, self.rng = kind, features, rng
        self.work_s = 1e9 if kind == TRAINER else 0.0
        self.next_work = now + rng.uniform(0, 0.05)
        self.leaves_at = now + rng.uniform(3.0, 15.0)
        self.grant: Grant | None = None
        self.release_at: float | None = None  # asked to drop: once its queued work has run
        self.yield_idle_s: float | None = None  # asked to yield: once idle this long
        self.idle_since: float | None = None  # holding, with no work since
        self.busy_s = 0.0
        self.reported_s, self.reported_at = 0.0, now
        # While it waits: since when, and whether it cut in when it asked.
        self.asked_at: float | None = None
        self.cut_in = False
        self.windows_ahead: set[int] = set()

    def gives_back(self, now: float) -> bool:
        assert self.grant is not None
        idle_s = -1.0 if self.idle_since is None else now - self.idle_since
        if self.release_at is not None:
            return now >= self.release_at - 1e-9
        if self.yield_idle_s is not None and idle_s >= self.yield_idle_s - 1e-9:
            return True
        # An older shim gives back any lease idle idle_release_ms; a newer one keeps a
        # shared lease without release_when_idle (anti-thrash off) while it is idle.
        kept_while_idle = self.features & FEATURE_YIELD and not (
            self.grant.exclusive or self.grant.release_when_idle
        )
        return idle_s >= IDLE_RELEASE_S - 1e-9 and not kept_while_idle

    def new_work(self, now: float) -> None:
        if self.kind == TRAINER or now < self.next_work:
            return
        if self.kind == SERVER:
            self.work_s += self.rng.choice((0.001, 0.002, 0.003))
            self.next_work = now + self.rng.uniform(0.03, 0.07)
        else:
            self.work_s += self.rng.choice((0.015, 0.15))
            self.next_work = now + self.rng.uniform(0.7, 2.3)


class NodeMix:
    """A random walk of the mix on one GPU, in 1 ms steps: n clients at any time of
    random kinds, most with shims that measure their GPU time, some older (YIELD only,
    or nothing); each leaves after 3-15 s, whatever it is doing (done, or a crash),
    and a new one takes its place.  Each step checks the bounds of docs/scheduling.md."""

    def __init__(self, seed: int, mode: AntiThrash, staging: str, n: int = 5, scripted=False):
        """n: the clients on the GPU at any time; scripted: none at random, the caller
        joins its own (at most n)."""
        self.rng = random.Random(seed)
        self.mode, self.staging = mode, staging
        self.tq, grace = 2, 0.5
        self.settings = AUTO.replaced(
            anti_thrash=mode,
            time_quantum_s=self.tq,
            drop_grace_ms=int(grace * 1000),
            idle_release_ms=int(IDLE_RELEASE_S * 1000),
        )
        self.s = Scheduler(self.settings)
        self.s.add_gpu(G0, "GPU", 80 * GIB)
        self.tick = spin_guarded_tick(self.s)  # fails on a tick that spins
        # One share group (every client is uid 1000): TQ + n x (TQ + drop_grace_ms).
        self.starvation_bound = self.tq + n * (self.tq + grace) + 1e-6
        # A waiter that cut in when it asked (also while one has waited a quantum: the
        # turn cut short keeps its clock) is granted within its light wait: the holders
        # in its way are asked to drop light_wait_ms less DRAIN_MS after it asked, or
        # once each has run
        # min_slice_ms if later (rules 6 and 7; a lease granted beside them just before
        # runs that long), then run out their queued work (QUEUED_S, all the drain this
        # walk gives a holder asked to drop): light_wait_ms + min_slice_ms + QUEUED_S, and
        # two 1 ms steps (a release, a grant).  Plus one window (min_slice_ms, the drain,
        # the steps) for each waiter that cuts in ahead of it in request order and cannot
        # share a window with it (a new trainer, light by its nil use; rule 5.3).
        self.window_s = self.settings.min_slice_ms / 1000 + QUEUED_S + 2 * STEP_S
        self.light_wait_s = self.settings.light_wait_ms / 1000
        self.clients: dict[int, MixClient] = {}
        self.ids = itertools.count(1)
        self.now = 0.0
        self.waits: list[float] = []
        self.grants: list[tuple[float, Grant, int | None]] = []  # (when, grant, turn holder)
        self.drops: list[tuple[float, AskToDrop]] = []
        self.cut_in_waits: list[float] = []
        self.comings_and_goings = 0
        for _ in range(0 if scripted else n):
            self.join()

    def join(self, client: MixClient | None = None) -> int:
        """A new client: `client`, or one of a random kind and shim."""
        c = next(self.ids)
        if client is None:
            kind = self.rng.choice((TRAINER, SERVER, SERVER, NOTEBOOK, NOTEBOOK))
            features = self.rng.choice((FEATURE_YIELD | FEATURE_USAGE,) * 3 + (FEATURE_YIELD, 0))
            client = MixClient(kind, features, self.now, self.rng)
        self.clients[c] = client
        self.s.connect(c, 100 + c, 1000, 1000, self.now)
        self.s.hello(c, (G0,), client.kind, self.now, features=client.features)
        self.note(self.s.memory_report(c, G0, MEMORY[self.staging][client.kind], 0, self.now))
        return c

    def leave(self, c: int) -> None:
        del self.clients[c]
        self.note(self.s.disconnect(c, self.now))
        self.comings_and_goings += 1
        self.join()

    def note(self, actions: list) -> None:
        """What the agent said: grants (checked against the bounds), asks to drop or
        to yield, revokes."""
        for grant in of(Grant, actions):
            assert grant.waited_s <= self.starvation_bound, (grant, self.starvation_bound)
            client = self.clients.get(grant.client)
            if client is None:
                continue
            if client.cut_in:
                bound = self.light_wait_s + (1 + len(client.windows_ahead)) * self.window_s
                assert grant.waited_s <= bound, (
                    f"a {client.kind} (features {client.features}) that cut in at "
                    f"{client.asked_at:.3f} waited {grant.waited_s:.3f} s, "
                    f"{len(client.windows_ahead)} windows ahead of it"
                )
                self.cut_in_waits.append(grant.waited_s)
            self.waits.append(grant.waited_s)
            self.grants.append((self.now, grant, self.s._turn_holder(self.s.gpus[G0])))
            client.grant, client.asked_at = grant, None
            client.release_at = client.yield_idle_s = None
            client.idle_since = None if client.work_s > 0 else self.now
        for drop in of(AskToDrop, actions):
            self.drops.append((self.now, drop))
            client = self.clients.get(drop.client)
            if client is None or client.grant is None or client.grant.lease != drop.lease:
                continue
            if not drop.when_idle_ms:
                client.release_at = self.now + max(STEP_S, min(client.work_s, QUEUED_S))
            elif client.features & FEATURE_YIELD:
                client.yield_idle_s = drop.when_idle_ms / 1000
        for revoke in of(Revoke, actions):
            client = self.clients.get(revoke.client)
            if client is not None:
                client.grant = None  # what work it has left, it asks for again

    def ask(self, c: int, client: MixClient) -> None:
        client.asked_at, client.idle_since = self.now, None
        client.windows_ahead = set()
        actions = self.s.request(c, G0, self.now)
        waiter = self.s.gpus[G0].waiters.get(c)
        client.cut_in = waiter is not None and waiter.cuts_in
        self.note(actions)

    def release(self, c: int, client: MixClient) -> None:
        assert client.grant is not None
        idle_s = 0.0 if client.idle_since is None else self.now - client.idle_since
        self.report(c, client, force=True)
        lease, client.grant = client.grant.lease, None
        self.note(self.s.release(c, G0, lease, self.now, idle_ms=round(idle_s * 1000)))

    def report(self, c: int, client: MixClient, force: bool = False) -> None:
        if not client.features & FEATURE_USAGE or client.busy_s == client.reported_s:
            return
        if force or self.now - client.reported_at >= REPORT_S - 1e-9:
            client.reported_s, client.reported_at = client.busy_s, self.now
            self.note(self.s.gpu_usage(c, G0, round(client.busy_s * 1e6), self.now))

    def step(self) -> None:
        self.now = now = round(self.now + STEP_S, 6)
        for c, client in list(self.clients.items()):
            if now >= client.leaves_at:
                self.leave(c)
                continue
            client.new_work(now)
            if client.grant is not None and client.work_s > 0:  # it ran the last 1 ms
                client.busy_s += STEP_S
                client.work_s -= STEP_S
                if client.work_s < 1e-9:
                    client.work_s, client.idle_since = 0.0, now
            self.report(c, client)
        for c, client in list(self.clients.items()):
            if client.grant is None:
                continue
            if client.gives_back(now):
                self.release(c, client)
        for c, client in self.clients.items():
            if client.work_s > 0:
                if client.grant is None and client.asked_at is None:
                    self.ask(c, client)
                elif client.grant is not None:
                    client.idle_since = None
        due = self.s.next_deadline()
        if due is not None and due <= now + 1e-9:
            self.note(self.tick(now))
        # Waiters: the starvation bound for each (one left waiting for ever would never
        # show up among the grants); the light-wait bound holds also while one has waited
        # a quantum.  (One that cut in could be judged again to wait for the turn, rule 2;
        # no walk here has done so, and the bound holds.)
        gpu = self.s.gpus[G0]
        for c, waiter in gpu.waiters.items():
            waited = now - waiter.requested_at
            assert waited <= self.starvation_bound, (self.clients[c].kind, waited)
            client = self.clients[c]
            if client.cut_in:
                client.windows_ahead.update(
                    other
                    for other, ahead in gpu.waiters.items()
                    if ahead.cuts_in
                    and ahead.requested_at < waiter.requested_at
                    and not self.s._fits(gpu, [c, other], keeping=False)
                )

    def run(self, seconds: float) -> None:
        while self.now < seconds:
            self.step()


WALKS = [(seed, AntiThrash.AUTO, staging) for seed in range(6) for staging in MEMORY] + [
    (seed, mode, "pairs") for seed in range(4) for mode in (AntiThrash.ON, AntiThrash.OFF)
]


@pytest.mark.parametrize("seed, mode, staging", WALKS, ids=lambda v: str(v))
def test_a_node_mix_that_comes_and_goes_waits_no_one_past_the_bounds(seed, mode, staging):
    """Trainers, inference servers and notebooks come and go for 30 s on one GPU, under
    every mode, and under auto with memory staged three ways: no tick spins, no one
    waits past the starvation bound, and under auto light work that cuts in (and a new
    trainer does, by its nil use) is served within its light wait, plus the minimum
    slice and the drain, also while someone has waited a quantum."""
    mix = NodeMix(seed, mode, staging)
    mix.run(30.0)
    assert mix.comings_and_goings > 5, "no one came or went"
    # Under off a lease is kept while idle, under on until its quantum is over; under
    # auto, servers beside a turn keep theirs while they fit beside it.
    assert len(mix.waits) > (40 if mode is AntiThrash.AUTO else 15), "it tests little"
    if mode is AntiThrash.ON:
        assert max(mix.waits) > mix.tq / 2, "no one waited"
    if staging == "windows":  # light work waits for windows: the light-wait bound is shown
        assert len(mix.cut_in_waits) > 20 and max(mix.cut_in_waits) > LIGHT_WAIT / 2


# ---------------------------------------------------------------- co-running by memory pairs


class Scripted(MixClient):
    """A client of the mix with work at fixed times: `burst_s` of GPU work every
    `period_s` from `now` (a trainer: always), staying for good."""

    def __init__(self, kind: str, now: float, period_s: float = 0.0, burst_s: float = 0.0):
        super().__init__(kind, FEATURE_YIELD | FEATURE_USAGE, now, random.Random(0))
        self.period_s, self.burst_s = period_s, burst_s
        self.next_work, self.leaves_at = now, float("inf")

    def new_work(self, now: float) -> None:
        if self.kind != TRAINER and now >= self.next_work - 1e-9:
            self.work_s += self.burst_s
            self.next_work += self.period_s


def test_trainers_that_do_not_fit_together_take_turns_with_light_work_beside_each():
    # Issue 35's b.: two trainers of 40 GiB on an 80 GiB GPU do not fit together; an
    # inference server (a 1 ms kernel every 50 ms: it never gives its lease back) and a
    # notebook (a 15 ms cell every 2 s: it gives its lease back a second after each)
    # have 2 GiB each and fit beside either.  The trainers take turns (of 5 s here);
    # light work is granted beside whichever holds the turn, at once, never in a
    # window, and is never asked to leave as the turn changes hands.
    mix = NodeMix(0, AntiThrash.AUTO, "pairs", n=4, scripted=True)
    mix.settings = mix.settings.replaced(time_quantum_s=5)
    mix.note(mix.s.change_settings(mix.settings, 0.0))
    mix.now = 30.0
    trainers = [mix.join(Scripted(TRAINER, mix.now)) for _ in range(2)]
    for c in trainers:
        # Both have trained before (their first reports say so): neither is new, and
        # light (a new trainer's first turns: test_scheduler_auto.py's windows).
        mix.clients[c].busy_s = mix.clients[c].reported_s = 30.0
        mix.s.gpu_usage(c, G0, 30_000_000, mix.now)
    server = mix.join(Scripted(SERVER, mix.now + 0.5, period_s=0.05, burst_s=0.001))
    notebook = mix.join(Scripted(NOTEBOOK, mix.now + 0.7, period_s=2.0, burst_s=0.015))
    mix.run(90.0)
    turns = [grant.client for _, grant, _ in mix.grants if grant.role == "turn"]
    assert set(turns) == set(trainers) and len(turns) >= 10
    assert all(a != b for a, b in itertools.pairwise(turns)), "they take turns"
    busy = [mix.clients[c].busy_s - 30.0 for c in trainers]  # (each came with 30 s)
    assert 0.45 <= busy[0] / sum(busy) <= 0.55 and sum(busy) > 0.99 * 60, busy
    light = [(grant, turn) for _, grant, turn in mix.grants if grant.client in (server, notebook)]
    assert len(light) > 15
    for grant, turn in light:
        assert (grant.role, grant.waited_s) == ("beside", 0.0), grant
        assert turn in trainers, "granted in a window"
    assert [g.client for g, _ in light].count(server) == 1  # one lease, a minute on
    assert not [drop for _, drop in mix.drops if drop.client in (server, notebook)]


def test_light_work_gets_windows_while_a_busy_waiter_has_waited_a_quantum():
    # Three trainers that fit with no one: one of them has always waited a quantum.  A
    # loader that fits beside no trainer once waited like them (89 s in a simulation):
    # no window opened while anyone had waited TQ.  Windows now come in every turn, which
    # keeps its clock: the trainers still change turns only at the quantum's end.
    s = make(4, features=FEATURE_YIELD | FEATURE_USAGE)
    for client, gib in {1: 45, 2: 45, 3: 45, 4: 35}.items():
        s.memory_report(client, G0, gib * GIB, 0, now=0.0)
    mix = MeasuredMix(s, {1: 1.0, 2: 1.0, 3: 1.0, 4: 0.03})
    for client in (1, 2, 3):
        mix.ask(client)
        mix.run_until(mix.now + 1.0)
    mix.run_until(35.0)
    mix.ask(4)
    mix.run_until(160.0)
    loader = [grant for _, grant in mix.grants if grant.client == 4]
    assert len(loader) > 100
    bound = LIGHT_WAIT + s.settings.min_slice_ms / 1000 + 0.03  # the drain, the yield
    assert all(g.role == "beside" and g.waited_s <= bound for g in loader), max(
        g.waited_s for g in loader
    )
    turns = [(t, g.client) for t, g in mix.grants if g.role == "turn"]
    changes = [turns[0]] + [b for a, b in itertools.pairwise(turns) if a[1] != b[1]]
    assert [c for _, c in changes] == [1, 2, 3, 1, 2, 3], changes
    for (began, _), (next_began, _) in itertools.pairwise(changes):
        assert TQ <= next_began - began <= TQ + 0.2, changes
    assert sum(mix.busy_s[c] for c in (1, 2, 3)) > 0.85 * 160, mix.busy_s


def test_a_turn_cut_short_past_its_quantum_is_a_new_turn_when_its_holder_gets_the_next():
    # 1's turn was cut short for a window that ran past its quantum; 1 (the least use)
    # is the best waiter when 2's turn ends.  It gets a new turn: the old one's clock
    # once came back with it, a turn over as soon as granted, dropped at once.
    s = make(2, features=FEATURE_YIELD | FEATURE_USAGE, hello_at=-60.0)
    for client in (1, 2):
        s.memory_report(client, G0, 45 * GIB, 0, now=0.0)  # they do not fit together
    s.gpu_usage(1, G0, 20_000_000, 0.0)
    s.gpu_usage(2, G0, 50_000_000, 0.0)
    second = one(Grant, s.request(2, G0, 0.0))
    assert of(Queued, s.request(1, G0, 1.0))
    s.gpus[G0].turn_paused = (1, -TQ)  # its turn, cut short a quantum ago
    turn = one(Grant, s.release(2, G0, second.lease, 2.0))
    assert (turn.client, turn.role) == (1, "turn")
    actions = s.request(2, G0, 2.001)  # busy: it asks again at once
    assert not [d for d in of(AskToDrop, actions) if d.reason == "quantum over"], actions
    assert s.gpus[G0].holders[1].turn_since == 2.0
