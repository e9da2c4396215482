"""How much each client used a GPU lately: a decaying window, pure arithmetic.

usage(t) = (1/W) ∫ busy(s) e^(-(t-s)/W) ds, a number from 0 (never used it) to
1 (kept it busy all the time), where W is USAGE_WINDOW_S.  Use a minute ago
weighs e^-6 ≈ 0.25 % of use now, so the figure follows what a client does now:
a notebook that trains for a while counts as busy while it trains and as light
again a few tens of seconds after.

busy(s) is GPU time: whether the client had work running on the GPU at s.  A
shim that announces the USAGE feature measures it (shim/usage_meter.c) and
reports a running total (GPU_USAGE); report() spreads each report's new busy
time evenly over the time since the last one.  Holding a lease is not use: an
inference server that holds its lease all the time and keeps the GPU busy 2 % of
it counts 0.02.

For an older shim, which reports nothing, the hold stands in for it: busy from
the grant (start) until the release (stop), less the idle tail the release
reports (RELEASED.idle_ms).

A newcomer's figure is its GPU time over its stay (since its first request there, not
its HELLO: see meter_of), not over a window it was mostly absent from: the sum so far
divided by the weight the window has given its stay (1 - e^(-age/W)), its age counted
as at least YOUNG_FLOOR_S.
Else a new trainer counts light for seconds (1 - e^(-t/W) of 0.1 takes 1 s of
work at full tilt, 2 s at half) and cuts the running turn short for its windows;
the floor keeps a notebook's first 150 ms cell light.

A client kept waiting is no lighter for it: the rules freeze its figure while it
waits longer than light work does (freeze), until its grant, or for a measuring
shim until its first report that tells (thaw) or the lease's end.  Else a trainer
waiting for its turn would soon look light, and take a window where its turn was
due (issue 35); and it dipped before its first report of each turn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .core_state import ClientState

USAGE_WINDOW_S = 10.0
# The least age a newcomer's figure is read over (see above): one busy second makes
# it 0.24, one 150 ms cell 0.04.
YOUNG_FLOOR_S = 5.0
# The least stretch whose GPU time tells how busy it kept the GPU: a lease's (leases.py),
# and the first report after a grant, at which a waiter's frozen figure thaws.
MIN_MEASURED_S = 0.02
# Uses change as clients run: the holders are looked at again this often while others
# wait or several hold; a stretch alone this long tells how busy its client keeps the
# GPU (a shorter one only where it ended at a gap of the client's own).
CHECK_S = 0.25


@dataclass(slots=True)
class UsageMeter:
    value: float = 0.0  # usage at `stamp`, before a newcomer's weighting
    stamp: float = 0.0
    since: float = -math.inf  # its arrival (by default: long ago)
    busy: bool = False  # an older shim's hold: busy since `stamp`
    reported_s: float = 0.0  # a measuring shim's running total at `stamp`
    held_s: float = 0.0  # an older shim's holds, summed up to its last release
    frozen: bool = False  # `frozen_value` holds until thawed; `stamp` stays
    frozen_value: float = 0.0
    thaw_at: float | None = None  # granted then: thawed at its next report

    def _weight(self, now: float) -> float:
        """How much of the window its stay has filled (1 for a client here for long)."""
        age = max(now - self.since, YOUNG_FLOOR_S)
        return 1.0 - math.exp(-age / USAGE_WINDOW_S)

    def total_s(self, now: float) -> float:
        """All the GPU time so far (share_groups.py charges it to the client's group)."""
        return self.reported_s + self.held_s + (max(0.0, now - self.stamp) if self.busy else 0.0)

    def at(self, now: float) -> float:
        if self.frozen:
            return self.frozen_value
        return min(1.0, self._unweighted_at(now) / self._weight(now))

    def _unweighted_at(self, now: float) -> float:
        decay = math.exp(-max(0.0, now - self.stamp) / USAGE_WINDOW_S)
        return self.value * decay + (1.0 - decay if self.busy else 0.0)

    def freeze(self, moment: float) -> None:
        """Its figure stops decaying from `moment` on (or its last report, if later).
        `stamp` stays: the policy reads it as the client's last activity there."""
        self.thaw_at = None  # waiting again before a report came: it stays frozen
        if not self.frozen:
            self.frozen_value, self.frozen = self.at(max(moment, self.stamp)), True

    def thaw(self, now: float, at_next_report: bool = False) -> None:
        """It waits no longer.  at_next_report (granted, and its shim measures): its
        figure holds until its first report that covers MIN_MEASURED_S from now on; else
        it dipped in the ~100 ms until then, and a trainer taking turns read as not
        keeping the GPU busy at the start of each."""
        if not self.frozen:
            return
        if at_next_report:
            self.thaw_at = now
            return
        self.value = self.frozen_value * self._weight(now)
        self.stamp, self.frozen, self.thaw_at = now, False, None

    def report(self, now: float, busy_total_s: float) -> None:
        """A measuring shim's running total of GPU time on this GPU."""
        if self.thaw_at is not None and now - self.thaw_at >= MIN_MEASURED_S:
            self.thaw(self.thaw_at)
        busy_s = max(0.0, busy_total_s - self.reported_s)
        if self.frozen:  # a last report after the release: counted, nothing decays
            added = 1.0 - math.exp(-busy_s / USAGE_WINDOW_S)
            self.frozen_value = min(1.0, self.frozen_value + added / self._weight(now))
            self.reported_s = max(self.reported_s, busy_total_s)
            return
        elapsed = max(0.0, now - self.stamp)
        decay = math.exp(-elapsed / USAGE_WINDOW_S)
        if elapsed > busy_s:  # the new busy time spread over the interval
            added = busy_s / elapsed * (1.0 - decay)
        else:  # as busy as can be (or reported at once): busy all of it
            added = 1.0 - math.exp(-busy_s / USAGE_WINDOW_S)
        self.value = min(1.0, self.value * decay + added)
        self.stamp, self.reported_s = now, max(self.reported_s, busy_total_s)

    def start(self, now: float) -> None:
        """An older shim's client was granted the GPU."""
        if not self.busy:
            self.value, self.stamp, self.busy = self._unweighted_at(now), now, True

    def stop(self, now: float, idle_s: float = 0.0) -> None:
        """Its client let go of the GPU.  A thaw left for a report that did not come
        happens now (a measuring shim reports as it lets go); an older shim's hold had
        been idle for its last idle_s."""
        if self.thaw_at is not None:
            self.thaw(self.thaw_at)
        if not self.busy:
            return
        busy_until = max(self.stamp, now - max(0.0, idle_s))
        self.held_s += busy_until - self.stamp
        at_end = self._unweighted_at(busy_until)
        self.value = at_end * math.exp(-(now - busy_until) / USAGE_WINDOW_S)
        self.stamp, self.busy = now, False


def meter_of(state: ClientState, uuid: bytes, now: float) -> UsageMeter:
    """A client's meter on a GPU, made at its first request there (`now`), which its stay
    counts from: not from its HELLO, since the context's making and a framework's start
    before its first work (a second or more) are no idle of its choosing; counted, two
    trainers read under the policy's lines, side by side, for their first 12-15 s (H200).
    A measuring shim's totals count from its HELLO: none before the first request."""
    meter = state.usage.get(uuid)
    if meter is None:
        meter = state.usage[uuid] = UsageMeter(stamp=now, since=now)
    return meter
