"""The fair page as policy_sim plays it (shim/fair_share.c; docs/scheduling.md, "Side by
side"): among the holders of a GPU, one more than LEAD_S of virtual time (time with work
on the GPU, over the number then on it, over weight) ahead of another with work holds its
launches, and only its queued work, at most QUEUE_S of it, still runs. Looked at every
step (the shim's look is ~1 ms, a step's length; each reads the others' state of the look
before), but a held one goes on in the step the one it waited for shows no work: that
shim's look rings the page's bell, and the held thread looks again at once. Back from a
gap shorter than IDLE_S a client keeps its place, but at most LEAD_S behind the least of
those with work (or the least it saw within STALE_S); back after IDLE_S or more, or new,
it starts level with that least (else the latest of the others looking, all idle), and for
its first BURST_CREDIT_S of virtual time, or as much as that least ran on while it was
away and had not asked again for the GPU (up to MAX_CREDIT_S; a newcomer was not away), it
is neither held nor, for half of it, its queue short (a request, a cell: latency work
first). A client keeps its slot between leases, as its shim keeps its state. Its queue is
short (QUEUE_S) while it is, or was within STICKY_S, near a hold (half the lead ahead),
else long: what it has queued when a hold begins still runs."""

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
MAX_CREDIT_S = 0.400  # or for what the others ran on meanwhile, up to this


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
    seen_at: float = -1e9  # its last look (a shim looks only while it holds the GPU)
    queued_s: float = 0.0  # held: what of its queued work may still run
    near_hold_at: float = -1e9  # when it was last near a hold (its queue short)
    sharing: int = 1  # itself and the others it saw on the GPU at its last look
    blockers: tuple[int, ...] = ()  # held: those a lead behind it at its last look


class FairPage:
    def __init__(self) -> None:
        self.slots: dict[int, Slot] = {}
        self.on_gpu: set[int] = set()  # those that ran since the last look
        self.asked_at: dict[int, float] = {}  # when each asked for the grant it holds

    def asked(self, number: int, at: float) -> None:
        """number was granted the GPU for a request made at `at`."""
        self.asked_at[number] = at

    def look(self, with_work: dict[int, bool], weights: dict[int, int], now: float) -> None:
        """with_work: each holder, whether it has work.  Another keeps its slot, as its
        shim keeps its state between leases, and looks no more once it has shown no work."""
        for number in with_work:
            self.slots.setdefault(number, Slot(weights[number])).weight = weights[number]
        # What each showed at its last look: the others read it a look late.
        shown = {n: s.backlogged for n, s in self.slots.items()}
        shown_on_gpu, self.on_gpu = self.on_gpu, set()
        seen_at = {n: s.seen_at for n, s in self.slots.items()}
        for number, slot in self.slots.items():
            if number not in with_work and not slot.backlogged:
                continue  # no lease: its shim does not look (one last look once it closes)
            slot.seen_at = now
            backlogged = with_work.get(number, False)
            fresh = [n for n in self.slots if n != number and now - seen_at[n] < STALE_S]
            others = [self.slots[n].vtime for n in fresh if shown[n]]
            least = min(others) if others else None
            least_known = least  # to reckon a credit by: else one seen within STALE_S
            if least is not None:
                slot.least_seen, slot.least_seen_at = least, now
            elif now - slot.least_seen_at < STALE_S:
                least_known = slot.least_seen  # the others between two steps
            idle = [self.slots[n].vtime for n in fresh if not shown[n]]
            # To come back level with: else the latest of the others looking, all idle.
            least_by = least_known if least_known is not None else max(idle, default=None)
            resumed = backlogged and not slot.backlogged
            away = slot.idle_since is not None  # a newcomer was not
            back = resumed and (not away or now - slot.idle_since >= IDLE_S)
            asked = self.asked_at.pop(number, None) if resumed else None
            if resumed and not back and least_known is not None:
                slot.vtime = max(slot.vtime, least_known - LEAD_S)  # a short gap: not owed more
            if back:
                slot.burst_used = 0.0
                # Its credit: what the least ran on while it was away, within bounds, and
                # only till it asked again (then it wanted the GPU: a turn, a prefetch).
                since = slot.least_at_idle if slot.least_at_idle is not None else slot.vtime
                ran = least_known - since if away and least_known is not None else 0.0
                if away and asked is not None:  # asked before it went idle: wanted it all along
                    ran *= min(max(asked - slot.idle_since, 0.0) / (now - slot.idle_since), 1.0)
                slot.credit = min(max(ran, BURST_CREDIT_S), MAX_CREDIT_S)
                if least_by is not None and least_by > slot.vtime:
                    slot.vtime = least_by  # back from idle: level
            in_burst = slot.burst_used < slot.credit
            queue_free = slot.burst_used < slot.credit / 2  # its queue long
            if not backlogged and slot.backlogged:
                slot.idle_since, slot.least_at_idle = now, least_known
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
            # Held for those with work a lead behind it (least + LEAD_S < its vtime).
            slot.blockers = tuple(
                n for n in fresh if shown[n] and self.slots[n].vtime + LEAD_S < slot.vtime
            )
            held = backlogged and not in_burst and bool(slot.blockers)
            if held and not slot.held:
                slot.queued_s = QUEUE_S if short else LONG_QUEUE_S
            slot.held = held

    def may_run(self, number: int, now: float) -> bool:
        """Held, it waits till its queued work is out, then till its next look, unless one
        it was held for went idle at its look this step (that shim rang): then it runs if
        nobody with work now, fresh, is a lead behind it."""
        slot = self.slots.get(number)
        if slot is None or not slot.held or slot.queued_s > 0:
            return True
        if all(self.slots[n].backlogged for n in slot.blockers):
            return False  # nobody rang
        behind = [
            o.vtime
            for n, o in self.slots.items()
            if n != number and o.backlogged and now - o.seen_at < STALE_S
        ]
        return not behind or min(behind) + LEAD_S >= slot.vtime

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
