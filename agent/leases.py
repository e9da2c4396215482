"""Acting on leases, per GPU: grants, asks to drop or to yield, revokes, and who a grant
displaces.  The policy (policy.py) decides; this carries its decisions into the core's
state and the actions the engine carries out.  Pure, like the rest of the core."""

from __future__ import annotations

import enum
import math
from collections.abc import Callable

from . import memory_fit
from .actions import Action, AskToDrop, Grant, Revoke
from .core_state import (
    EXCLUSIVE,
    FEATURE_YIELD,
    ClientState,
    GpuState,
    Lease,
    Waiter,
)
from .deadlines import Moments
from .settings import AntiThrash
from .usage import CHECK_S, MIN_MEASURED_S, meter_of

# A holder asked to yield (work in bursts in a waiter's way, or any holder in the way of
# work in bursts) releases once idle this long: at its next gap.  A loader busy 0.4 ms in
# every 10 is never idle longer than that.
YIELD_IDLE_MS = 2
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


class Leases:
    """The lease actions over the scheduler's state; usage and note_wait are the
    policy's (what the log shows, a wait's end)."""

    def __init__(
        self,
        clients: dict[int, ClientState],
        gpus: dict[bytes, GpuState],
        usage: Callable[[int, bytes, float], float],
        note_wait: Callable[[GpuState, int, Waiter, str, float], None],
    ):
        self.clients = clients
        self.gpus = gpus
        self._usage = usage
        self._note_wait = note_wait
        self.last_lease = 0

    def revoke_overdue(self, gpu: GpuState, at: Moments, actions: list[Action]) -> None:
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
                self.lease_ended(state, gpu.uuid, held, at.now)
                actions.append(
                    Revoke(client, state.pid, gpu.uuid, held.number, at.now - held.granted_at)
                )

    def note_usage(self, client: int, uuid: bytes, busy_s: float, now: float) -> None:
        """A measuring shim's running total of GPU time on a GPU (usage.py); where it grew
        for the first time in a lease, the lease ran from then on (ran_since)."""
        meter = meter_of(self.clients[client], uuid, now)
        meter.report(now, busy_s)
        held = self.gpus[uuid].holders.get(client) if uuid in self.gpus else None
        if held is not None and held.ran_since is None:
            ran_s = meter.total_s(now) - held.gpu_s_at_grant
            if ran_s > 0:  # the shim reports as its first work after a quiet spell begins
                held.ran_since = max(held.granted_at, now - ran_s)

    def lease_ended(
        self, state: ClientState, uuid: bytes, held: Lease, now: float, idle_s: float = 0.0
    ) -> None:
        """A lease given back (idle for its last idle_s) or revoked: how busy it kept the
        GPU, the sign of work in bursts (policy.bursty).  The shim reports its GPU time
        as it lets go, so the figure is whole; a lease under MIN_MEASURED_S tells too little
        and leaves the last one."""
        meter = meter_of(state, uuid, now)
        meter.stop(now, idle_s)
        held_s = max(0.0, now - held.granted_at - held.prefetch_s)
        if held_s >= MIN_MEASURED_S:
            used = meter.total_s(now) - held.gpu_s_at_grant
            state.lease_duty[uuid] = min(1.0, used / held_s)
            # A stretch alone tells if long enough, or ended at its own gap (a trainer's
            # turn, asked to yield, at its 2 ms pause); not one cut short mid-burst.
            tells = held_s >= CHECK_S or idle_s > 0
            if held.alone and state.measures and tells:  # GPU time, not the hold
                state.alone_lease[uuid] = (used, held_s, now)
        told = state.alone_lease.get(uuid)
        if not held.alone and told is not None and told[2] >= held.granted_at:
            state.alone_lease[uuid] = (*told[:2], now)  # its stretch alone held on till now

    def grant(
        self,
        gpu: GpuState,
        client: int,
        now: float,
        mode: str,
        role: Role,
        actions: list[Action],
    ) -> None:
        waiter: Waiter = gpu.waiters.pop(client)
        self._note_wait(gpu, client, waiter, "", now)
        self.last_lease += 1
        auto = gpu.settings.anti_thrash is AntiThrash.AUTO
        pushed_out = gpu.displaced.pop(client, None)
        displaced = pushed_out is not None
        if gpu.settings.anti_thrash is not AntiThrash.OFF:  # off: nobody is kept apart
            self._displace_by(gpu, client, role is Role.TURN)
        for other, beside in gpu.holders.items():
            if beside.alone:  # at most one: its stretch alone ends here, what it told stands
                told = _held_alone_so_far(self.clients[other], beside, gpu.uuid)
                if told is not None:
                    self.clients[other].alone_lease[gpu.uuid] = (*told, now)
            beside.alone = False
        gpu.holders[client] = Lease(
            self.last_lease,
            mode,
            now,
            release_when_idle=auto,
            across_gpus=self._held_elsewhere_since(
                client, gpu, waiter.requested_at - ACROSS_GPUS_SLACK_S
            ),
            turn_since=now,
            turn=role is Role.TURN,
            alone=not gpu.holders,
        )
        state = self.clients[client]
        meter = meter_of(state, gpu.uuid, now)
        meter.thaw(now, at_next_report=state.measures)
        if not state.measures:
            meter.start(now)  # an older shim: the hold stands for use
        gpu.holders[client].gpu_s_at_grant = ran_s = meter.total_s(now)
        if pushed_out is not None and ran_s > 0:  # what it brings back (never ran: nothing)
            pushed_out = min(pushed_out, state.managed.get(gpu.uuid, 0))
            gpu.holders[client].prefetch_s = pushed_out / memory_fit.PAGE_IN_BYTES_PER_S
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
                use=self._usage(client, gpu.uuid, now) if auto else -1.0,
                # Not everyone fits: work owed more may cut this lease short, and a queue
                # bounded by the longest kernel drains fast (shim/queue_bound.c).
                short_queue=auto and not gpu.fits,
                displaced=displaced,
            )
        )

    def _displace_by(self, gpu: GpuState, client: int, turn: bool) -> None:
        """A grant: whoever would page beside `client` and the holders (past the GPU's own
        memory, not memory_limit: under a limit alone nothing moves) may find its pages on
        the host when it comes back; its next grant says so, and its shim prefetches them.
        Work in bursts too: it cuts in only once the turn it cuts short has paid for such a
        page-in, and faults brought a trainer's pages back at 8.5 GB/s, not 49 (a cell
        beside a 60 GiB trainer cost it 1.7 s; a prefetch of what stayed is ~0.7 ms/GiB).
        Where the GPU's own memory is unknown, only a turn displaces, whoever does not fit
        beside it: else every grant would, and each prefetch what never left."""
        if gpu.fits:
            return  # everyone's memory fits at once
        # One walk of the clients, then a sum per other (a hundred clients once made each
        # handoff cost 2 ms).
        demand = memory_fit.Demand(gpu, self.clients)
        at_work = demand.of((*gpu.holders, client))
        if demand.overflow(at_work) is None and not turn:
            return
        alone = demand.of((client,))
        for other in gpu.users:
            state = self.clients[other]
            if other == client or gpu.uuid not in state.active:
                continue
            overflow = demand.overflow(at_work + demand.adds(other))  # had it run beside them
            if overflow or (overflow is None and not demand.fits(alone + demand.adds(other), True)):
                gpu.displaced[other] = max(gpu.displaced.get(other, 0), overflow or 0)

    def _held_elsewhere_since(self, client: int, gpu: GpuState, since: float) -> bool:
        """A process working across GPUs (a pipeline): it held another GPU at some time
        from `since` on.  It is never asked to yield here."""
        state = self.clients[client]
        for uuid in state.gpus:
            if uuid == gpu.uuid:
                continue
            other = self.gpus.get(uuid)
            if other is not None and client in other.holders:
                return True
            meter = state.usage.get(uuid)
            if meter is None or meter.stamp < since:
                continue
            # Its meter's stamp is its last activity once it has had GPU time there; a
            # meter made at a request only waited (it would never be asked to yield here).
            if meter.busy or meter.total_s(meter.stamp) > 0:
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

    def ask_to_yield(
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
            use=self._usage(client, gpu.uuid, now),
        )

    def ask_each_to_drop(
        self, gpu: GpuState, now: float, actions: list[Action], reason: DropReason
    ) -> None:
        for client, held in gpu.holders.items():
            if held.drop_requested_at is None:
                self.ask_to_drop(gpu, client, held, now, actions, reason)


