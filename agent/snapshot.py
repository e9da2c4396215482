"""What the scheduler shows of itself: frozen, read by D-Bus properties and the
status line, and how they are taken from the core's state (take_snapshot)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from .core_state import EXCLUSIVE, SHARED, ClientState, GpuState, gpu_seconds_of, waited_of
from .group_totals import Tally
from .settings import DEFAULT_TIME_QUANTUM_S, AntiThrash


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
    gpu_seconds: float = 0.0  # its GPU time there since it came (the shim's measure)
    wait_cause: str = ""  # waiting: why now (policy.WaitCause's value)
    waited_s: tuple[tuple[str, float], ...] = ()  # seconds waited there, by cause


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
    # Counters (group_totals.py): its clients' GPU time there and seconds waited by
    # cause, those that have left included.
    gpu_seconds: float = 0.0
    waited_s: tuple[tuple[str, float], ...] = ()


# A ShareGroupSnapshot less its GPU: (group, weight, memory cap, use, share, clients,
# GPU seconds, seconds waited by cause).
GroupFigures = tuple[str, int, int, float, float, int, float, tuple[tuple[str, float], ...]]


def rounded_waits(waited: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    """Seconds waited by cause as a snapshot holds them: by cause, to the microsecond."""
    return tuple(sorted((cause, round(seconds, 6)) for cause, seconds in waited.items()))


@dataclass(frozen=True, slots=True)
class AgentSnapshot:
    gpus: tuple[GpuSnapshot, ...]
    clients: tuple[ClientSnapshot, ...]
    groups: tuple[ShareGroupSnapshot, ...] = ()


def take_snapshot(
    gpus: Mapping[bytes, GpuState],
    clients: Mapping[int, ClientState],
    now: float,
    *,
    format_gpu: Callable[[bytes], str],
    recent_use: Callable[[int, bytes, float], float],
    group_figures: Callable[[GpuState, float], Iterable[GroupFigures]],
    process_past: Callable[[int], Mapping[bytes, Tally]] = lambda pid: {},
) -> AgentSnapshot:
    """The core's state as status shows it (Scheduler.snapshot): GPUs by their
    settings and mode, clients that said HELLO with what they do on each GPU, the
    share groups on each GPU (group_figures: share_groups.ShareGroups.figures).  A
    process's first connection also carries what its gone ones did (process_past)."""
    gpu_records = tuple(
        GpuSnapshot(
            format_gpu(g.uuid),
            g.name,
            g.memory_total_bytes,
            tuple(clients[c].pid for c in g.holders),
            tuple(clients[c].pid for c in g.waiters),
            anti_thrash=g.settings.anti_thrash.value,
            mode=_mode(g),
            memory_capacity_bytes=g.capacity_bytes or 0,
            memory_demand_bytes=g.demand_bytes,
            time_quantum_s=g.settings.time_quantum_s,
            memory_limit_bytes=g.settings.memory_limit_bytes,
            index=-1 if g.index is None else g.index,
        )
        for g in gpus.values()
    )
    client_records = []
    carried: set[int] = set()  # pids whose past a connection already shows
    for client, state in clients.items():
        if not state.greeted:
            continue
        per_gpu = []
        for uuid in state.gpus:
            gpu = gpus[uuid]
            held = gpu.holders.get(client)
            if held is not None:
                status = "holding" if held.drop_requested_at is None else "draining"
                holding = now - held.granted_at
            else:
                status = "waiting" if client in gpu.waiters else "idle"
                holding = 0.0
            allocated = state.managed.get(uuid, 0) + state.unmanaged.get(uuid, 0)
            waiter = gpu.waiters.get(client)
            per_gpu.append(
                ClientGpuSnapshot(
                    format_gpu(uuid),
                    status,
                    allocated,
                    holding,
                    recent_use=round(recent_use(client, uuid, now), 3),
                    gpu_seconds=round(gpu_seconds_of(state, uuid, now), 6),
                    wait_cause="" if waiter is None else waiter.cause,
                    waited_s=rounded_waits(waited_of(state, waiter, uuid, now)),
                )
            )
        if state.pid not in carried:
            carried.add(state.pid)
            per_gpu = _with_past(per_gpu, process_past(state.pid), format_gpu)
        client_records.append(
            ClientSnapshot(state.pid, state.uid, state.gid, state.command, tuple(per_gpu))
        )
    groups = tuple(
        ShareGroupSnapshot(format_gpu(g.uuid), *row)
        for g in gpus.values()
        for row in group_figures(g, now)
    )
    return AgentSnapshot(gpu_records, tuple(client_records), groups)


def _with_past(
    per_gpu: list[ClientGpuSnapshot],
    past: Mapping[bytes, Tally],
    format_gpu: Callable[[bytes], str],
) -> list[ClientGpuSnapshot]:
    """A connection's GPU entries plus its process's gone connections' figures; a GPU
    only they used shows as idle, with nothing allocated."""
    entries = {entry.uuid: entry for entry in per_gpu}
    for uuid, tally in past.items():
        name = format_gpu(uuid)
        entry = entries.get(name) or ClientGpuSnapshot(name, "idle", 0, 0.0)
        waited = dict(entry.waited_s)
        for cause, seconds in tally.waited_s.items():
            waited[cause] = waited.get(cause, 0.0) + seconds
        entries[name] = dataclasses.replace(
            entry,
            gpu_seconds=round(entry.gpu_seconds + tally.gpu_s, 6),
            waited_s=rounded_waits(waited),
        )
    return list(entries.values())


def _mode(gpu: GpuState) -> str:
    """What status shows: "shared" when everyone's memory fits at once (or
    anti-thrash is off), else "exclusive" (turns; light work beside a turn only
    where its memory fits with the turn's)."""
    policy = gpu.settings.anti_thrash
    return (
        SHARED
        if policy is AntiThrash.OFF or (policy is AntiThrash.AUTO and gpu.fits)
        else EXCLUSIVE
    )
