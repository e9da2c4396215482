"""Whether a GPU's memory holds everything its processes allocated: pure arithmetic.

Anti-thrash auto lets processes run side by side only while their memory fits
the GPU: then no process's pages have to be evicted for another's, so nothing
can thrash.  The figures:

- capacity: the GPU's total memory (NVML's inventory, else the smallest total a
  client's shim reported: a client can only make it look smaller, which errs on
  the safe side), capped by the setting memory_limit.  Unknown: never fits.
- demand: for each client using the GPU, its managed and unmanaged allocations
  plus its CUDA context's own memory (NVML's per-process figure where NVML can
  be read, else CONTEXT_ESTIMATE_BYTES), plus what processes outside nvshare
  use (NVML).
- It fits while demand <= capacity - reserve.  Once it does not, it fits again
  only when demand <= capacity - reserve - band, so an allocation that moves
  back and forth across the line does not flip the GPU each time.

What runs at once need not be everyone: the rules ask whether the processes
that would run together fit (policy.Policy.fits, by fits() above).  Managed memory of a process that
does not run is evicted as others need the room; what cannot be evicted (its
context, memory passed through unmanaged) still counts.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .core_state import ClientState, GpuState

# What one process's CUDA context takes on the GPU besides its allocations
# (the context itself, kernels, cuBLAS workspaces): ~500 MiB for PyTorch on an
# H100 with CUDA 13.  Used where NVML cannot say.
CONTEXT_ESTIMATE_BYTES = 512 << 20
# Managed memory pushed out comes back by prefetch at about this (an H100's 49 GB/s).
PAGE_IN_BYTES_PER_S = 49e9
# Kept free: the driver and fragmentation need room that no report shows.
RESERVE_MIN_BYTES = 256 << 20
RESERVE_FRACTION = 1 / 32
BAND_MIN_BYTES = 128 << 20
BAND_FRACTION = 1 / 64


def capacity(total_bytes: int | None, limit_bytes: int) -> int | None:
    """What auto assumes the GPU has; None when unknown."""
    if not total_bytes:
        return None
    return min(total_bytes, limit_bytes) if limit_bytes else total_bytes


def own_total(gpu: GpuState) -> int:
    """The GPU's own memory, memory_limit aside: NVML's inventory, else the smallest
    total a shim reported; 0 when unknown."""
    total = gpu.memory_total_bytes if gpu.from_inventory else 0
    if not total and gpu.reported_totals:
        total = min(gpu.reported_totals.values())
    return total


def reserve(capacity_bytes: int) -> int:
    return max(RESERVE_MIN_BYTES, int(capacity_bytes * RESERVE_FRACTION))


def band(capacity_bytes: int) -> int:
    return max(BAND_MIN_BYTES, int(capacity_bytes * BAND_FRACTION))


def fits(was_fitting: bool, demand_bytes: int, capacity_bytes: int | None) -> bool:
    """The new verdict, given the last one (hysteresis)."""
    if capacity_bytes is None:
        return False
    line = capacity_bytes - reserve(capacity_bytes)
    if was_fitting:
        return demand_bytes <= line
    return demand_bytes <= line - band(capacity_bytes)


def client_demand(managed: int, unmanaged: int, nvml_process_bytes: int | None) -> int:
    """One client's share of the demand.  NVML's per-process figure covers the
    context and the unmanaged (device-resident) allocations; managed memory is
    added on top since the driver may have evicted it."""
    if nvml_process_bytes is None:
        return managed + unmanaged + CONTEXT_ESTIMATE_BYTES
    return managed + max(unmanaged, nvml_process_bytes)


def resident_demand(managed: int, unmanaged: int, nvml_process_bytes: int | None) -> int:
    """What a client that does not run keeps on the GPU all the same: its context and
    its unmanaged memory (the driver evicts its managed pages as others need them)."""
    if nvml_process_bytes is None:
        return unmanaged + CONTEXT_ESTIMATE_BYTES
    return max(unmanaged, nvml_process_bytes)


def demand_of(gpu: GpuState, clients: dict[int, ClientState], running: Collection[int]) -> int:
    """The GPU's memory with `running` at work: their whole demand, what every other
    client with a context there keeps all the same, and what processes outside nvshare
    use (NVML)."""
    return Demand(gpu, clients).of(running)


class Demand:
    """demand_of for many sets of one GPU's clients at one moment: every client's figures
    read once, then each set's demand in the time of its size.  The policy asks, for each
    waiter, which holders it fits beside; with a walk of every client per question, 200
    waiters cost 0.27 s an event, and a crowd that came at once (1,000 capped processes on
    a loaded box, issue 45) grew faster than the agent could answer it."""

    __slots__ = ("_adds", "_lines", "_own_line", "resident")

    def __init__(self, gpu: GpuState, clients: dict[int, ClientState]):
        capacity = gpu.capacity_bytes
        # fits()'s lines, for those that stay and for newcomers (None: nothing fits).
        self._lines: tuple[int | None, int | None] = (None, None)
        if capacity is not None:
            line = capacity - reserve(capacity)
            self._lines = (line - band(capacity), line)
        # The line of the GPU's own memory, memory_limit aside: past it, pages move.
        total = own_total(gpu)
        self._own_line = total - reserve(total) if total else None
        self._adds: dict[int, int] = {}  # what each client adds by running
        resident, pids = 0, set()
        for client in gpu.users:
            state = clients[client]
            pids.add(state.pid)
            if gpu.uuid not in state.active:
                continue
            figures = (
                state.managed.get(gpu.uuid, 0),
                state.unmanaged.get(gpu.uuid, 0),
                gpu.process_bytes.get(state.pid),
            )
            kept = resident_demand(*figures)
            resident += kept
            self._adds[client] = client_demand(*figures) - kept
        # Nobody at work: what each keeps, and processes outside nvshare.
        self.resident = resident + sum(b for pid, b in gpu.process_bytes.items() if pid not in pids)

    def adds(self, client: int) -> int:
        """What `client` adds to the demand by running."""
        return self._adds.get(client, 0)

    def of(self, running: Iterable[int]) -> int:
        """demand_of(gpu, clients, running)."""
        return self.resident + sum(self.adds(client) for client in set(running))

    def fits(self, demand_bytes: int, keeping: bool) -> bool:
        """fits(keeping, demand_bytes, the GPU's capacity), its lines worked out once."""
        line = self._lines[keeping]
        return line is not None and demand_bytes <= line

    def overflow(self, demand_bytes: int) -> int | None:
        """What a demand this large puts past the GPU's own memory (None: its size is
        unknown)."""
        return None if self._own_line is None else max(0, demand_bytes - self._own_line)

    def paged(self, running: Iterable[int]) -> int:
        """What running these at once puts past the GPU's own memory (memory_limit
        aside): what one of them brings back after the others ran.  Unknown: all."""
        demand = self.of(running)
        past = self.overflow(demand)
        return demand if past is None else past
