"""The lock's rules, per GPU: given the state of one GPU at `now`, what to revoke,
whom to ask to drop or to yield, and whom to grant (docs/scheduling.md).

A part of the scheduling core (scheduler.Scheduler inherits it), kept apart so
that the events and the bookkeeping (scheduler.py) and the rules themselves
can each be read in one sitting.  Pure, like the rest of the core.
"""

from __future__ import annotations

from .actions import Action, AskToDrop, Grant, Revoke
from .core_state import EXCLUSIVE, FEATURE_YIELD, SHARED, ClientState, GpuState, Lease, Waiter
from .settings import AntiThrash
from .usage import UsageMeter

# auto: a client is light when its recent use (0..1) is under LIGHT_FLOOR, or
# at most LIGHT_RATIO of the turn holder's.  A notebook bursting 50 ms every
# 2 s uses ~0.03; a trainer ~1.  A light lease beside the turn ends once its
# client's use passes KEEP_LIGHT_FACTOR times those figures (hysteresis).
LIGHT_FLOOR = 0.1
LIGHT_RATIO = 0.25
KEEP_LIGHT_FACTOR = 2.0
# auto: how often leases beside the turn are checked for still being light.
LIGHT_CHECK_S = 0.25
# A client that held another GPU this long before asking for one works across GPUs.
ACROSS_GPUS_SLACK_S = 1.0
# auto: a holder others wait for releases after this long idle (DROP_REQUEST
# WHEN_IDLE), instead of idle_release_ms: a notebook's cell is over, the
# trainer behind it should not wait a second for nothing.
YIELD_IDLE_MS = 50


