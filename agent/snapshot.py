"""What the scheduler shows of itself: frozen, read by D-Bus properties and the status line."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    uuid: str
    name: str
    memory_total_bytes: int
    holder_pids: tuple[int, ...]
    queue_pids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ClientGpuSnapshot:
    uuid: str
    state: str  # "idle", "waiting", "holding" or "draining"
    allocated_bytes: int
    holding_seconds: float


@dataclass(frozen=True, slots=True)
class ClientSnapshot:
    pid: int
    uid: int
    gid: int
    command: str
    gpus: tuple[ClientGpuSnapshot, ...]


@dataclass(frozen=True, slots=True)
class AgentSnapshot:
    gpus: tuple[GpuSnapshot, ...]
    clients: tuple[ClientSnapshot, ...]
