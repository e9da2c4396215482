"""How much each client used a GPU lately: a decaying window, pure arithmetic.

usage(t) = (1/W) ∫ busy(s) e^(-(t-s)/W) ds, a number from 0 (never used it) to
1 (used it all the time), where busy(s) is 1 while the client held the GPU and
W is USAGE_WINDOW_S.  Use a minute ago weighs e^-6 ≈ 0.25 % of use now, so the
figure follows what a client does now: a notebook that trains for a while
counts as busy while it trains and as light again a few tens of seconds after.

A hold counts as busy until the release says how long the GPU had been idle
before it was let go (RELEASED.idle_ms): that tail is then taken back, so a
notebook that holds a lease for a second after a 50 ms burst counts 50 ms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

USAGE_WINDOW_S = 10.0


@dataclass(slots=True)
class UsageMeter:
    value: float = 0.0  # usage at `stamp`
    stamp: float = 0.0
    busy: bool = False  # held since `stamp`

    def at(self, now: float) -> float:
        decay = math.exp(-max(0.0, now - self.stamp) / USAGE_WINDOW_S)
        return self.value * decay + (1.0 - decay if self.busy else 0.0)

    def start(self, now: float) -> None:
        """The client was granted the GPU."""
        if not self.busy:
            self.value, self.stamp, self.busy = self.at(now), now, True

    def stop(self, now: float, idle_s: float = 0.0) -> None:
        """The client let go of the GPU; it had been idle for the last idle_s of its hold."""
        if not self.busy:
            return
        busy_until = max(self.stamp, now - max(0.0, idle_s))
        at_end = self.at(busy_until)
        self.value = at_end * math.exp(-(now - busy_until) / USAGE_WINDOW_S)
        self.stamp, self.busy = now, False
