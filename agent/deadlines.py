"""The core's deadlines: when tick() must look at a GPU (its rules' next
moment) or at a client (its HELLO timeout).  A heap with lazy deletion: an
entry counts only while it is still its key's current deadline, which the core
says; a changed deadline is pushed again rather than searched for.  Part of
the scheduling core: pure, no I/O."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .core_state import ClientState, GpuState

Key = bytes | int  # a GPU's uuid, or a client's id


class Deadlines:
    def __init__(self) -> None:
        # (time, sequence, key): the sequence keeps equal times in push order.
        self._heap: list[tuple[float, int, Key]] = []
        self._sequence = itertools.count()

    def push(
        self, due: float, key: Key, live: int, current: Callable[[], Iterable[tuple[float, Key]]]
    ) -> None:
        """live: how many keys there are; current(): every current deadline, asked
        for only when stale entries have piled up, to rebuild the heap from them."""
        heapq.heappush(self._heap, (due, next(self._sequence), key))
        if len(self._heap) > 4 * live + 64:
            rebuilt = [(when, next(self._sequence), k) for when, k in current()]
            heapq.heapify(rebuilt)
            self._heap = rebuilt

    def pop_due(self, now: float) -> Iterator[tuple[float, Key]]:
        """Each entry due by now, earliest first, current or not (the caller checks).
        Entries pushed meanwhile come too when they are due."""
        # The heap the tick began with: a rebuild meanwhile copies what is current
        # (and what is due of that) into a new one, for next_deadline to find.
        heap = self._heap
        while heap and heap[0][0] <= now:
            due, _, key = heapq.heappop(heap)
            yield due, key

    def earliest(self, is_current: Callable[[float, Key], bool]) -> float | None:
        """The earliest current deadline, or None; drops stale entries on the way."""
        heap = self._heap
        while heap:
            due, _, key = heap[0]
            if is_current(due, key):
                return due
            heapq.heappop(heap)
        return None


class CoreDeadlines:
    """The scheduler's deadlines by what they are for: a GPU's is its GpuState.deadline
    (the rules' next moment), a client's its HELLO timeout while it has not said HELLO.
    An entry that is no longer its key's is stale: skipped, never acted on."""

    def __init__(
        self, gpus: dict[bytes, GpuState], clients: dict[int, ClientState], hello_timeout_s: float
    ) -> None:
        self._heap = Deadlines()
        self._gpus, self._clients, self._hello_timeout_s = gpus, clients, hello_timeout_s

    def push(self, due: float, key: Key) -> None:
        self._heap.push(due, key, len(self._gpus) + len(self._clients), self._all)

    def earliest(self) -> float | None:
        return self._heap.earliest(self._current)

    def due(self, now: float) -> Iterator[Key]:
        """Each key whose deadline is due by now, earliest first."""
        for due, key in self._heap.pop_due(now):
            if self._current(due, key):
                yield key

    def _current(self, due: float, key: Key) -> bool:
        if isinstance(key, int):
            state = self._clients.get(key)
            return (
                state is not None
                and not state.greeted
                and state.connected_at + self._hello_timeout_s == due
            )
        gpu = self._gpus.get(key)
        return gpu is not None and gpu.deadline == due

    def _all(self) -> Iterable[tuple[float, Key]]:
        for uuid, gpu in self._gpus.items():
            if gpu.deadline is not None:
                yield gpu.deadline, uuid
        for client, state in self._clients.items():
            if not state.greeted:
                yield state.connected_at + self._hello_timeout_s, client


class Moments:
    """`now`, and the earliest moment asked about that is still to come: the next time
    any rule that asked could act."""

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
