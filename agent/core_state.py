"""The scheduling core's state: what it remembers of each GPU, client, lease and
waiter.  Plain records; scheduler.py and lock_rules.py change them."""

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
    # auto: this lease holds the turn that busy clients take one at a time
    # (False: light work beside the turn).  Exclusive leases always do.
    turn: bool = True
    release_when_idle: bool = False
    yield_asked: bool = False  # asked to release once idle (not a drop: no revoke follows)
    # Its client held another GPU while it waited for this one: a process working
    # across GPUs, never asked to release this lease once idle.
    across_gpus: bool = False
    # auto: when the turn it holds began.  A turn cut short for a window goes on
    # after it, quantum and all: windows neither end a turn nor lengthen it.
    turn_since: float = 0.0
    # Its client's GPU time on this GPU when it was granted (usage.py's total), and
    # when its work began (the first report of more, less what it adds; None before):
    # what the lease has kept the GPU busy with since, against how long.  Not from the
    # grant: a displaced trainer's prefetch comes first, and its shim counts none of it.
    gpu_s_at_grant: float = 0.0
    working_since: float | None = None


@dataclass(slots=True)
class Waiter:
    requested_at: float
    # auto, judged when it asks: light enough to run beside the turn (little use, or
    # much less than the turn holder's) ...
    light: bool = False
    # ... and light enough to cut the turn short when it cannot run beside it (under
    # the floor *and* much less use than the holder's): it runs in a window.  Two new
    # clients have little use each; the ratio keeps them from taking the GPU from each
    # other slice by slice, the floor keeps a busy client that windows starve of use
    # from staying in windows.  A light waiter that does neither waits for the turn.
    cuts_in: bool = False
    # It waited light_wait_ms, light only by the ratio (its use past the floor) and
    # unable to cut in: busy until its grant, no longer judged (lock_rules, rule 2).
    judged_busy: bool = False


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
    light_check_at: float | None = None
    # auto: (client, its turn's start) while that turn is cut short for a window.
    turn_paused: tuple[int, float] | None = None
    # Clients whose pages another's turn may have pushed to the host since they last
    # held this GPU: their next grant says DISPLACED, so the shim prefetches.
    displaced: set[int] = field(default_factory=set)


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
    # auto, per GPU: whether its last lease held long enough to tell kept the GPU busy
    # (lock_rules.BUSY_LEASE_DUTY of its time: a trainer, not a service with gaps).
    leases_kept_busy: dict[bytes, bool] = field(default_factory=dict)
    # share_by=unit: "pod:<uid>" or "unit:<name>" once the agent knows (share_groups.py).
    share_unit: str = ""
