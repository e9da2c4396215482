"""The lock's policy, per GPU: given one GPU's state at `now`, whom to grant, whom to ask
to yield or to drop, whom to revoke (docs/scheduling.md, "The policy" states it in the
order decide() applies it).

One idea for anti-thrash auto: who may run together is a question of memory alone, except
that two clients that each keep the GPU busy take turns where that beats interleaving them;
who goes first, and who gives way, of GPU time per weight: the waiter owed most goes first,
and work in bursts owed more than a holder in its way cuts that holder's turn short.

decide() returns the actions *and* the next moment any rule could act: every comparison
with the clock goes through Moments.reached(), which notes the moments not reached yet,
so the deadline can never disagree with the rules.  Pure, like the rest of the core: no
clock, no I/O.  The scheduler (scheduler.py) owns the state and hands it in.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import NamedTuple

from . import memory_fit
from .actions import Action
from .core_state import EXCLUSIVE, SHARED, ClientState, GpuState, Waiter
from .deadlines import Moments
from .leases import DropReason, Leases, Role, alone_duty, shown_duty
from .settings import AntiThrash
from .share_groups import GroupAccount, ShareGroups
from .usage import CHECK_S, meter_of

# A client whose use (GPU time, 0..1) is this or more keeps the GPU busy (a trainer reads
# 0.92-0.97 alone; work late on every cycle beside others reads it too); with no stretch
# alone there, from BESIDE_SATURATING_USE (two trainers side by side: 0.90-0.93). Two such
# take turns where turns pay (two trainers: 1.003x in turns, 0.91x interleaved, H100).
SATURATING_USE = 0.95
BESIDE_SATURATING_USE = 0.9
# A turn's length where nothing pages (they fit, or only memory_limit keeps them apart):
# short turns keep each one's share over seconds, not minutes of TQ.
BUSY_TURN_S = 0.5
# Where memory keeps two apart, each handover brings back what the other pushed out: a
# turn lasts this many times that (at most TQ): paging costs ~a tenth of the GPU's time.
TURN_PER_PAGE_IN = 10
# Work in bursts may cut in: its use under LIGHT_USE (a server's 20 requests of ~1 ms a
# second ~0.03, a notebook's cells ~0.05, a loader's batches ~0.04: light, it never stops
# turns from paying), or its last lease under BURST_USE busy (a trainer's 0.8 and more).
LIGHT_USE = 0.1
BURST_USE = 0.5
# How long a turn takes to drain once asked to drop (its shim bounds its queue meanwhile):
# the drop is asked this much before a cutting-in waiter's light wait is up.
DRAIN_MS = 25


# Who is owed GPU time, least first (Policy._standing); the order of waiters, first first
# (Policy._priority): a key whose first item is false is overdue.
Standing = Callable[[int], tuple[float, float]]
Priority = Callable[[int], tuple[object, ...]]


class Look(NamedTuple):
    """Read once a look (a grant in it changes them at the next): memory, who is owed,
    whether turns between busy clients pay (Policy._turns_pay), and the waiters' order."""

    demand: memory_fit.Demand
    standing: Standing
    pays: bool
    priority: Priority


class WaitCause(enum.Enum):
    """Why a waiter waits (status and the metrics count its wait by these)."""

    MEMORY = "memory"  # its memory does not fit beside the holders in its way
    TURN = "turn"  # another's turn: both keep the GPU busy (anti-thrash on: the queue)
    LATENCY = "latency work"  # work in bursts that cut in holds the GPU
    SHARE = "share"  # others are owed more: behind an overdue waiter, or a turn that goes on


