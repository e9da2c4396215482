"""What a process's connections that have gone did, while another of its connections
stays (docs/metrics.md): status and the metrics show a process's GPU seconds and
seconds waited as the sum of its connections' (a second copy of the shim, a process
that opens two on purpose), and those are counters: without this, one connection
leaving took its part away, and Prometheus read the drop as a reset.

Pure, like the rest of the core; the scheduler feeds it, the snapshot reads it.  A
process's past goes with its last connection, so a pid used again starts from 0."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from .group_totals import Tally

NOTHING: Mapping[bytes, Tally] = {}


class ProcessPast:
    def __init__(self) -> None:
        self._connections: Counter[int] = Counter()
        self._past: dict[int, dict[bytes, Tally]] = {}

    def connected(self, pid: int) -> None:
        self._connections[pid] += 1

    def left(self, pid: int, figures: Mapping[bytes, Tally]) -> None:
        """A connection of pid is gone; figures: what it did on each GPU."""
        self._connections[pid] -= 1
        if self._connections[pid] <= 0:
            del self._connections[pid]
            self._past.pop(pid, None)
            return
        past = self._past.setdefault(pid, {})
        for uuid, tally in figures.items():
            past.setdefault(uuid, Tally()).add(tally)

    def of(self, pid: int) -> Mapping[bytes, Tally]:
        return self._past.get(pid, NOTHING)
