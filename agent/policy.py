"""The lock's policy, per GPU: given one GPU's state at `now`, whom to grant, whom to ask
to yield or to drop, whom to revoke (docs/scheduling.md, "The policy" states it in the
order decide() applies it).

One idea for anti-thrash auto: who may run together is a question of memory alone (what
fits together runs together), except that two clients that each keep the GPU busy take
turns, which beats interleaving them; who goes first, and who gives way, is a question of
GPU time per weight: a client under its fair share of the GPU goes first and may cut a
turn short, one over it waits for a turn.  The GPU is never left idle for a waiter that
fits beside those running.

decide() returns the actions *and* the next moment any rule could act: every comparison
with the clock goes through Moments.reached(), which notes the moments not reached yet,
so the deadline can never disagree with the rules.  Pure, like the rest of the core: no
clock, no I/O.  The scheduler (scheduler.py) owns the state and hands it in.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from . import memory_fit
from .actions import Action, AskToDrop, Grant, Revoke
from .core_state import (
    EXCLUSIVE,
    FEATURE_USAGE,
    FEATURE_YIELD,
    SHARED,
    ClientState,
    GpuState,
    Lease,
    Waiter,
)
from .deadlines import Moments
from .settings import AntiThrash
from .share_groups import ShareGroups
from .usage import UsageMeter

# A client whose use (GPU time, 0..1) is this or more keeps the GPU busy by itself (a
# trainer): two such take turns, since interleaving them costs both (0.91x against 1.003x
# in turns, two trainers on an H100).  Only a client with next to no host time between
# its kernels reads this high, even beside others: 70 % busy, it reads ~0.85 beside a
# trainer, whose kernels stretch its bursts but not its host time.
SATURATING_USE = 0.95
# A holder that does not keep the GPU busy, while a waiter that does not fit beside it
# waits, releases once idle this long: at its next gap, not at its quantum's end.
YIELD_IDLE_MS = 10
# Uses change as clients run: the holders are looked at again this often while others
# wait or several hold.
CHECK_S = 0.25
# How long a turn takes to drain once asked to drop (its shim bounds its queue meanwhile):
# the drop is asked this much before a cutting-in waiter's light wait is up.
DRAIN_MS = 25
# A client that held another GPU this long before asking for one works across GPUs: it
# leaves each idle while it works on another, which is no sign it is done.
ACROSS_GPUS_SLACK_S = 1.0


class Role(enum.Enum):
    """Why a lease was granted (the log says it)."""

    TURN = "turn"  # bulk work: it keeps the GPU busy, or was cut off busy last time
    BESIDE = "beside"  # work in bursts


class DropReason(enum.Enum):
    QUANTUM_OVER = "quantum over"  # a waiter that conflicts with it waits, its turn is over
    WAITED_QUANTUM = "waiter starves"  # a waiter that conflicts with it has waited TQ
    OWED_WAITS = "owed work waits"  # a waiter owed more GPU time cuts in
    BOTH_SATURATE = "both keep it busy"  # two saturating clients: turns
    MEMORY_DOES_NOT_FIT = "memory does not fit"  # a report grew
    OTHERS_WAIT = "others wait"  # a yield: release once idle
    ANTI_THRASH_ON = "anti-thrash on"
    ANTI_THRASH_AUTO = "anti-thrash auto"


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
        self.last_lease = 0

    # ------------------------------------------------------------ what the rules read

    def meter(self, state: ClientState, uuid: bytes) -> UsageMeter:
        meter = state.usage.get(uuid)
        if meter is None:  # a measuring shim's totals count from its HELLO
            meter = state.usage[uuid] = UsageMeter(
                stamp=state.connected_at, since=state.connected_at
            )
        return meter

    def usage(self, client: int, uuid: bytes, now: float) -> float:
        meter = self.clients[client].usage.get(uuid)
        return 0.0 if meter is None else meter.at(now)

    def saturating(self, gpu: GpuState, client: int, now: float) -> bool:
        return self.usage(client, gpu.uuid, now) >= SATURATING_USE

    def _standing(self, gpu: GpuState, now: float) -> Callable[[int], tuple[float, float]]:
        """Who is owed GPU time, least first: its share group's charge (GPU time over
        weight, share_groups.py), then its own recent use."""
        charged = self.shares.charged(gpu, self.clients, now)
        return lambda client: (charged(client), self.usage(client, gpu.uuid, now))

    def _cuts_in(self, gpu: GpuState, standing, waiter: int, holder: int, now: float) -> bool:
        """Latency work, and any work in bursts that others have kept from its share: a
        waiter that does not keep the GPU busy, gave its last lease back idle (a trainer
        cut off busy waits for its turn: else two new trainers took the GPU from each
        other slice by slice), and is owed more than the holder in its way."""
        return (
            not self.saturating(gpu, waiter, now)
            and self.clients[waiter].gave_back_idle.get(gpu.uuid, True)
            and standing(waiter) < standing(holder)
        )

    def fits(self, gpu: GpuState, running: list[int], keeping: bool) -> bool:
        """Whether these clients fit the GPU at once.  keeping: they already run and may
        stay up to the line; a newcomer comes in only below the line less the band
        (memory_fit's hysteresis).  Alone, anyone fits: what does not fit the GPU pages
        in and out of it, with nobody to thrash against."""
        if len(running) <= 1:
            return True
        demand = memory_fit.demand_of(gpu, self.clients, set(running))
        return memory_fit.fits(keeping, demand, gpu.capacity_bytes)

    # ------------------------------------------------------------ the decision, per GPU

    def decide(self, gpu: GpuState, now: float, actions: list[Action]) -> float | None:
        """The rules for one GPU at `now`: appends their actions, returns the next moment
        one of them could act (None: only an event can change anything)."""
        at = Moments(now)
        self._revoke_overdue(gpu, at, actions)
        mode = gpu.settings.anti_thrash
        if mode is AntiThrash.OFF:
            while gpu.waiters:
                self._grant(gpu, next(iter(gpu.waiters)), now, SHARED, Role.BESIDE, actions)
        elif mode is AntiThrash.ON:
            self._first_come_turns(gpu, at, actions)
        else:
            self._auto(gpu, at, actions)
        self._revoke_overdue(gpu, at, actions)  # notes when the drops just asked come due
        return at.next

    def _revoke_overdue(self, gpu: GpuState, at: Moments, actions: list[Action]) -> None:
        # A revoke only makes room for a waiter: with none left it would cut a holder off
        # for nothing.  The drop request stays pending, so a new waiter does not wait
        # another grace for an overdue holder.
        if not (gpu.holders and gpu.waiters):
            return
        grace = gpu.settings.drop_grace_ms / 1000.0
        for client, held in list(gpu.holders.items()):
            if held.drop_requested_at is not None and at.reached(held.drop_requested_at + grace):
                del gpu.holders[client]
                state = self.clients[client]
                self.meter(state, gpu.uuid).stop(at.now)
                state.gave_back_idle[gpu.uuid] = False
                actions.append(
                    Revoke(client, state.pid, gpu.uuid, held.number, at.now - held.granted_at)
                )

    def _first_come_turns(self, gpu: GpuState, at: Moments, actions: list[Action]) -> None:
        """anti-thrash on: one exclusive holder, first come first served, turns of TQ."""
        if not gpu.waiters:
            return
        if not gpu.holders:
            self._grant(gpu, next(iter(gpu.waiters)), at.now, EXCLUSIVE, Role.TURN, actions)
            return
        if len(gpu.holders) == 1:
            client, held = next(iter(gpu.holders.items()))
            if held.drop_requested_at is None and at.reached(
                held.granted_at + gpu.settings.time_quantum_s
            ):
                self.ask_to_drop(gpu, client, held, at.now, actions, DropReason.QUANTUM_OVER)

    def _auto(self, gpu: GpuState, at: Moments, actions: list[Action]) -> None:
        now = at.now
        settings = gpu.settings
        light_wait_s = settings.light_wait_ms / 1000.0
        # A client kept waiting is no lighter for it: past the light wait, its use stops
        # decaying until its grant (usage.py), so a trainer waiting for its turn does not
        # come to look under its share.
        for client, waiter in gpu.waiters.items():
            if at.reached(waiter.requested_at + light_wait_s):
                self.meter(self.clients[client], gpu.uuid).freeze(
                    waiter.requested_at + light_wait_s
                )
        self._keep_holders_apart(gpu, at, actions)
        blocked = self._grant_what_fits(gpu, at, actions)
        self._make_room(gpu, blocked, self._priority(gpu, at), at, actions)
        if gpu.waiters or len(gpu.holders) > 1:
            at.reached(now + CHECK_S)  # uses change as they run: look again

    def _keep_holders_apart(self, gpu: GpuState, at: Moments, actions: list[Action]) -> None:
        """Holders that may no longer run together: those that stopped fitting (a report
        grew), newest first, and a second that came to keep the GPU busy beside another."""
        staying = [c for c, held in gpu.holders.items() if held.drop_requested_at is None]
        for client in reversed(staying[1:]):  # the first granted stays: alone, it fits
            if self.fits(gpu, staying, keeping=True):
                break
            if self.clients[client].managed.get(gpu.uuid, 0):  # else its going frees nothing
                held = gpu.holders[client]
                self.ask_to_drop(gpu, client, held, at.now, actions, DropReason.MEMORY_DOES_NOT_FIT)
                staying.remove(client)
        saturating = [c for c in staying if self.saturating(gpu, c, at.now)]
        for client in saturating[1:]:  # the first granted keeps its turn
            held = gpu.holders[client]
            self.ask_to_drop(gpu, client, held, at.now, actions, DropReason.BOTH_SATURATE)

    def _priority(self, gpu: GpuState, at: Moments) -> Callable[[int], tuple]:
        """The order of waiters, first first: one overdue (waited its group's fair
        turns, or TQ), oldest first; then by share groups (the group charged least GPU
        time over its weight, share_groups.py), then the least recent use, then request
        order.  A key whose first item is false is overdue."""
        by_groups = self.shares.turn_order(gpu, self.clients, at.now, at.reached)
        quantum = gpu.settings.time_quantum_s

        def key(client: int) -> tuple:
            if by_groups is not None:
                return by_groups(client)
            waiter = gpu.waiters[client]
            starving = at.reached(waiter.requested_at + quantum)
            used = 0.0 if starving else self.usage(client, gpu.uuid, at.now)
            return (not starving, used, waiter.requested_at)

        return key

    def _conflicts(self, gpu: GpuState, client: int, now: float) -> list[int]:
        """The holders that keep `client` from running now: one that keeps the GPU busy
        where it does too, and those whose memory it does not fit beside (the newest
        first, as few as make it fit).  Empty: it may run."""
        holders = list(gpu.holders)
        blockers = []
        if self.saturating(gpu, client, now):
            blockers = [c for c in holders if self.saturating(gpu, c, now)]
        rest = [c for c in holders if c not in blockers]
        while not self.fits(gpu, [*rest, client], keeping=False):
            blockers.append(rest.pop())
        return blockers

    def _role(self, gpu: GpuState, client: int, now: float) -> Role:
        """A turn for work that keeps the GPU busy, or was cut off busy last time (bulk
        work); beside for work in bursts."""
        bursty = self.clients[client].gave_back_idle.get(gpu.uuid, True)
        return Role.TURN if self.saturating(gpu, client, now) or not bursty else Role.BESIDE

    def _grant_what_fits(self, gpu: GpuState, at: Moments, actions: list[Action]) -> list[int]:
        """Grant, first first, every waiter nothing keeps from running; returns the rest,
        first first.  Once a waiter that must be kept waiting is overdue, nobody after it
        is let in ahead of it."""
        if not gpu.waiters:
            return []
        key = self._priority(gpu, at)
        blocked: list[int] = []
        for client in sorted(gpu.waiters, key=key):
            if blocked and not key(blocked[0])[0]:  # overdue: first in line, kept waiting
                blocked.append(client)
                continue
            if self._conflicts(gpu, client, at.now):
                blocked.append(client)
                continue
            self._grant(gpu, client, at.now, SHARED, self._role(gpu, client, at.now), actions)
        return blocked

    def _make_room(
        self,
        gpu: GpuState,
        blocked: list[int],
        priority: Callable[[int], tuple],
        at: Moments,
        actions: list[Action],
    ) -> None:
        """Ask the holders in each blocked waiter's way to give the GPU back: one that
        does not keep it busy at its next idle moment (a yield); any at the end of its
        turn (TQ; longer while its group is owed, share_groups.py), after its minimum
        slice for work in bursts owed more than it, at once for an overdue waiter."""
        settings = gpu.settings
        quantum = settings.time_quantum_s
        min_slice_s = settings.min_slice_ms / 1000.0
        cut_in_after_s = (settings.light_wait_ms - DRAIN_MS) / 1000.0
        now = at.now
        standing = self._standing(gpu, now)
        for client in blocked:
            waiter = gpu.waiters[client]
            for holder in self._conflicts(gpu, client, now):
                held = gpu.holders[holder]
                if held.drop_requested_at is not None:
                    continue
                if not priority(client)[0]:  # overdue: waited TQ, or its group's fair turns
                    self.ask_to_drop(gpu, holder, held, now, actions, DropReason.WAITED_QUANTUM)
                elif self._cuts_in(gpu, standing, client, holder, now) and at.reached(
                    max(held.granted_at + min_slice_s, waiter.requested_at + cut_in_after_s)
                ):
                    self.ask_to_drop(gpu, holder, held, now, actions, DropReason.OWED_WAITS)
                elif at.reached(held.turn_since + quantum):
                    if self.shares.turn_goes_on(gpu, holder, client, self.clients, now, at.reached):
                        held.turn_since = now  # its group is owed: another quantum
                        at.reached(now + quantum)
                    else:
                        self.ask_to_drop(gpu, holder, held, now, actions, DropReason.QUANTUM_OVER)
                elif not self.saturating(gpu, holder, now):
                    self._ask_to_yield(gpu, holder, held, now, actions)

    # ------------------------------------------------------------ actions on leases

    def _grant(
        self,
        gpu: GpuState,
        client: int,
        now: float,
        mode: str,
        role: Role,
        actions: list[Action],
    ) -> None:
        waiter: Waiter = gpu.waiters.pop(client)
        self.last_lease += 1
        auto = gpu.settings.anti_thrash is AntiThrash.AUTO
        displaced = client in gpu.displaced
        gpu.displaced.discard(client)
        if role is Role.TURN:
            self._displace_by(gpu, client)
        gpu.holders[client] = Lease(
            self.last_lease,
            mode,
            now,
            release_when_idle=auto,
            across_gpus=self._held_elsewhere_since(
                client, gpu, waiter.requested_at - ACROSS_GPUS_SLACK_S
            ),
            turn_since=now,
        )
        state = self.clients[client]
        meter = self.meter(state, gpu.uuid)
        meter.thaw(now)
        if not state.features & FEATURE_USAGE:
            meter.start(now)  # an older shim: the hold stands for use
        actions.append(
            Grant(
                client,
                state.pid,
                gpu.uuid,
                self.last_lease,
                mode == EXCLUSIVE,
                now - waiter.requested_at,
                auto,
                role.value if auto else "",
                use=self.usage(client, gpu.uuid, now) if auto else -1.0,
                # Not everyone fits: work owed more may cut this lease short, and a queue
                # bounded by the longest kernel drains fast (shim/queue_bound.c).
                short_queue=auto and not gpu.fits,
                displaced=displaced,
            )
        )

    def _displace_by(self, gpu: GpuState, client: int) -> None:
        """A turn: whoever does not fit beside `client` may find its pages on the host
        when it comes back; its next grant says so, and its shim prefetches them.  Work
        in bursts is left out: a prefetch of a trainer's resident gigabytes after each
        would cost more than the faults (docs/benchmarks.md)."""
        if gpu.fits:
            return  # everyone's memory fits at once
        for other in gpu.users:
            if (
                other != client
                and gpu.uuid in self.clients[other].active
                and not self.fits(gpu, [client, other], keeping=True)
            ):
                gpu.displaced.add(other)

    def _held_elsewhere_since(self, client: int, gpu: GpuState, since: float) -> bool:
        """A process working across GPUs (a pipeline): it held another GPU at some time
        from `since` on.  It is never asked to yield here."""
        state = self.clients[client]
        for uuid in state.gpus:
            if uuid == gpu.uuid:
                continue
            meter = state.usage.get(uuid)
            other = self.gpus.get(uuid)
            if (meter is not None and (meter.busy or meter.stamp >= since)) or (
                other is not None and client in other.holders
            ):
                return True
        return False

    def ask_to_drop(
        self,
        gpu: GpuState,
        client: int,
        held: Lease,
        now: float,
        actions: list[Action],
        reason: DropReason,
    ) -> None:
        held.drop_requested_at = now
        actions.append(self._drop_request(gpu, client, held, now, reason))

    def _ask_to_yield(
        self, gpu: GpuState, client: int, held: Lease, now: float, actions: list[Action]
    ) -> None:
        """Release once idle YIELD_IDLE_MS.  Only to shims that know it (an older one
        would take it for a drop), once a lease, and not to a process working across
        GPUs: it leaves each idle while it works on another."""
        state = self.clients[client]
        if held.yield_asked or not state.features & FEATURE_YIELD:
            return
        if held.across_gpus or self._held_elsewhere_since(client, gpu, now):
            return
        held.yield_asked = True
        actions.append(
            self._drop_request(gpu, client, held, now, DropReason.OTHERS_WAIT, YIELD_IDLE_MS)
        )

    def _drop_request(
        self,
        gpu: GpuState,
        client: int,
        held: Lease,
        now: float,
        reason: DropReason,
        when_idle_ms: int = 0,
    ) -> AskToDrop:
        return AskToDrop(
            client,
            self.clients[client].pid,
            gpu.uuid,
            held.number,
            now - held.granted_at,
            when_idle_ms=when_idle_ms,
            reason=reason.value,
            use=self.usage(client, gpu.uuid, now),
        )

    def ask_each_to_drop(
        self, gpu: GpuState, now: float, actions: list[Action], reason: DropReason
    ) -> None:
        for client, held in gpu.holders.items():
            if held.drop_requested_at is None:
                self.ask_to_drop(gpu, client, held, now, actions, reason)
