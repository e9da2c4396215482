"""The fair page as policy_sim plays it (shim/fair_share.c; docs/scheduling.md, "Side by
side"): among the holders of a GPU, one more than LEAD_S of virtual time (time with work
on the GPU, over the number then on it, over weight) ahead of another with work holds its
launches, and only its queued work, at most QUEUE_S of it, still runs. Looked at every
step (the shim's look is ~1 ms, a step's length; each reads the others' state of the look
before). Back from a gap shorter than IDLE_S a client keeps its place, but at most LEAD_S
behind the least of those with work (or the least it saw within STALE_S); back after
IDLE_S or more, or new, it starts level with that least (else the latest of the others
holding, all idle), and for its first BURST_CREDIT_S of virtual time, or as much as that
least ran on while it was away but not waiting for its grant (up to MAX_CREDIT_S; a
newcomer was not away), it is neither held nor, for half of it, its queue short (a
request, a cell: latency work first). A client keeps its slot between leases, as its
shim keeps its state. Its queue is short (QUEUE_S) while it is, or was within STICKY_S,
near a hold (half the lead ahead), else long: what it has queued when a hold begins still
runs."""

from __future__ import annotations

from dataclasses import dataclass

# The shim's constants (shim/fair_share.c, shim/queue_bound.c), in seconds.
LEAD_S = 0.005
QUEUE_S = 0.005  # the queue bound while others have work (SHORT_MAX_QUEUED_MS)
LONG_QUEUE_S = 0.050  # else (NVSHARE_MAX_QUEUED_MS's default)
STICKY_S = 0.010  # the short bound stays this long after it was last near a hold
IDLE_S = 0.010
STALE_S = 0.020  # a least seen this recently still counts (STALE_MS)
MAX_AHEAD_S = 0.020  # never further ahead of another with work
BURST_CREDIT_S = 0.030  # back from idle, not held nor short for this much virtual time
MAX_CREDIT_S = 0.250  # or for what the others ran on meanwhile, up to this


@dataclass
class Slot:
    weight: int
    vtime: float = 0.0
    backlogged: bool = False
    idle_since: float | None = None  # when it last went idle (None: never had work)
    least_at_idle: float | None = None  # the others' least then (None: none seen)
    least_seen: float = 0.0  # the others' least at the last look that saw one
    least_seen_at: float = -1e9
    burst_used: float = 0.0  # virtual time used since it came back from IDLE_S idle
    credit: float = BURST_CREDIT_S  # not held while burst_used is under this
    held: bool = False
    queued_s: float = 0.0  # held: what of its queued work may still run
    near_hold_at: float = -1e9  # when it was last near a hold (its queue short)
    sharing: int = 1  # itself and the others it saw on the GPU at its last look


class FairPage:
    def __init__(self) -> None:
        self.slots: dict[int, Slot] = {}
        self.on_gpu: set[int] = set()  # those that ran since the last look

    def look(
        self,
        with_work: dict[int, bool],
        weights: dict[int, int],
        now: float,
        waited: dict[int, float] | None = None,
    ) -> None:
        """with_work: each holder, whether it has work; waited: how long each one's lease took
        to be granted.  Another keeps its slot, as its shim keeps its state between leases,
        and shows no work."""
        waited = waited or {}
        for number in with_work:
            self.slots.setdefault(number, Slot(weights[number])).weight = weights[number]
        # What each showed at its last look: the others read it a look late.
        shown = {n: s.backlogged for n, s in self.slots.items()}
        shown_on_gpu, self.on_gpu = self.on_gpu, set()
        for number, slot in self.slots.items():
            backlogged = with_work.get(number, False)
            others = [o.vtime for n, o in self.slots.items() if n != number and shown[n]]
            least = min(others) if others else None
            least_by = least  # to come back by: else one seen within STALE_S
            idle = [o.vtime for n, o in self.slots.items() if n != number and n in with_work]
            if least is not None:
                slot.least_seen, slot.least_seen_at = least, now
            elif now - slot.least_seen_at < STALE_S:
                least_by = slot.least_seen  # the others between two steps
            elif idle:
                least_by = max(idle)  # the latest of the others holding, idle now
            resumed = backlogged and not slot.backlogged
            away = slot.idle_since is not None  # a newcomer was not
            back = resumed and (not away or now - slot.idle_since >= IDLE_S)
            if resumed and not back and least_by is not None:
                slot.vtime = max(slot.vtime, least_by - LEAD_S)  # a short gap: not owed more
            if back:
                slot.burst_used = 0.0
                # Its credit: what the least ran on while it was away, within bounds.
                since = slot.least_at_idle if slot.least_at_idle is not None else slot.vtime
                ran = least_by - since if away and least_by is not None else 0.0
                # Time it waited for its grant it wanted: no credit for that part.
                if away and now > slot.idle_since:
                    gap = now - slot.idle_since
                    ran *= max(0.0, gap - waited.get(number, 0.0)) / gap
                slot.credit = min(max(ran, BURST_CREDIT_S), MAX_CREDIT_S)
                if least_by is not None and least_by > slot.vtime:
                    slot.vtime = least_by  # back from idle: level
            in_burst = slot.burst_used < slot.credit
            queue_free = slot.burst_used < slot.credit / 2  # its queue long
            if not backlogged and slot.backlogged:
                slot.idle_since, slot.least_at_idle = now, least_by
            slot.backlogged = backlogged
            if number not in with_work:
                slot.held = False
                continue
            slot.sharing = 1 + len(shown_on_gpu - {number})
            # The bound its launches since the last look were under: short while it saw
            # another with work, and STICKY_S after.
            short = not queue_free and now - slot.near_hold_at <= STICKY_S + 0.0015
            if not queue_free and least is not None and least + LEAD_S / 2 < slot.vtime:
                slot.near_hold_at = now
            held = backlogged and not in_burst and least is not None and least + LEAD_S < slot.vtime
            if held and not slot.held:
                slot.queued_s = QUEUE_S if short else LONG_QUEUE_S
            slot.held = held

    def may_run(self, number: int) -> bool:
        slot = self.slots.get(number)
        return slot is None or not slot.held or slot.queued_s > 0

    def ran(self, number: int, gpu_s: float, busy_s: float) -> None:
        """number had work on the GPU for busy_s and got gpu_s of it."""
        slot = self.slots.get(number)
        if slot is None:
            return
        charge = busy_s / slot.sharing / slot.weight
        slot.vtime += charge
        slot.burst_used += charge
        self.on_gpu.add(number)
        others = [o.vtime for n, o in self.slots.items() if n != number and o.backlogged]
        if others:
            slot.vtime = min(slot.vtime, min(others) + MAX_AHEAD_S)
        if slot.held:
            slot.queued_s -= gpu_s