def _held_alone_so_far(state: ClientState, held: Lease, uuid: bytes) -> tuple[float, float] | None:
    """A lease held alone, once CHECK_S of it is reported: its GPU time and length so far
    (to its latest report, from after its grant's prefetch)."""
    if not held.alone or not state.measures:
        return None
    meter = state.usage.get(uuid)
    if meter is None:
        return None
    measured_s = meter.stamp - held.granted_at - held.prefetch_s
    if measured_s < CHECK_S:
        return None
    return meter.total_s(meter.stamp) - held.gpu_s_at_grant, measured_s


def shown_duty(state: ClientState, held: Lease, uuid: bytes, now: float) -> float:
    """How busy a holder has shown itself on a GPU: this lease since it first ran, once
    that is CHECK_S ago (to now: a shim reports only while its GPU time grows); before,
    its latest stretch alone that told (alone_duty), else its last lease; nothing told,
    1.0: not taken for light on no evidence (a newcomer 50 % busy in 3 ms bursts once
    yielded at every gap and got no GPU time, policy_sim).  A shim that does not measure
    shows its holds."""
    meter = state.usage.get(uuid)
    if meter is not None and held.ran_since is not None and now - held.ran_since >= CHECK_S:
        return min(1.0, (meter.total_s(now) - held.gpu_s_at_grant) / (now - held.ran_since))
    alone = alone_duty(state, None, uuid)
    return alone if alone is not None else state.lease_duty.get(uuid, 1.0)


def alone_duty(state: ClientState, held: Lease | None, uuid: bytes) -> float | None:
    """How busy its latest stretch alone kept the GPU as its shim measured it (policy's
    saturating): the lease it holds alone now (`held`), once CHECK_S is reported; else its
    last that told (lease_ended, or cut off by another let in beside it), from grant (after
    its prefetch) until it asked again (work yielding at each gap is idle in between);
    None where none told yet: it came beside others, or never held long enough."""
    now_alone = None if held is None else _held_alone_so_far(state, held, uuid)
    if now_alone is not None:
        return min(1.0, now_alone[0] / now_alone[1])
    busy_s, held_s, ended_at = state.alone_lease.get(uuid, (0.0, 0.0, 0.0))
    if held_s <= 0:
        return None
    asked_after_s = max(0.0, state.asked_at.get(uuid, -math.inf) - ended_at)
    return busy_s / (held_s + asked_after_s)
