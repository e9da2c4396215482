"""What the scheduler shows of itself: frozen, read by D-Bus properties and the status line."""

from __future__ import annotations

from dataclasses import dataclass

from .settings import DEFAULT_TIME_QUANTUM_S


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    uuid: str
    name: str
    memory_total_bytes: int
    holder_pids: tuple[int, ...]
    queue_pids: tuple[int, ...]
    anti_thrash: str = "on"  # its setting: on, off or auto
    mode: str = "exclusive"  # what it does now: exclusive (one at a time) or shared
    memory_capacity_bytes: int = 0  # what auto assumes the GPU has; 0: unknown
    memory_demand_bytes: int = 0  # what its clients (and others, by NVML) need
    # Its own settings where it has them, else the node-wide ones.
    time_quantum_s: int = DEFAULT_TIME_QUANTUM_S
    memory_limit_bytes: int = 0  # 0: none
    index: int = -1  # NVML's number for it; -1: not in the inventory


@dataclass(frozen=True, slots=True)
class ClientGpuSnapshot:
    uuid: str
    state: str  # "idle", "waiting", "holding" or "draining"
    allocated_bytes: int
    holding_seconds: float
    recent_use: float = 0.0  # share of the last ~10 s it held the GPU busy (usage.py)


@dataclass(frozen=True, slots=True)
class ClientSnapshot:
    pid: int
    uid: int
    gid: int
    command: str
    gpus: tuple[ClientGpuSnapshot, ...]
    user: str = ""  # identity.py: the uid's name
    unit: str = ""  # its systemd unit
    container: str = ""  # its container or pod


@dataclass(frozen=True, slots=True)
class ShareGroupSnapshot:
    """A share group on a GPU (share_groups.py): a group with clients there, or
    with settings of its own."""

    gpu: str
    group: str  # "user:1000", "unit:jupyter-alice.service", "pod:<uid>", "process:4242"
    weight: int
    memory_cap_bytes: int  # 0: none
    use: float  # its clients' recent use together (usage.py's, ~10 s)
    share: float  # its share of the GPU's time over the last minute
    clients: int


@dataclass(frozen=True, slots=True)
class AgentSnapshot:
    gpus: tuple[GpuSnapshot, ...]
    clients: tuple[ClientSnapshot, ...]
    groups: tuple[ShareGroupSnapshot, ...] = ()
