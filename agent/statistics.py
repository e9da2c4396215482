"""Counters of what the agent did, per GPU, since it started: grants, drops,
revokes, and a histogram of how long each grant was waited for.  The engine
counts as it carries out the core's actions; D-Bus publishes them (Statistics)
and the metrics exporter turns them into Prometheus' counters and histogram.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

# Upper bounds of the wait histogram's buckets, seconds: a grant at once (under
# a millisecond), a notebook beside busy work (a few ms), a light client after
# the minimum slice and a drain (~0.1-0.5 s), and whole quanta (30 s by default).
WAIT_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(slots=True)
class GpuStatistics:
    grants: int = 0
    drops: int = 0  # drop requests that must be answered at once (not "release when idle")
    revokes: int = 0
    wait_sum_s: float = 0.0
    # Waits per bucket (not cumulative); the last one counts those past every bound.
    wait_counts: list[int] = field(default_factory=lambda: [0] * (len(WAIT_BUCKETS_S) + 1))

    def granted(self, waited_s: float) -> None:
        self.grants += 1
        self.wait_sum_s += waited_s
        self.wait_counts[bisect.bisect_left(WAIT_BUCKETS_S, waited_s)] += 1

    def cumulative_buckets(self) -> list[tuple[float, int]]:
        """(upper bound, waits at or under it), as Prometheus' buckets count them;
        the last bound is +Inf."""
        total, out = 0, []
        for bound, count in zip((*WAIT_BUCKETS_S, float("inf")), self.wait_counts):
            total += count
            out.append((bound, total))
        return out