class Policy:
    """The rules over the scheduler's state (the dicts are the scheduler's own)."""

    def __init__(
        self,
        clients: dict[int, ClientState],
        gpus: dict[bytes, GpuState],
        shares: ShareGroups,
    ):
        self.clients = clients
        self.gpus = gpus
        self.shares = shares
        self.leases = Leases(clients, gpus, self.usage, self.note_wait)  # acts on them
        self._uses: dict[int, float] | None = None  # read once a look (_auto), else None

    # ------------------------------------------------------------ what the rules read

    def usage(self, client: int, uuid: bytes, now: float) -> float:
        uses = {} if self._uses is None else self._uses
        if client not in uses:
            meter = self.clients[client].usage.get(uuid)
            uses[client] = 0.0 if meter is None else meter.at(now)
        return uses[client]

    def saturating(self, gpu: GpuState, client: int, now: float) -> bool:
        """Keeps the GPU busy by itself: its use is SATURATING_USE or more, or, not light,
        its latest stretch alone was that busy (a trainer between turns, use dipping), or,
        none told there (it came beside others), its use is BESIDE_SATURATING_USE."""
        use = self.usage(client, gpu.uuid, now)
        if use >= SATURATING_USE or use < LIGHT_USE:
            return use >= SATURATING_USE
        alone = alone_duty(self.clients[client], gpu.holders.get(client), gpu.uuid)
        return alone >= SATURATING_USE if alone is not None else use >= BESIDE_SATURATING_USE

    def _turns_pay(self, gpu: GpuState, now: float) -> bool:
        """Turns between two that keep the GPU busy pay only where the turn runs alone but for
        light work (of the holders that stay): beside a third at work the driver switches
        anyway, and a turn only moves time from the waiter to the third (f4: 0.79x, H200)."""
        return all(
            self.usage(c, gpu.uuid, now) < LIGHT_USE or self.saturating(gpu, c, now)
            for c, held in gpu.holders.items()
            if held.drop_requested_at is None
        )

    def _look(self, gpu: GpuState, at: Moments) -> Look:
        """What the rules read once a look; the share groups' accounts are brought up to
        now once for it."""
        accounts = self.shares.look(gpu, self.clients, at.now)
        standing = self._standing(gpu, at.now, accounts)
        demand = memory_fit.Demand(gpu, self.clients)
        return Look(
            demand, standing, self._turns_pay(gpu, at.now), self._priority(gpu, at, accounts)
        )

    def _standing(self, gpu: GpuState, now: float, accounts: dict[str, GroupAccount]) -> Standing:
        """Who is owed GPU time, least first: its share group's charge (GPU time over
        weight, share_groups.py), then its own recent use."""
        charged = self.shares.charged(gpu, self.clients, accounts)
        return lambda client: (charged(client), self.usage(client, gpu.uuid, now))

    def bursty(self, gpu: GpuState, client: int, now: float) -> bool:
        """Work in bursts (a request, a cell, a batch): its use is under LIGHT_USE, or its
        last lease there busy under BURST_USE of its length (a trainer's are busier, paused
        or cut off).  A newcomer is taken to work in bursts until its first lease tells."""
        state = self.clients[client]
        return (
            self.usage(client, gpu.uuid, now) < LIGHT_USE
            or state.lease_duty.get(gpu.uuid, 0.0) < BURST_USE
        )

    def _cuts_in(self, gpu: GpuState, look: Look, waiter: int, holder: int, now: float) -> bool:
        """Latency work first: a waiter in bursts owed more than the holder in its way."""
        return self.bursty(gpu, waiter, now) and look.standing(waiter) < look.standing(holder)

    def fits(
        self,
        gpu: GpuState,
        running: list[int],
        keeping: bool,
        demand: memory_fit.Demand | None = None,
    ) -> bool:
        """Whether these clients fit the GPU at once (demand: its figures, if read).  keeping:
        they run and may stay up to the line; a newcomer comes in only below it less the band
        (memory_fit).  Alone, anyone fits: it pages with nobody to thrash against."""
        if len(running) <= 1:
            return True
        demand = demand or memory_fit.Demand(gpu, self.clients)
        return demand.fits(demand.of(running), keeping)

    # ------------------------------------------------------------ the decision, per GPU

    def decide(self, gpu: GpuState, now: float, actions: list[Action]) -> float | None:
        """The rules for one GPU at `now`: appends their actions, returns the next moment
        one of them could act (None: only an event can change anything)."""
        at = Moments(now)
        self.leases.revoke_overdue(gpu, at, actions)
        mode = gpu.settings.anti_thrash
        if mode is AntiThrash.OFF:
            while gpu.waiters:
                self.leases.grant(gpu, next(iter(gpu.waiters)), now, SHARED, Role.BESIDE, actions)
        elif mode is AntiThrash.ON:
            self._first_come_turns(gpu, at, actions)
        else:
            self._auto(gpu, at, actions)
        self.leases.revoke_overdue(gpu, at, actions)  # notes when the drops just asked come due
        return at.next

    def _first_come_turns(self, gpu: GpuState, at: Moments, actions: list[Action]) -> None:
        """anti-thrash on: one exclusive holder, first come first served, turns of TQ."""
        if not gpu.waiters:
            return
        for client, waiter in gpu.waiters.items():
            self.note_wait(gpu, client, waiter, WaitCause.TURN.value, at.now)
        if not gpu.holders:
            self.leases.grant(gpu, next(iter(gpu.waiters)), at.now, EXCLUSIVE, Role.TURN, actions)
        if len(gpu.holders) == 1 and gpu.waiters:  # the turn's end, due while others wait
            client, held = next(iter(gpu.holders.items()))
            if held.drop_requested_at is None and at.reached(
                held.granted_at + gpu.settings.time_quantum_s
            ):
                self.leases.ask_to_drop(gpu, client, held, at.now, actions, DropReason.QUANTUM_OVER)

    def _auto(self, gpu: GpuState, at: Moments, actions: list[Action]) -> None:
        now = at.now
        light_wait_s = gpu.settings.light_wait_ms / 1000.0
        # A client kept waiting is no lighter for it: past the light wait, its use stops
        # decaying until its grant (usage.py; not from its request: f8 waited to 12 s, H200).
        for client, waiter in gpu.waiters.items():
            since = waiter.requested_at + light_wait_s
            if at.reached(since):
                meter_of(self.clients[client], gpu.uuid, now).freeze(since)
        # The figures do not change while the rules look (a grant's thaw keeps the frozen
        # figure): read them once ("pays" again once holders are asked to go).
        self._uses = {}
        try:
            look = self._look(gpu, at)
            if self._keep_holders_apart(gpu, look, at, actions):
                look = look._replace(pays=self._turns_pay(gpu, now))
            blocked = self._grant_what_fits(gpu, look, at, actions)
            self._make_room(gpu, look, blocked, at, actions)
        finally:
            self._uses = None
        if gpu.waiters or len(gpu.holders) > 1:
            at.reached(now + CHECK_S)  # uses change as they run: look again

    def _keep_holders_apart(
        self, gpu: GpuState, look: Look, at: Moments, actions: list[Action]
    ) -> bool:
        """Holders that may no longer run together: those that stopped fitting (a report
        grew), newest first; and, where turns pay, of those that keep the GPU busy all but
        the one owed most, whose turn still counts from its grant.  Whether any was asked."""
        holding = [c for c, held in gpu.holders.items() if held.drop_requested_at is None]
        staying = list(holding)
        for client in reversed(staying[1:]):  # the first granted stays: alone, it fits
            if self.fits(gpu, staying, keeping=True, demand=look.demand):
                break
            if self.clients[client].managed.get(gpu.uuid, 0):  # else its going frees nothing
                held = gpu.holders[client]
                self.leases.ask_to_drop(
                    gpu, client, held, at.now, actions, DropReason.MEMORY_DOES_NOT_FIT
                )
                staying.remove(client)
        # Of those that keep it busy, the one owed most keeps its turn (the first granted
        # of equals): else weights were lost each time two came to run side by side.
        saturating = sorted(
            (c for c in staying if self.saturating(gpu, c, at.now)), key=look.standing
        )
        pays = look.pays if staying == holding else self._turns_pay(gpu, at.now)  # of those left
        if len(saturating) > 1 and pays:
            for client in saturating[1:]:
                held = gpu.holders[client]
                self.leases.ask_to_drop(
                    gpu, client, held, at.now, actions, DropReason.BOTH_SATURATE
                )
                staying.remove(client)
        return staying != holding

    def _priority(self, gpu: GpuState, at: Moments, accounts: dict[str, GroupAccount]) -> Priority:
        """The order of waiters, first first: one overdue (waited its group's fair
        turns, or TQ), oldest first; then by share groups (the group charged least GPU
        time over its weight, share_groups.py), then the least recent use, then request
        order.  A key whose first item is false is overdue."""
        by_groups = self.shares.turn_order(gpu, self.clients, accounts, at.now, at.reached)
        quantum = gpu.settings.time_quantum_s

        def key(client: int) -> tuple[object, ...]:
            if by_groups is not None:
                return by_groups(client)
            waiter = gpu.waiters[client]
            starving = at.reached(waiter.requested_at + quantum)
            used = 0.0 if starving else self.usage(client, gpu.uuid, at.now)
            return (not starving, used, waiter.requested_at)

        return key

    def in_the_way(self, gpu: GpuState, client: int, now: float) -> list[int]:
        """The holders that keep `client` from running now (empty: it may run)."""
        by_memory, by_busy = self._conflicts(gpu, client, now, self._look(gpu, Moments(now)))
        return by_memory + by_busy

    def _conflicts(
        self,
        gpu: GpuState,
        client: int,
        now: float,
        look: Look,
    ) -> tuple[list[int], list[int]]:
        """The holders that keep `client` from running now, as (by memory, by busy):
        those whose memory it does not fit beside (the one owed least first, the newest
        of equals, until it fits, less those it fits beside after all: else the first
        granted kept the GPU for good), and, where turns pay, of the rest each that keeps
        the GPU busy where it does too.  Both empty: it may run."""
        demand = look.demand
        rest = sorted(gpu.holders, key=look.standing)
        # fits(rest + client), with the demand kept as a sum: one look per holder, not
        # a walk of every client per look (memory_fit.Demand).
        running = demand.of([*rest, client])
        popped = []
        while rest and not demand.fits(running, keeping=False):
            popped.append(rest.pop())
            running -= demand.adds(popped[-1])
        by_memory = []
        for holder in popped:  # those it fits beside after all are not in its way
            if demand.fits(running + demand.adds(holder), keeping=False):
                rest.append(holder)
                running += demand.adds(holder)
            else:
                by_memory.append(holder)
        by_busy = []
        if look.pays and self.saturating(gpu, client, now):
            by_busy = [c for c in rest if self.saturating(gpu, c, now)]
        return by_memory, by_busy

    def _role(self, gpu: GpuState, client: int, now: float) -> Role:
        """A turn for bulk work; beside for work in bursts."""
        return Role.BESIDE if self.bursty(gpu, client, now) else Role.TURN

    def _grant_what_fits(
        self,
        gpu: GpuState,
        look: Look,
        at: Moments,
        actions: list[Action],
    ) -> list[int]:
        """Grant, first first, every waiter nothing keeps from running; returns the rest,
        first first.  Once a waiter that must be kept waiting is overdue, nobody after it
        is let in ahead of it."""
        if not gpu.waiters:
            return []
        key = look.priority
        blocked: list[int] = []
        for client in sorted(gpu.waiters, key=key):
            if (
                blocked
                and not key(blocked[0])[0]
                and self._delays(gpu, look, client, blocked[0], at)
            ):
                blocked.append(client)  # behind an overdue waiter it would keep out longer
                continue
            if any(self._conflicts(gpu, client, at.now, look)):
                blocked.append(client)
                continue
            self.leases.grant(gpu, client, at.now, SHARED, self._role(gpu, client, at.now), actions)
        return blocked

    def _delays(self, gpu: GpuState, look: Look, client: int, overdue: int, at: Moments) -> bool:
        """Whether granting `client` now could keep `overdue` out longer: it would not fit
        beside it, or both keep the GPU busy where turns pay."""
        both_busy = look.pays and all(self.saturating(gpu, c, at.now) for c in (client, overdue))
        return both_busy or not self.fits(
            gpu, [*gpu.holders, overdue, client], keeping=False, demand=look.demand
        )

    def _make_room(
        self,
        gpu: GpuState,
        look: Look,
        blocked: list[int],
        at: Moments,
        actions: list[Action],
    ) -> None:
        """Ask the holders in each blocked waiter's way to give the GPU back: at once for
        an overdue waiter; else, where memory keeps them apart, not before the turn has
        paid for its paging; after its minimum slice for work in bursts owed more than
        it; at the end of its turn (longer while its group is owed, share_groups.py); or
        at its next idle moment (a yield)."""
        settings = gpu.settings
        min_slice_s = settings.min_slice_ms / 1000.0
        cut_in_after_s = (settings.light_wait_ms - DRAIN_MS) / 1000.0
        now = at.now
        for client in blocked:
            waiter = gpu.waiters[client]
            by_memory, by_busy = self._conflicts(gpu, client, now, look)
            blockers = by_memory + by_busy
            # Whether its running beside all the holders would page (not: only
            # memory_limit keeps them apart): one question per waiter, not per holder.
            pages = bool(by_memory) and look.demand.paged([*gpu.holders, client]) > 0
            cause = self._wait_cause(gpu, bool(by_busy), blockers, now)
            self.note_wait(gpu, client, waiter, cause.value, now)
            for holder in blockers:
                held = gpu.holders[holder]
                if held.drop_requested_at is not None:
                    continue
                # A turn that memory forces must pay for its paging; one between two
                # busy clients that fit pages nothing, and is short.
                paid_s = (
                    self._paid_turn_s(gpu, client, holder) if holder in by_memory and pages else 0.0
                )
                turn_s = max(BUSY_TURN_S, paid_s)
                if not look.priority(client)[0]:  # overdue: waited TQ, or its group's fair turns
                    self.leases.ask_to_drop(
                        gpu, holder, held, now, actions, DropReason.WAITED_QUANTUM
                    )
                elif not at.reached(held.granted_at + paid_s):
                    # Its paging not paid for yet: no drop, and no yield but from light
                    # work (a server, a notebook) to bulk work, which fills its long gaps;
                    # else the holder's turn is cut to a burst, and its share with it.
                    # Light by what it showed, not its use: kept apart, a loader-bound
                    # trainer read light by use, starved, and yielded after each batch.
                    shown = shown_duty(self.clients[holder], held, gpu.uuid, now)
                    if shown < LIGHT_USE and not self.bursty(gpu, client, now):
                        self.leases.ask_to_yield(gpu, holder, held, now, actions)
                elif (cuts_in := self._cuts_in(gpu, look, client, holder, now)) and at.reached(
                    max(held.granted_at + min_slice_s, waiter.requested_at + cut_in_after_s)
                ):
                    self.leases.ask_to_drop(gpu, holder, held, now, actions, DropReason.OWED_WAITS)
                elif at.reached(held.turn_since + turn_s):
                    if not cuts_in and self.shares.turn_goes_on(
                        gpu, holder, client, look.priority, self.clients, turn_s
                    ):
                        held.turn_since = now  # its group is owed: another turn
                        at.reached(now + turn_s)
                        self.note_wait(gpu, client, waiter, WaitCause.SHARE.value, now)
                    else:
                        self.leases.ask_to_drop(
                            gpu, holder, held, now, actions, DropReason.QUANTUM_OVER
                        )
                elif (
                    holder in by_busy
                    or self.bursty(gpu, holder, now)
                    or self.bursty(gpu, client, now)
                ):
                    # At its next gap: work in bursts is idle more than busy, and work in
                    # bursts waits no longer than it must; between two that fit, a handover
                    # pages nothing.  Bulk work that memory keeps apart keeps its turn: a
                    # handover at every pause would page (where the GPU cannot hold both).
                    self.leases.ask_to_yield(gpu, holder, held, now, actions)

    def _paid_turn_s(self, gpu: GpuState, waiter: int, holder: int) -> float:
        """How long a turn must last to pay for its paging where memory keeps holder and
        waiter apart and their running together would page: TURN_PER_PAGE_IN times
        bringing back the smaller one's memory (not just what the GPU lacks), at most TQ."""
        smaller = min(self.clients[c].managed.get(gpu.uuid, 0) for c in (holder, waiter))
        page_in_s = smaller / memory_fit.PAGE_IN_BYTES_PER_S
        return min(gpu.settings.time_quantum_s, TURN_PER_PAGE_IN * page_in_s)

    def _wait_cause(self, gpu: GpuState, turn: bool, blockers: list[int], now: float) -> WaitCause:
        if not blockers:
            return WaitCause.SHARE  # kept behind an overdue waiter
        if turn:  # both keep it busy, and turns pay
            return WaitCause.TURN
        if all(self.bursty(gpu, b, now) for b in blockers):
            return WaitCause.LATENCY
        return WaitCause.MEMORY  # bulk work in its way

    def note_wait(self, gpu: GpuState, client: int, waiter: Waiter, cause: str, now: float) -> None:
        """Count the wait so far to the cause it had, and go on under `cause` ("": the
        wait is over)."""
        if waiter.cause:
            key = (gpu.uuid, waiter.cause)
            waited = self.clients[client].waited_s
            waited[key] = waited.get(key, 0.0) + max(0.0, now - waiter.cause_since)
        waiter.cause, waiter.cause_since = cause, now