class LockRules:
    """The rules; the scheduler provides the state they work on.  Each GPU runs
    by its own settings (gpu.settings: the node-wide ones with the GPU's own over
    them), which the scheduler keeps up to date."""

    clients: dict[int, ClientState]
    gpus: dict[bytes, GpuState]
    _last_lease: int

    def _push_deadline(self, due: float, key: bytes | int) -> None:
        raise NotImplementedError  # the scheduler's

    # ------------------------------------------------------------ which rules

    def _policy(self, gpu: GpuState) -> str:
        """Which rule serves this GPU now: "on", "off", "auto-shared", "auto-exclusive"."""
        mode = gpu.settings.anti_thrash
        if mode is AntiThrash.AUTO:
            return "auto-shared" if gpu.fits else "auto-exclusive"
        return str(mode.value)

    # ------------------------------------------------------------ usage (auto)

    def _meter(self, state: ClientState, uuid: bytes) -> UsageMeter:
        meter = state.usage.get(uuid)
        if meter is None:
            meter = state.usage[uuid] = UsageMeter()
        return meter

    def _usage(self, client: int, uuid: bytes, now: float) -> float:
        meter = self.clients[client].usage.get(uuid)
        return 0.0 if meter is None else meter.at(now)

    def _turn_holder(self, gpu: GpuState) -> int | None:
        for client, held in gpu.holders.items():
            if held.turn:
                return client
        return None

    def _turn_elsewhere_others_want(self, client: int, gpu: GpuState) -> bool:
        """Whether it is the client's turn on another GPU that others wait for: one
        process working across GPUs (a pipeline), whose turn there would go to waste
        while it waited here.  (A turn nobody else wants there wastes nothing.)"""
        for uuid in self.clients[client].gpus:  # the GPUs it named: at most MAX_GPUS
            other = self.gpus.get(uuid) if uuid != gpu.uuid else None
            held = other.holders.get(client) if other is not None else None
            if held is not None and held.turn and other is not None and other.waiters:
                return True
        return False

    def _held_elsewhere_since(self, client: int, gpu: GpuState, since: float) -> bool:
        """Whether the client held another GPU at some time from `since` on."""
        state = self.clients[client]
        for uuid in state.gpus:
            meter = state.usage.get(uuid) if uuid != gpu.uuid else None
            if meter is not None and (meter.busy or meter.stamp >= since):
                return True
        return False

    def _judge(self, gpu: GpuState, client: int, now: float) -> tuple[bool, bool]:
        """(light, much lighter than the turn holder) for a request arriving now.

        A client whose turn it is on another GPU, a turn others wait for there, counts
        as light here: a process working across GPUs needs them at once, and waiting
        here for a quantum would leave its turn there idle.  Only beside the turn, while memory fits; it never
        cuts an exclusive turn short for that (much_lighter stays its use's)."""
        if gpu.settings.anti_thrash is not AntiThrash.AUTO:
            return False, False
        holder = self._turn_holder(gpu)
        if holder is None:
            return False, False  # nothing to cut in ahead of: it takes the turn
        used = self._usage(client, gpu.uuid, now)
        much_lighter = used < LIGHT_RATIO * self._usage(holder, gpu.uuid, now)
        light = used < LIGHT_FLOOR or much_lighter
        return light or self._turn_elsewhere_others_want(client, gpu), much_lighter

    def _still_light(self, gpu: GpuState, client: int, turn: int | None, now: float) -> bool:
        used = self._usage(client, gpu.uuid, now)
        if used < KEEP_LIGHT_FACTOR * LIGHT_FLOOR or turn is None:
            return True
        if self._turn_elsewhere_others_want(client, gpu):
            return True  # as _judge: beside here while its turn there lasts
        return used <= KEEP_LIGHT_FACTOR * LIGHT_RATIO * self._usage(turn, gpu.uuid, now)

    def _best_waiter(self, gpu: GpuState, now: float) -> int:
        """First come first served (on); least recent use first, those waiting a
        quantum or more before all others, oldest first (auto)."""
        if gpu.settings.anti_thrash is not AntiThrash.AUTO:
            return next(iter(gpu.waiters))
        starving_after = gpu.settings.time_quantum_s
        uuid = gpu.uuid

        def order(item: tuple[int, Waiter]) -> tuple[bool, float, float]:
            client, waiter = item
            starving = now - waiter.requested_at >= starving_after
            used = 0.0 if starving else self._usage(client, uuid, now)
            return (not starving, used, waiter.requested_at)

        return min(gpu.waiters.items(), key=order)[0]

    def _is_starving(self, gpu: GpuState, waiter: Waiter, now: float) -> bool:
        return now - waiter.requested_at >= gpu.settings.time_quantum_s

    def _light_work_waits(self, gpu: GpuState, best: Waiter, now: float) -> bool:
        """auto, exclusive turns: the best waiter may cut the holder's turn short after
        its minimum slice.  Not while shared holders drain (the GPU is not one
        holder's yet).  The rules and the deadline both ask this one question: a
        deadline the rules would not act on comes back at once, for ever."""
        draining = any(held.mode == SHARED for held in gpu.holders.values())
        return best.much_lighter and not draining and not self._is_starving(gpu, best, now)

    # ------------------------------------------------------------ the lock, per GPU

    def _update(self, gpu: GpuState, now: float, actions: list[Action]) -> None:
        """Bring one GPU up to date at `now`: revoke, ask to drop, grant; then
        note when it must be looked at next."""
        policy = self._policy(gpu)
        self._revoke_overdue(gpu, now, actions)
        if policy == "off":
            while gpu.waiters:
                self._grant(gpu, next(iter(gpu.waiters)), now, SHARED, actions)
        elif policy == "on":
            self._take_turns_first_come(gpu, now, actions)
        elif policy == "auto-shared":
            self._run_side_by_side(gpu, now, actions)
        else:
            self._take_turns_fairly(gpu, now, actions)
        self._schedule(gpu, now, policy)

    def _revoke_overdue(self, gpu: GpuState, now: float, actions: list[Action]) -> None:
        # Revoking makes room for a waiter; with none left (the only one
        # withdrew or exited after the drop request) it would only cut a
        # holder off for nothing.  The drop request stays pending, so a new
        # waiter does not have to wait another grace for an overdue holder.
        if not (gpu.holders and gpu.waiters):
            return
        grace = gpu.settings.drop_grace_ms / 1000.0
        for client, held in list(gpu.holders.items()):
            if held.drop_requested_at is not None and now >= held.drop_requested_at + grace:
                del gpu.holders[client]
                state = self.clients[client]
                self._meter(state, gpu.uuid).stop(now)
                actions.append(
                    Revoke(client, state.pid, gpu.uuid, held.number, now - held.granted_at)
                )

    def _take_turns_first_come(self, gpu: GpuState, now: float, actions: list[Action]) -> None:
        """anti-thrash on: one exclusive holder, FCFS, turns of at most the quantum."""
        if not gpu.waiters:
            return
        if not gpu.holders:
            self._grant(gpu, next(iter(gpu.waiters)), now, EXCLUSIVE, actions)
            return
        if len(gpu.holders) == 1:
            client, held = next(iter(gpu.holders.items()))
            if (
                held.drop_requested_at is None
                and now >= held.granted_at + gpu.settings.time_quantum_s
            ):
                self._ask_to_drop(gpu, client, held, now, actions, "quantum over")

    def _run_side_by_side(self, gpu: GpuState, now: float, actions: list[Action]) -> None:
        """auto, memory fits: one turn for busy clients, light ones beside it."""
        turn = self._turn_holder(gpu)
        if turn is None and gpu.waiters:
            turn = self._best_waiter(gpu, now)
            self._grant(gpu, turn, now, SHARED, actions, turn=True)
        for client, waiter in list(gpu.waiters.items()):
            if waiter.light:
                self._grant(gpu, client, now, SHARED, actions, turn=False)
        beside = [(c, lease) for c, lease in gpu.holders.items() if not lease.turn]
        if beside and (gpu.light_check_at is None or now >= gpu.light_check_at):
            for client, held in beside:
                if held.drop_requested_at is None and not self._still_light(gpu, client, turn, now):
                    self._ask_to_drop(gpu, client, held, now, actions, "no longer light")
            gpu.light_check_at = now + LIGHT_CHECK_S
        elif not beside:
            gpu.light_check_at = None
        if turn is not None and gpu.waiters:
            held = gpu.holders[turn]
            if held.drop_requested_at is not None:
                return
            if now >= held.granted_at + gpu.settings.time_quantum_s:
                self._ask_to_drop(gpu, turn, held, now, actions, "quantum over")
            else:
                self._ask_to_yield(gpu, turn, held, now, actions)

    def _take_turns_fairly(self, gpu: GpuState, now: float, actions: list[Action]) -> None:
        """auto, memory does not fit (or its size is unknown): one exclusive holder."""
        for client, held in gpu.holders.items():
            # Through the same drain as anti-thrash switched on: everyone beside
            # leaves before anyone holds alone.
            if held.mode == SHARED and held.drop_requested_at is None:
                self._ask_to_drop(gpu, client, held, now, actions, "memory does not fit")
        if not gpu.waiters:
            return
        if not gpu.holders:
            self._grant(gpu, self._best_waiter(gpu, now), now, EXCLUSIVE, actions)
            return
        best = gpu.waiters[self._best_waiter(gpu, now)]
        for client, held in gpu.holders.items():
            if held.mode != EXCLUSIVE or held.drop_requested_at is not None:
                continue
            # Compared as the deadline is computed (granted_at + slice), so that the
            # tick at that deadline sees it due: float rounding must not disagree.
            if now >= held.granted_at + gpu.settings.time_quantum_s:
                self._ask_to_drop(gpu, client, held, now, actions, "quantum over")
            elif self._light_work_waits(gpu, best, now) and now >= held.granted_at + (
                gpu.settings.min_slice_ms / 1000.0
            ):
                self._ask_to_drop(gpu, client, held, now, actions, "light work waits")
            else:
                self._ask_to_yield(gpu, client, held, now, actions)

    def _grant(
        self,
        gpu: GpuState,
        client: int,
        now: float,
        mode: str,
        actions: list[Action],
        turn: bool = True,
    ) -> None:
        waiter = gpu.waiters.pop(client)
        self._last_lease += 1
        auto = gpu.settings.anti_thrash is AntiThrash.AUTO
        release_when_idle = auto and mode == SHARED
        # A pipeline asks for its next GPU a few milliseconds into its turn here: too
        # late for a release-when-idle ask sent at the grant.  What it held while it
        # waited (or just before it asked) tells instead.
        since = waiter.requested_at - ACROSS_GPUS_SLACK_S
        gpu.holders[client] = Lease(
            self._last_lease,
            mode,
            now,
            turn=turn,
            release_when_idle=release_when_idle,
            across_gpus=self._held_elsewhere_since(client, gpu, since),
        )
        state = self.clients[client]
        self._meter(state, gpu.uuid).start(now)
        actions.append(
            Grant(
                client,
                state.pid,
                gpu.uuid,
                self._last_lease,
                mode == EXCLUSIVE,
                now - waiter.requested_at,
                release_when_idle,
                ("turn" if turn else "beside") if auto else "",
            )
        )

    def _ask_to_drop(
        self,
        gpu: GpuState,
        client: int,
        held: Lease,
        now: float,
        actions: list[Action],
        reason: str,
    ) -> None:
        held.drop_requested_at = now
        actions.append(
            AskToDrop(
                client,
                self.clients[client].pid,
                gpu.uuid,
                held.number,
                now - held.granted_at,
                reason=reason,
            )
        )

    def _ask_to_yield(
        self, gpu: GpuState, client: int, held: Lease, now: float, actions: list[Action]
    ) -> None:
        """Others wait: release as soon as idle.  Only to shims that understand it
        (an older one would take it for a drop and cut its turn short), and not to a
        process working on several GPUs: it leaves each idle while it works on another
        (a pipeline's stage), which is no sign it is done, and it may be granted its
        next GPU only after this ask went out.  Its shim's own idle release
        (idle_release_ms) and the quantum still apply."""
        state = self.clients[client]
        if held.yield_asked or not state.features & FEATURE_YIELD:
            return
        if held.across_gpus or self._held_elsewhere_since(client, gpu, now):
            return
        held.yield_asked = True
        actions.append(
            AskToDrop(
                client,
                state.pid,
                gpu.uuid,
                held.number,
                now - held.granted_at,
                when_idle_ms=YIELD_IDLE_MS,
                reason="others wait",
            )
        )

    def _ask_to_drop_each(
        self, gpu: GpuState, now: float, actions: list[Action], reason: str
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
        self._ask_to_drop_each(gpu, now, actions, "anti-thrash on")

    # ------------------------------------------------------------ deadlines

    def _schedule(self, gpu: GpuState, now: float, policy: str) -> None:
        due = self._gpu_deadline(gpu, now, policy)
        if due != gpu.deadline:
            gpu.deadline = due
            if due is not None:
                self._push_deadline(due, gpu.uuid)

    def _gpu_deadline(self, gpu: GpuState, now: float, policy: str) -> float | None:
        settings = gpu.settings
        due: float | None = None
        if policy == "auto-shared" and gpu.light_check_at is not None:
            due = gpu.light_check_at
        if not gpu.waiters or policy == "off":
            return due  # no one to make room for: no drop request, no revoke
        grace = settings.drop_grace_ms / 1000.0
        light_waits = False
        if policy == "auto-exclusive":
            best = gpu.waiters[self._best_waiter(gpu, now)]
            light_waits = self._light_work_waits(gpu, best, now)
        for held in gpu.holders.values():
            if held.drop_requested_at is not None:
                when = held.drop_requested_at + grace
            elif held.turn:
                when = held.granted_at + settings.time_quantum_s
                if light_waits:
                    when = min(when, held.granted_at + settings.min_slice_ms / 1000.0)
            else:
                continue
            if due is None or when < due:
                due = when
        return due
