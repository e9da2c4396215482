"""The lock's rules, per GPU: given the state of one GPU at `now`, what to revoke,
whom to ask to drop or to yield, and whom to grant (docs/scheduling.md).

One decision per GPU: decide() applies the rules in the order docs/scheduling.md
states them and returns the actions *and* the next moment any rule could act.
Every comparison with the clock goes through Moments.reached(), which notes the
moments not reached yet; the deadline is the earliest of them.  So the deadline
can never disagree with the rules (the agent once spun at 100 % CPU on a
deadline that a second copy of the rules computed and the rules never acted on).

A part of the scheduling core (scheduler.Scheduler inherits it), kept apart so
that the events and the bookkeeping (scheduler.py) and the rules themselves
can each be read in one sitting.  Pure, like the rest of the core.

One concern, though past ~400 lines: the rules of one decision.  decide() and
the steps it takes in order, with the judgements they share (who is light,
whose memory fits beside the turn, the best waiter) and the lease actions they
end in; split apart, each part would have to be read beside the others.  What
the rules consult has modules of its own: memory's fit (memory_fit.py), use
(usage.py), the share groups' order (share_groups.py).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

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
from .settings import AntiThrash
from .share_groups import ShareGroups
from .usage import UsageMeter

# auto: a client is light when its recent use of the GPU (GPU time, 0..1) is under
# LIGHT_FLOOR, or at most LIGHT_RATIO of the turn holder's; it cuts the turn short
# (a window) only when both hold.  An inference server answering 20 requests of ~1 ms
# a second uses ~0.02-0.04; a notebook's cells ~0.05; a loader's batches ~0.03; a
# trainer ~1.  A light lease beside the turn ends once its client's use passes
# KEEP_LIGHT_FACTOR times those figures (hysteresis).
LIGHT_FLOOR = 0.1
LIGHT_RATIO = 0.25
KEEP_LIGHT_FACTOR = 2.0
# auto: how often leases beside the turn are checked for still being light.
LIGHT_CHECK_S = 0.25
# A client that held another GPU this long before asking for one works across GPUs.
ACROSS_GPUS_SLACK_S = 1.0
# auto: the turn holder others wait for releases after this long idle (DROP_REQUEST
# WHEN_IDLE), instead of idle_release_ms: a notebook's cell is over, the trainer
# behind it should not wait a second for nothing.
YIELD_IDLE_MS = 50
# auto: light work that runs while the turn waits (a window) gives the GPU back
# after this long idle: at once, less the noise between one request's kernels.
WINDOW_IDLE_MS = 2
# auto: a turn held this long whose holder's use is still under LIGHT_FLOOR, while busy
# work waits, is light work holding the turn (a notebook or a loader that came first):
# asked to drop, it goes on beside the busy one's turn or in its windows.  A busy client
# starting from nothing is past the floor within half a second (usage.py: a newcomer's
# figure is over its stay): it keeps its first turn.
LIGHT_TURN_PROOF_S = 2.0
# auto: how long a turn takes to drain once asked to drop with light work waiting (its
# shim bounds its queue to 5 ms meanwhile; a trainer's 18 ms kernels, one or two of
# them): the drop is asked this much before light work's wait (light_wait_ms) is up.
DRAIN_MS = 25
# auto: a busy waiter with no more use than the turn holder's takes the GPU at the
# holder's next idle moment (a yield): two inference servers at 0.2-0.4 each serve
# each other in their gaps.  But where the holder keeps the GPU busy (its use is
# BUSY_LEASE_DUTY or more, or its lease kept the GPU busy that much of the time since
# its work began: a trainer; one with under HOLDS_PROVEN_S of work as its client's last
# one that old did), only a waiter with YIELD_TO_USE_RATIO of its use or less: a
# notebook's long cell.  (Also where their memory fits: a share group of weight 2 must
# keep its second quantum, tests/shim/test_shares.py.)
# Between two trainers (uses ~1) a yield at a tie ended a turn at the holder's first
# 50 ms pause, 12 to 30 s in as it happened, and the shares were chance (40 / 60 % on
# the H100, issue 35's b.); their turns last the quantum.  The lease's own figure:
# two trainers that swap the GPU at every pause each show a use of ~0.7, and would go
# on swapping.  An older shim's hold is its use: its lease is not judged.
BUSY_LEASE_DUTY = 0.8
HOLDS_PROVEN_S = 0.5
YIELD_TO_USE_RATIO = 0.5
# The shim reports its GPU time at most every 100 ms (shim/usage_meter.c): a lease's
# figure lags its holder by up to that.
USAGE_REPORT_LAG_S = 0.1


class Role(enum.Enum):
    """auto: why a lease was granted (the log says it)."""

    TURN = "turn"  # busy work, one client at a time
    BESIDE = "beside"  # light work, beside the turn or in a window


class DropReason(enum.Enum):
    QUANTUM_OVER = "quantum over"
    LIGHT_WORK_WAITS = "light work waits"  # auto: light work that does not fit beside
    NO_LONGER_LIGHT = "no longer light"
    MEMORY_DOES_NOT_FIT = "memory does not fit"  # beside the turn, after a report
    ANTI_THRASH_ON = "anti-thrash on"
    ANTI_THRASH_AUTO = "anti-thrash auto"
    LIGHT_TURN = "light turn"  # auto: light work held the turn, busy work waits
    OTHERS_WAIT = "others wait"  # a yield: release once idle
    WINDOW = "window"  # a yield: light work in a window, release at once when idle


# How long a lease asked to yield may stay idle before its shim releases it.
YIELD_IDLE = {DropReason.OTHERS_WAIT: YIELD_IDLE_MS, DropReason.WINDOW: WINDOW_IDLE_MS}


class Moments:
    """`now`, and the earliest moment asked about that is still to come: the next
    time any rule that asked could act."""

    __slots__ = ("next", "now")

    def __init__(self, now: float):
        self.now = now
        self.next: float | None = None

    def reached(self, moment: float) -> bool:
        if self.now >= moment:
            return True
        if self.next is None or moment < self.next:
            self.next = moment
        return False


class LockRules:
    """The rules; the scheduler provides the state they work on.  Each GPU runs
    by its own settings (gpu.settings: the node-wide ones with the GPU's own over
    them), which the scheduler keeps up to date."""

    clients: dict[int, ClientState]
    gpus: dict[bytes, GpuState]
    shares: ShareGroups
    _last_lease: int

    def _push_deadline(self, due: float, key: bytes | int) -> None:
        raise NotImplementedError  # the scheduler's

    # ------------------------------------------------------------ use (GPU time)

    def _meter(self, state: ClientState, uuid: bytes) -> UsageMeter:
        meter = state.usage.get(uuid)
        if meter is None:
            # A measuring shim's totals count from its HELLO.
            meter = UsageMeter(stamp=state.connected_at, since=state.connected_at)
            state.usage[uuid] = meter
        return meter

    def _usage(self, client: int, uuid: bytes, now: float) -> float:
        meter = self.clients[client].usage.get(uuid)
        return 0.0 if meter is None else meter.at(now)

    def _turn_holder(self, gpu: GpuState) -> int | None:
        for client, held in gpu.holders.items():
            if held.turn:
                return client
        return None

    # ------------------------------------------------------------ several GPUs

    def _turn_elsewhere_others_want(self, client: int, gpu: GpuState) -> bool:
        """A process working across GPUs (a pipeline): it is its turn on another GPU,
        a turn others wait for there, which would go to waste while it waited here.
        It counts as light here.  (A turn nobody else wants there wastes nothing.)"""
        for uuid in self.clients[client].gpus:  # the GPUs it named: at most MAX_GPUS
            other = self.gpus.get(uuid) if uuid != gpu.uuid else None
            held = other.holders.get(client) if other is not None else None
            if held is not None and held.turn and other is not None and other.waiters:
                return True
        return False

    def _held_elsewhere_since(self, client: int, gpu: GpuState, since: float) -> bool:
        """A process working across GPUs: it held another GPU at some time from
        `since` on.  It leaves each GPU idle while it works on another, which is no
        sign it is done: never asked to release this one once idle."""
        state = self.clients[client]
        for uuid in state.gpus:
            meter = state.usage.get(uuid) if uuid != gpu.uuid else None
            if meter is not None and (meter.busy or meter.stamp >= since):
                return True
            other = self.gpus.get(uuid) if uuid != gpu.uuid else None
            if other is not None and client in other.holders:
                return True
        return False

    # ------------------------------------------------------------ light and busy (auto)

    def _busiest_other(self, gpu: GpuState, client: int, now: float) -> float | None:
        """The use light work is measured against: the turn holder's, or with no turn
        (a window, or a turn between holders) the busiest other client's there;
        None when the client is alone on the GPU."""
        turn = self._turn_holder(gpu)
        if turn is not None and turn != client:
            return self._usage(turn, gpu.uuid, now)
        others = [c for c in (*gpu.holders, *gpu.waiters) if c != client]
        return max((self._usage(c, gpu.uuid, now) for c in others), default=None)

    def _judge(self, gpu: GpuState, client: int, now: float) -> tuple[bool, bool]:
        """(light, cuts in) for a request arriving now (core_state.Waiter).  Alone on
        the GPU it is neither: nothing to cut in ahead of, it takes the turn."""
        if gpu.settings.anti_thrash is not AntiThrash.AUTO:
            return False, False
        busiest = self._busiest_other(gpu, client, now)
        if busiest is None:
            return False, False
        used = self._usage(client, gpu.uuid, now)
        much_lighter = used < LIGHT_RATIO * busiest
        light = used < LIGHT_FLOOR or much_lighter
        cuts_in = used < LIGHT_FLOOR and much_lighter
        return light or self._turn_elsewhere_others_want(client, gpu), cuts_in

    def _still_light(self, gpu: GpuState, client: int, now: float) -> bool:
        used = self._usage(client, gpu.uuid, now)
        if used < KEEP_LIGHT_FACTOR * LIGHT_FLOOR:
            return True
        if self._turn_elsewhere_others_want(client, gpu):
            return True  # as _judge: beside here while its turn there lasts
        busiest = self._busiest_other(gpu, client, now)
        return busiest is None or used <= KEEP_LIGHT_FACTOR * LIGHT_RATIO * busiest

    # ------------------------------------------------------------ memory (auto)

    def _demand_of(self, gpu: GpuState, running: Iterable[int]) -> int:
        """The GPU's memory with `running` at work: their whole demand, what every
        other client cannot give up, and what processes outside nvshare use."""
        running = set(running)
        pids = set()
        demand = 0
        for client in gpu.users:
            state = self.clients[client]
            pids.add(state.pid)
            if gpu.uuid not in state.active:
                continue
            figures = (
                state.managed.get(gpu.uuid, 0),
                state.unmanaged.get(gpu.uuid, 0),
                gpu.process_bytes.get(state.pid),
            )
            if client in running:
                demand += memory_fit.client_demand(*figures)
            else:
                demand += memory_fit.resident_demand(*figures)
        return demand + sum(b for pid, b in gpu.process_bytes.items() if pid not in pids)

    def _fits(self, gpu: GpuState, running: list[int], keeping: bool) -> bool:
        """Whether these clients fit the GPU at once.  keeping: they already run, so
        they may stay up to the line (one of them grew); a newcomer comes in only below
        the line less the band: memory_fit.fits()'s hysteresis.  Alone,
        anyone fits: what does not fit the GPU pages in and out of it."""
        if len(running) <= 1:
            return True
        return memory_fit.fits(keeping, self._demand_of(gpu, running), gpu.capacity_bytes)

    def _fits_with(self, gpu: GpuState, *newcomers: int) -> bool:
        return self._fits(gpu, [*gpu.holders, *newcomers], keeping=False)

    # ------------------------------------------------------------ best waiter

    def _starving(self, gpu: GpuState, waiter: Waiter, at: Moments) -> bool:
        return at.reached(waiter.requested_at + gpu.settings.time_quantum_s)

    def _paused_turn(self, gpu: GpuState, at: Moments) -> int | None:
        """The holder of a turn cut short for a window, while that turn is within its
        quantum: it comes back after the window, with its clock, ahead of a waiter that
        has waited TQ (whose turn comes at the quantum's end, as it would have had the
        window not been).  None once the quantum is over: a turn then is a new one."""
        paused = gpu.turn_paused
        if paused is None or paused[0] not in gpu.users:
            return None
        return None if at.reached(paused[1] + gpu.settings.time_quantum_s) else paused[0]

    def _goes_next_by_waiting(self, gpu: GpuState, best: int, at: Moments) -> bool:
        """The best waiter has waited TQ and no paused turn is due back: it goes next,
        and no window opens before it."""
        return self._starving(gpu, gpu.waiters[best], at) and self._paused_turn(gpu, at) is None

    def _best_waiter(self, gpu: GpuState, at: Moments, among: Iterable[int] | None = None) -> int:
        """First come first served (on); least recent use first, those waiting a
        quantum or more before all others, oldest first (auto); by share groups
        unless share_by is process (share_groups.py: the group charged least first)."""
        candidates = gpu.waiters if among is None else among
        if gpu.settings.anti_thrash is not AntiThrash.AUTO:
            return next(iter(candidates))
        by_groups = self.shares.turn_order(gpu, self.clients, at.now, at.reached)
        if by_groups is not None:
            return min(candidates, key=by_groups)
        uuid = gpu.uuid

        def order(client: int) -> tuple[bool, float, float]:
            waiter = gpu.waiters[client]
            starving = self._starving(gpu, waiter, at)
            used = 0.0 if starving else self._usage(client, uuid, at.now)
            return (not starving, used, waiter.requested_at)

        return min(candidates, key=order)

    def _turn_goes_on(self, gpu: GpuState, turn: int, held: Lease, at: Moments) -> bool:
        """Its quantum is over, but its share group still goes before the best
        waiter's (share_groups.py: a group of weight 2 beside one of weight 1 takes two
        turns for each of the other's): a new quantum from now, on the same lease."""
        best = self._best_waiter(gpu, at)
        if not self.shares.turn_goes_on(gpu, turn, best, self.clients, at.now, at.reached):
            return False
        held.turn_since = at.now
        at.reached(at.now + gpu.settings.time_quantum_s)
        return True

    # ------------------------------------------------------------ the decision, per GPU

    def _update(self, gpu: GpuState, now: float, actions: list[Action]) -> None:
        """Bring one GPU up to date at `now` (decide), and note when it must be
        looked at next."""
        due = self.decide(gpu, now, actions)
        if due != gpu.deadline:
            gpu.deadline = due
            if due is not None:
                self._push_deadline(due, gpu.uuid)

    def decide(self, gpu: GpuState, now: float, actions: list[Action]) -> float | None:
        """The rules for one GPU at `now`: appends their actions, returns the next
        moment one of them could act (None: only an event can change anything)."""
        at = Moments(now)
        self._revoke_overdue(gpu, at, actions)
        policy = gpu.settings.anti_thrash
        if policy is AntiThrash.OFF:
            while gpu.waiters:
                self._grant(gpu, next(iter(gpu.waiters)), now, SHARED, actions)
        elif policy is AntiThrash.ON:
            self._take_turns_first_come(gpu, at, actions)
        else:
            self._take_turns_and_serve_light_work(gpu, at, actions)
        # Again, for the drops the rules just asked for: none is due yet, but the
        # moment each comes due is noted.
        self._revoke_overdue(gpu, at, actions)
        return at.next

    def _revoke_overdue(self, gpu: GpuState, at: Moments, actions: list[Action]) -> None:
        # Revoking makes room for a waiter; with none left (the only one
        # withdrew or exited after the drop request) it would only cut a
        # holder off for nothing.  The drop request stays pending, so a new
        # waiter does not have to wait another grace for an overdue holder.
        if not (gpu.holders and gpu.waiters):
            return
        grace = gpu.settings.drop_grace_ms / 1000.0
        for client, held in list(gpu.holders.items()):
            if held.drop_requested_at is not None and at.reached(held.drop_requested_at + grace):
                del gpu.holders[client]
                self._lease_ended(gpu, client, held, at.now)
                state = self.clients[client]
                self._meter(state, gpu.uuid).stop(at.now)
                actions.append(
                    Revoke(client, state.pid, gpu.uuid, held.number, at.now - held.granted_at)
                )

    def _take_turns_first_come(self, gpu: GpuState, at: Moments, actions: list[Action]) -> None:
        """anti-thrash on: one exclusive holder, FCFS, turns of at most the quantum."""
        if not gpu.waiters:
            return
        if not gpu.holders:
            self._grant(gpu, next(iter(gpu.waiters)), at.now, EXCLUSIVE, actions)
            return
        if len(gpu.holders) == 1:
            client, held = next(iter(gpu.holders.items()))
            if held.drop_requested_at is None and at.reached(
                held.granted_at + gpu.settings.time_quantum_s
            ):
                self._ask_to_drop(gpu, client, held, at.now, actions, DropReason.QUANTUM_OVER)

    def _take_turns_and_serve_light_work(
        self, gpu: GpuState, at: Moments, actions: list[Action]
    ) -> None:
        """auto (docs/scheduling.md, "The rules, auto"): one turn at a time for busy
        work; light work beside it when their memory fits together, else in windows
        between turns, batched; beside leases that stop fitting or being light go."""
        now = at.now
        # 2. While a turn is held, waiters are judged at every look (its use grows as it
        #    runs); between turns they keep their judgement.  A client waiting longer
        #    than light work does is no lighter for it: its use stops decaying until its
        #    grant (usage.py); light work that does not cut in (it waits for the turn)
        #    competes for the turn as busy work does.
        light_wait_s = gpu.settings.light_wait_ms / 1000.0
        judge = self._turn_holder(gpu) is not None
        for client, waiter in gpu.waiters.items():
            if judge and not waiter.judged_busy:
                waiter.light, waiter.cuts_in = self._judge(gpu, client, now)
            if at.reached(waiter.requested_at + light_wait_s):
                self._meter(self.clients[client], gpu.uuid).freeze(
                    waiter.requested_at + light_wait_s
                )
                # Light by the floor, it cuts in once the turn's use has grown (a turn
                # just begun has little); light only by the ratio, it never would.
                if waiter.light and not waiter.cuts_in:
                    waiter.judged_busy = self._usage(client, gpu.uuid, now) >= LIGHT_FLOOR
                    waiter.light = not waiter.judged_busy
        # 3. Leases beside the turn that no longer fit with it (a report grew): newest
        #    first, until those that stay fit.
        staying = [c for c, held in gpu.holders.items() if held.drop_requested_at is None]
        for client in reversed(list(staying)):
            if self._fits(gpu, staying, keeping=True):
                break
            held = gpu.holders[client]
            state = self.clients[client]
            if not held.turn and state.managed.get(gpu.uuid, 0):  # else its going frees nothing
                self._ask_to_drop(gpu, client, held, now, actions, DropReason.MEMORY_DOES_NOT_FIT)
                staying.remove(client)
        # 4. Leases beside that are no longer light, every LIGHT_CHECK_S.
        self._check_beside_still_light(gpu, at, actions)
        if gpu.waiters:
            self._grant_and_make_room(gpu, at, actions)
        # Leases granted beside just now are checked from now on.
        self._check_beside_still_light(gpu, at, actions)

    def _check_beside_still_light(self, gpu: GpuState, at: Moments, actions: list[Action]) -> None:
        beside = [c for c, lease in gpu.holders.items() if not lease.turn]
        if not beside:
            gpu.light_check_at = None
        elif gpu.light_check_at is None or at.reached(gpu.light_check_at):
            for client in beside:
                held = gpu.holders[client]
                if held.drop_requested_at is None and not self._still_light(gpu, client, at.now):
                    self._ask_to_drop(
                        gpu, client, held, at.now, actions, DropReason.NO_LONGER_LIGHT
                    )
            gpu.light_check_at = at.now + LIGHT_CHECK_S
            at.reached(gpu.light_check_at)

    def _grant_and_make_room(self, gpu: GpuState, at: Moments, actions: list[Action]) -> None:
        """auto, someone waits: grant whom the rules let in, and ask holders for room."""
        now = at.now
        turn = self._turn_holder(gpu)
        # 5. Grants.  A waiter that has waited a quantum goes first and stops windows,
        #    once no turn cut short for a window is due back.
        best = self._best_waiter(gpu, at)
        starving = self._goes_next_by_waiting(gpu, best, at)
        if turn is None and starving and self._fits_with(gpu, best):
            self._grant(gpu, best, now, SHARED, actions, Role.TURN)
            turn = best
        if turn is None and not starving:
            # 5.3 A turn change: light work that cuts in, or that fits beside the next
            #     busy turn, runs now (a window); the turn goes to the best of the rest
            #     (busy work, and light work that fits neither way), once it fits and no
            #     light work that cuts in waits (it does not fit beside the leases still
            #     there: a turn begun beside them would keep it out, as it once did).
            #     Light work that cuts in and must wait (it does not fit beside the
            #     leases still there) is not pushed back by newer light work that does
            #     not fit beside it either: each such grant ran its own minimum slice.
            busy = [c for c, w in gpu.waiters.items() if not w.light]
            next_busy = [self._best_waiter(gpu, at, busy)] if busy else []
            kept_out: list[int] = []
            for client in [c for c, w in gpu.waiters.items() if w.light]:
                cuts_in = gpu.waiters[client].cuts_in
                runs_now = cuts_in or self._fits_with(gpu, client, *next_busy)
                if (
                    runs_now
                    and self._fits_with(gpu, client)
                    and self._fits(gpu, [client, *kept_out], keeping=False)
                ):
                    self._grant(gpu, client, now, SHARED, actions, Role.BESIDE)
                elif cuts_in:
                    kept_out.append(client)
            takers = [c for c, w in gpu.waiters.items() if not w.cuts_in]
            if takers and len(takers) == len(gpu.waiters):
                # Light work under the floor takes the turn only when no busy work waits
                # (the light-turn rule would take it back 2 s later): after a light turn,
                # light clients once passed the turn among themselves while a trainer
                # waited seconds.  It runs beside the busy turn, or cuts in for windows.
                if any(not gpu.waiters[c].light for c in takers):
                    takers = [
                        c
                        for c in takers
                        if not gpu.waiters[c].light or self._usage(c, gpu.uuid, now) >= LIGHT_FLOOR
                    ]
                # Back from the window, within its quantum: the same turn goes on.
                resuming = self._paused_turn(gpu, at)
                taker = (
                    resuming
                    if resuming is not None and resuming in takers
                    else self._best_waiter(gpu, at, takers)
                )
                if self._fits_with(gpu, taker):
                    self._grant(gpu, taker, now, SHARED, actions, Role.TURN)
                    turn = taker
        if turn is not None:
            # 5.2 Light work beside the turn, where it fits (the new turn's too).
            for client in [c for c, w in gpu.waiters.items() if w.light]:
                if self._fits_with(gpu, client):
                    self._grant(gpu, client, now, SHARED, actions, Role.BESIDE)
        if not gpu.waiters:
            return
        # The grants may have taken the best waiter: judge by those still waiting.
        best = self._best_waiter(gpu, at)
        starving = self._goes_next_by_waiting(gpu, best, at)
        # 6, 7. Others wait.
        # Light work that cannot run beside the holders waits at most light_wait_ms: they
        # are asked to drop DRAIN_MS before, once each has held min_slice_ms (no window
        # comes sooner after another), also while a waiter has waited a quantum: the turn
        # cut short keeps its clock, and that waiter goes first at its end.
        cutting_in = [w.requested_at for w in gpu.waiters.values() if w.cuts_in]
        light_waits_until = (
            min(cutting_in) + (gpu.settings.light_wait_ms - DRAIN_MS) / 1000.0
            if cutting_in
            else None
        )
        min_slice_s = gpu.settings.min_slice_ms / 1000.0

        def light_work_waited_out(held: Lease) -> bool:
            """That light work's wait (less the drain) and this lease's minimum slice are up."""
            return light_waits_until is not None and at.reached(
                max(held.granted_at + min_slice_s, light_waits_until)
            )

        if turn is None:
            # A window (light work while the turn waits): each lease in it gives the
            # GPU back as soon as it is idle; once the turn waits a quantum, at once;
            # and as a turn is, for light work that cannot run beside it: a new
            # trainer in a window, light by its little use so far, is never idle.
            for client, held in gpu.holders.items():
                if held.drop_requested_at is not None:
                    continue
                if starving:
                    self._ask_to_drop(gpu, client, held, now, actions, DropReason.QUANTUM_OVER)
                elif light_work_waited_out(held):
                    self._ask_to_drop(gpu, client, held, now, actions, DropReason.LIGHT_WORK_WAITS)
                else:
                    self._ask_to_yield(gpu, client, held, now, actions, DropReason.WINDOW)
            return
        held = gpu.holders[turn]
        if held.drop_requested_at is not None:
            return
        quantum = gpu.settings.time_quantum_s
        if cutting_in:
            self._make_room_beside(gpu, turn, now, actions)
        if at.reached(held.turn_since + quantum) and not self._turn_goes_on(gpu, turn, held, at):
            self._ask_to_drop(gpu, turn, held, now, actions, DropReason.QUANTUM_OVER)
        elif light_work_waited_out(held):
            self._ask_to_drop(gpu, turn, held, now, actions, DropReason.LIGHT_WORK_WAITS)
            gpu.turn_paused = (turn, held.turn_since)
        elif self._light_work_holds_the_turn(gpu, turn, held, at):
            # A yield would not do: a loader idle 9 ms in 10 is never idle 50 ms.
            self._ask_to_drop(gpu, turn, held, now, actions, DropReason.LIGHT_TURN)
        elif held.yield_asked:
            pass
        elif (
            (starving and held.turn_since < gpu.waiters[best].requested_at + quantum)
            or cutting_in
            or self._yields_to(gpu, turn, held, best, now)
        ):
            # Someone with a better claim waits: release once idle.  A waiter that came to
            # have waited TQ during this turn, not one that had before it began: the
            # share groups' order passed it over then, and a yield at once undid that
            # (three trainers of three users: the least charged lost every turn at its
            # first pause, 43 / 41 / 10 %).  Not to one with more use: a trainer that
            # waited its turn has its first steps' pauses (50 ms and more), and lost its
            # turn in them (issue 35).
            # The best of those still waiting (above): light work granted beside just
            # now (little use) once made the turn yield for nobody.
            self._ask_to_yield(gpu, turn, held, now, actions, DropReason.OTHERS_WAIT)
        else:
            at.reached(now + LIGHT_CHECK_S)  # its use grows as it runs: look again
        if any(w.light and not w.cuts_in for w in gpu.waiters.values()):
            at.reached(now + LIGHT_CHECK_S)  # light work may come to cut in: look again

    def _yields_to(self, gpu: GpuState, turn: int, held: Lease, best: int, now: float) -> bool:
        """Whether the turn's holder yields to `best`, a busy waiter, by their uses."""
        holder, waiter = self._usage(turn, gpu.uuid, now), self._usage(best, gpu.uuid, now)
        if holder >= BUSY_LEASE_DUTY or self._keeps_the_gpu_busy(gpu, turn, held, now):
            return waiter <= YIELD_TO_USE_RATIO * holder
        return waiter <= holder

    def _keeps_the_gpu_busy(self, gpu: GpuState, client: int, held: Lease, now: float) -> bool:
        """Its lease keeps the GPU busy; one younger than HOLDS_PROVEN_S, as its client's
        last lease that old did (a turn resumed after a window, or begun after a yield:
        asked to yield then, the holder kept that ask for the whole lease).  Never an
        older shim's: its hold stands for its use, and would always be."""
        state = self.clients[client]
        if not state.features & FEATURE_USAGE:
            return False
        kept_busy = self._lease_kept_busy(gpu, client, held, now)
        return state.leases_kept_busy.get(gpu.uuid, False) if kept_busy is None else kept_busy

    def _lease_kept_busy(self, gpu: GpuState, client: int, held: Lease, now: float) -> bool | None:
        """Whether the lease kept the GPU busy BUSY_LEASE_DUTY of the time since its work
        began (less the shim's report lag); None before HOLDS_PROVEN_S of that."""
        if held.working_since is None or now - held.working_since < HOLDS_PROVEN_S:
            return None
        gained = self._lease_gpu_s(gpu, client, held, now)
        return gained >= BUSY_LEASE_DUTY * (now - held.working_since - USAGE_REPORT_LAG_S)

    def _lease_gpu_s(self, gpu: GpuState, client: int, held: Lease, now: float) -> float:
        """The GPU time its client has used since the lease was granted."""
        return self._meter(self.clients[client], gpu.uuid).total_s(now) - held.gpu_s_at_grant

    def _lease_reported(self, gpu: GpuState, client: int, now: float) -> None:
        """A use report: the lease's work began when its first report of more says."""
        held = gpu.holders.get(client)
        if held is None or held.working_since is not None:
            return
        gained = self._lease_gpu_s(gpu, client, held, now)
        if gained > 0:
            held.working_since = max(held.granted_at, now - gained)

    def _lease_ended(self, gpu: GpuState, client: int, held: Lease, now: float) -> None:
        """Remember whether it kept the GPU busy, for its next lease's first moments."""
        kept_busy = self._lease_kept_busy(gpu, client, held, now)
        if kept_busy is not None:
            self.clients[client].leases_kept_busy[gpu.uuid] = kept_busy

    def _make_room_beside(
        self, gpu: GpuState, turn: int, now: float, actions: list[Action]
    ) -> None:
        """Light work that cuts in would fit beside the turn but for the leases beside
        it: those are asked to give the GPU back once idle (2 ms), as in a window,
        before the turn is cut short for it (they are light: they ask again, and run
        beside again when they fit)."""
        crowded_out = any(
            w.cuts_in and self._fits(gpu, [turn, c], keeping=False) and not self._fits_with(gpu, c)
            for c, w in gpu.waiters.items()
        )
        if not crowded_out:
            return
        for client, held in gpu.holders.items():
            if client != turn and held.drop_requested_at is None:
                self._ask_to_yield(
                    gpu, client, held, now, actions, DropReason.WINDOW
                )  # at most once

    def _light_work_holds_the_turn(
        self, gpu: GpuState, turn: int, held: Lease, at: Moments
    ) -> bool:
        """Work that needs the turn waits while the turn's holder, after
        LIGHT_TURN_PROOF_S of it, is still under the floor: light work that came first.
        Work that needs the turn: busy work (often frozen near 2 x the floor, where it
        stopped being light beside the turn: no ratio to the holder's would hold), or
        light work that neither fits beside the turn nor cuts in (not under a quarter of
        the holder's use: two inference servers that did not fit together, and the
        second waited out the quantum while the first, never idle 50 ms, left the GPU
        idle)."""
        if all(waiter.light and waiter.cuts_in for waiter in gpu.waiters.values()):
            return False
        if self._usage(turn, gpu.uuid, at.now) >= LIGHT_FLOOR:
            at.reached(at.now + LIGHT_CHECK_S)  # its use may fall (a use report decides nothing)
            return False
        return at.reached(held.turn_since + LIGHT_TURN_PROOF_S)

    # ------------------------------------------------------------ actions on leases

    def _grant(
        self,
        gpu: GpuState,
        client: int,
        now: float,
        mode: str,
        actions: list[Action],
        role: Role = Role.TURN,
    ) -> None:
        waiter = gpu.waiters.pop(client)
        self._last_lease += 1
        auto = gpu.settings.anti_thrash is AntiThrash.AUTO
        release_when_idle = auto and mode == SHARED
        displaced = client in gpu.displaced
        gpu.displaced.discard(client)
        # A pipeline asks for its next GPU a few milliseconds into its turn here: too
        # late for a release-when-idle ask sent at the grant.  What it held while it
        # waited (or just before it asked) tells instead.
        since = waiter.requested_at - ACROSS_GPUS_SLACK_S
        turn_since = now
        resumed = False
        if role is Role.TURN:
            # Back from a window within its quantum: the same turn (past it, a new one).
            paused = gpu.turn_paused
            if paused is not None and self._paused_turn(gpu, Moments(now)) == client:
                turn_since, resumed = paused[1], True
            gpu.turn_paused = None
        # off: all run at once.  A turn back from a window displaces no one: the light
        # work of the window ran ~100 ms and has its pages back by faults next time.
        if role is Role.TURN and (auto or mode == EXCLUSIVE) and not resumed:
            self._displace_by(gpu, client)
        gpu.holders[client] = Lease(
            self._last_lease,
            mode,
            now,
            turn=role is Role.TURN,
            release_when_idle=release_when_idle,
            across_gpus=self._held_elsewhere_since(client, gpu, since),
            turn_since=turn_since,
        )
        if auto and role is Role.TURN:
            # Light work is measured against the turn holder: a new one, judged afresh.
            for other, waiting in gpu.waiters.items():
                if not waiting.judged_busy:
                    waiting.light, waiting.cuts_in = self._judge(gpu, other, now)
        state = self.clients[client]
        meter = self._meter(state, gpu.uuid)
        meter.thaw(now)
        if not state.features & FEATURE_USAGE:
            meter.start(now)  # an older shim: the hold stands for use
        gpu.holders[client].gpu_s_at_grant = meter.total_s(now)
        actions.append(
            Grant(
                client,
                state.pid,
                gpu.uuid,
                self._last_lease,
                mode == EXCLUSIVE,
                now - waiter.requested_at,
                release_when_idle,
                role.value if auto else "",
                use=self._usage(client, gpu.uuid, now) if auto else -1.0,
                # Not everyone's memory fits (gpu.fits is the whole GPU's): light work may
                # need windows, each a drop; a queue bounded by the longest kernel keeps a
                # step from being queued whole before the yield comes (shim/queue_bound.c).
                short_queue=auto and role is Role.TURN and not gpu.fits,
                displaced=displaced,
            )
        )

    def _displace_by(self, gpu: GpuState, client: int) -> None:
        """A turn of `client` alone on the GPU: whoever does not fit beside it may find
        its pages on the host when it comes back.  Windows of light work are left out:
        they are short and small, and faults bring back the little they push out; a
        prefetch of a trainer's resident gigabytes at every window would cost more
        (docs/scheduling.md, "When memory fits")."""
        if gpu.fits:
            return  # everyone's memory fits at once
        for other in gpu.users:
            if (
                other != client
                and gpu.uuid in self.clients[other].active
                and not self._fits(gpu, [client, other], keeping=True)
            ):
                gpu.displaced.add(other)

    def _ask_to_drop(
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
        self,
        gpu: GpuState,
        client: int,
        held: Lease,
        now: float,
        actions: list[Action],
        reason: DropReason,
    ) -> None:
        """Others wait: release as soon as idle (the shim also keeps its queue short
        meanwhile, so the drop that may follow drains fast).  Only to shims that
        understand it (an older one would take it for a drop and cut its turn
        short), and not to a process working on several GPUs: its shim's own idle
        release (idle_release_ms) and the quantum still apply."""
        state = self.clients[client]
        if held.yield_asked or not state.features & FEATURE_YIELD:
            return
        if held.across_gpus or self._held_elsewhere_since(client, gpu, now):
            return
        held.yield_asked = True
        actions.append(self._drop_request(gpu, client, held, now, reason, YIELD_IDLE[reason]))

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
            use=self._usage(client, gpu.uuid, now),
        )

    def _ask_to_drop_each(
        self, gpu: GpuState, now: float, actions: list[Action], reason: DropReason
    ) -> None:
        for client, held in gpu.holders.items():
            if held.drop_requested_at is None:
                self._ask_to_drop(gpu, client, held, now, actions, reason)

    def _drain_shared_holders(self, gpu: GpuState, now: float, actions: list[Action]) -> None:
        """Anti-thrash just came on: shared holders must all leave before anyone
        holds exclusively.  A lone exclusive holder (granted before anti-thrash
        went off, and never joined by others) simply keeps its lease."""
        holders = gpu.holders
        if len(holders) == 1 and next(iter(holders.values())).mode == EXCLUSIVE:
            return
        self._ask_to_drop_each(gpu, now, actions, DropReason.ANTI_THRASH_ON)
