"""What the scheduling core asks the engine to do, one small record per action.

The core (scheduler.py) returns these from every event (with decide_later, the
rules' own from decide_pending), in order; the engine
(engine.py) carries each one out through the adapters and logs it (its
ActionRunner, action_runner.py).  Plain
(not frozen) slotted dataclasses: frozen ones cost a few microseconds more to
build, and the hot path builds two or three per handoff.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .settings import Settings


@dataclass(slots=True)
class Grant:
    client: int
    pid: int
    gpu: bytes
    lease: int
    exclusive: bool
    waited_s: float
    # A shared lease that is still given back when idle (anti-thrash auto).
    release_when_idle: bool = False
    # Log only: why this client now (auto): "turn" or "beside" (light work beside the turn).
    role: str = field(default="", compare=False)
    # Log only (auto): the client's recent use of the GPU (GPU time, 0..1) the rules saw.
    use: float = field(default=-1.0, compare=False)
    # A turn that light work may cut short: its shim keeps its queue short throughout.
    short_queue: bool = False
    # Another's turn may have pushed its pages to the host since it last held the GPU.
    displaced: bool = False


@dataclass(slots=True)
class AskToDrop:
    client: int
    pid: int
    gpu: bytes
    lease: int
    held_s: float
    # > 0: release once idle this long (someone waits), rather than at once.
    when_idle_ms: int = 0
    reason: str = field(default="", compare=False)  # log only
    use: float = field(default=-1.0, compare=False)  # log only: as Grant's


@dataclass(slots=True)
class Revoke:
    client: int
    pid: int
    gpu: bytes
    lease: int
    held_s: float


@dataclass(slots=True)
class LockReleased:
    """Log only. reason: "released" (the client said so) or "disconnect"."""

    client: int
    pid: int
    gpu: bytes
    lease: int
    held_s: float
    drop_to_release_s: float | None
    reason: str
    idle_ms: int = 0


@dataclass(slots=True)
class Queued:
    """Log only: a request that has to wait; position counts from 1."""

    client: int
    pid: int
    gpu: bytes
    position: int


@dataclass(slots=True)
class Withdrawn:
    """Log only: a waiter left the queue (RELEASED with lease 0 while waiting)."""

    client: int
    pid: int
    gpu: bytes


@dataclass(slots=True)
class Ignored:
    """Log only (debug): a harmless frame with no effect, e.g. a duplicate request."""

    client: int
    pid: int
    gpu: bytes
    reason: str


@dataclass(slots=True)
class SendSettings:
    """client None means every client that has said hello."""

    client: int | None
    settings: Settings


@dataclass(slots=True)
class SendMemoryCap:
    """MEMORY_CAP to a shim: its share group's cap on a GPU (0: none), and what the
    group's other processes hold there."""

    client: int
    pid: int
    gpu: bytes
    cap_bytes: int
    others_bytes: int
    group: str = field(default="", compare=False)  # log only


@dataclass(slots=True)
class Refuse:
    """A valid frame at the wrong time, or a client out of bounds: the engine sends
    ERROR and closes."""

    client: int
    reason: str


@dataclass(slots=True)
class Greeted:
    client: int
    pid: int
    uid: int
    gid: int
    command: str
    gpus: tuple[bytes, ...]


@dataclass(slots=True)
class Gone:
    client: int
    pid: int
    greeted: bool
    gpu_seconds: float = 0.0  # its GPU time, all GPUs, by the shim's meter: the journal keeps it


@dataclass(slots=True)
class ModeChanged:
    """Log only: anti-thrash auto switched a GPU between running side by side
    ("shared") and one process at a time ("exclusive")."""

    gpu: bytes
    mode: str
    demand_bytes: int
    capacity_bytes: int | None
    reason: str


@dataclass(slots=True)
class GpuSettingsApplied:
    """Log only: what a GPU sets for itself changed (a settings change, or the
    inventory gave a GPU learned from clients its NVML index)."""

    gpu: bytes
    index: int | None
    settings: Settings  # what it runs by now
    own: tuple[str, ...]  # the fields it sets for itself; () when it follows the node


@dataclass(slots=True)
class IndexSettingsUnused:
    """Log only: GPUs named by NVML index have settings of their own, and there is
    no NVML inventory to find them in."""

    gpu_ids: tuple[str, ...]


Action = (
    Grant
    | AskToDrop
    | Revoke
    | LockReleased
    | Queued
    | Withdrawn
    | Ignored
    | SendSettings
    | Refuse
    | Greeted
    | Gone
    | ModeChanged
    | GpuSettingsApplied
    | IndexSettingsUnused
    | SendMemoryCap
)
