"""The scheduling core's state: what it remembers of each GPU, client, lease and
waiter.  Plain records; scheduler.py and policy.py change them.  What a client did
on a GPU so far (gpu_seconds_of, waited_of) is read here, once, for its own figures
and its share group's (snapshot.py, share_groups.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .settings import DEFAULT_SETTINGS, NO_OVERRIDES, GpuOverrides, Settings
from .usage import UsageMeter

EXCLUSIVE = "exclusive"
SHARED = "shared"
# protocol.Features.YIELD and USAGE, repeated here so the core needs no wire
# module (tests/agent/test_protocol.py checks they agree).
FEATURE_YIELD = 1
FEATURE_USAGE = 8
FEATURE_MEMORY_CAP = 16


@dataclass(slots=True)
class Lease:
    number: int
    mode: str
    granted_at: float
    drop_requested_at: float | None = None
    release_when_idle: bool = False
    yield_asked: bool = False  # asked to release once idle (not a drop: no revoke follows)
    # Its client held another GPU while it waited for this one: a process working
    # across GPUs, never asked to release this lease once idle.
    across_gpus: bool = False
    # auto: when its turn began: the grant, or the end of the last quantum while its
    # share group was owed another (share_groups.turn_goes_on).
    turn_since: float = 0.0
    turn: bool = True  # auto: granted as a turn (bulk work), not as work in bursts
    gpu_s_at_grant: float = 0.0  # its client's GPU time there when granted (usage.py)
    # Displaced: the prefetch its shim makes before its gate opens (what was pushed out, at
    # memory_fit.PAGE_IN_BYTES_PER_S), which it does not count as use: no part of the
    # lease's length either, or a 40 %-busy trainer kept apart read as work in bursts.
    prefetch_s: float = 0.0
    alone: bool = True  # nobody held the GPU beside it, so far
    # When it first ran in this lease, by its shim's reports (Leases.note_usage): the
    # page-in before it, however long, is no part of how busy the lease shows it.
    ran_since: float | None = None


@dataclass(slots=True)
class Waiter:
    requested_at: float
    # Why it waits now (policy.WaitCause's value; "" until the rules have looked), and
    # since when: its wait is counted by cause (ClientState.waited_s).
    cause: str = ""
    cause_since: float = 0.0


@dataclass(slots=True)
class GpuState:
    uuid: bytes
    name: str = ""
    memory_total_bytes: int = 0  # the inventory's (NVML)
    from_inventory: bool = False
    holders: dict[int, Lease] = field(default_factory=dict)  # client -> lease, grant order
    waiters: dict[int, Waiter] = field(default_factory=dict)  # client -> waiter, request order
    users: set[int] = field(default_factory=set)  # clients that named this GPU
    reported_totals: dict[int, int] = field(default_factory=dict)  # client -> GPU_MEMORY
    process_bytes: dict[int, int] = field(default_factory=dict)  # NVML: pid -> bytes
    fits: bool = False
    demand_bytes: int = 0
    capacity_bytes: int | None = None
    introduced_by: int | None = None  # a learned GPU: the uid that named it first
    index: int | None = None  # its place in NVML's numbering; None: not in the inventory
    own: GpuOverrides = NO_OVERRIDES  # what it sets for itself (by index, and by UUID over it)
    # What it runs by: the node-wide settings with its own over them (the scheduler sets it).
    settings: Settings = DEFAULT_SETTINGS
    deadline: float | None = None  # when tick() must look at this GPU next
    # Clients whose pages another's grant may have pushed to the host since they last
    # held this GPU, and about how much (the most past the GPU's own memory, beside the
    # holders of the time; 0: unknown): their next grant says DISPLACED, so the shim
    # prefetches.
    displaced: dict[int, int] = field(default_factory=dict)
    # A memory report changed what a share group's clients hold: their MEMORY_CAP frames
    # are due, at most every scheduler.CAPS_EVERY_S (caps_told_at: the last time).
    caps_due: bool = False
    caps_told_at: float = float("-inf")


@dataclass(slots=True)
class ClientState:
    pid: int
    uid: int
    gid: int
    connected_at: float = 0.0
    greeted: bool = False
    command: str = ""
    features: int = 0  # protocol.Features bits the shim announced
    gpus: dict[bytes, None] = field(default_factory=dict)  # ordered set
    managed: dict[bytes, int] = field(default_factory=dict)  # gpu -> bytes
    unmanaged: dict[bytes, int] = field(default_factory=dict)
    active: set[bytes] = field(default_factory=set)  # GPUs it has a context on (asked or allocated)
    usage: dict[bytes, UsageMeter] = field(default_factory=dict)
    # Per GPU: how busy it kept the GPU over its last lease there (GPU time, or the hold
    # for a shim that does not measure, over the lease's length): under policy.BURST_USE
    # it works in bursts.  A newcomer has none (bursty reads 0, shown_duty 1: no evidence).
    lease_duty: dict[bytes, float] = field(default_factory=dict)
    # Per GPU, its last lease that nobody held beside and that tells (leases.py; its shim
    # measuring): GPU time, length, end.  With the gap until it asked again, whether it
    # keeps the GPU busy by itself, whatever its use (policy.saturating).
    alone_lease: dict[bytes, tuple[float, float, float]] = field(default_factory=dict)
    asked_at: dict[bytes, float] = field(default_factory=dict)  # its last request, per GPU
    # Seconds waited, per (GPU, cause): status and the metrics show why it waited.
    waited_s: dict[tuple[bytes, str], float] = field(default_factory=dict)
    # share_by=unit: "pod:<uid>" or "unit:<name>" once the agent knows (share_groups.py).
    share_unit: str = ""

    @property
    def measures(self) -> bool:
        """Its shim reports GPU time (USAGE); an older one's hold stands for it."""
        return bool(self.features & FEATURE_USAGE)


def gpu_seconds_of(state: ClientState, uuid: bytes, now: float) -> float:
    """A client's GPU time on a GPU since it came (usage.py's running total)."""
    meter = state.usage.get(uuid)
    return 0.0 if meter is None else meter.total_s(now)


def waited_of(
    state: ClientState, waiter: Waiter | None, uuid: bytes, now: float
) -> dict[str, float]:
    """Seconds a client has waited for a GPU since it came, by cause, the wait under
    way (waiter: its place in the GPU's queue, if any) counted up to now."""
    waited = {cause: s for (gpu, cause), s in state.waited_s.items() if gpu == uuid}
    if waiter is not None and waiter.cause:
        waited[waiter.cause] = waited.get(waiter.cause, 0.0) + max(0.0, now - waiter.cause_since)
    return waited
