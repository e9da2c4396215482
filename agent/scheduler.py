"""The scheduling core: a synchronous state machine with no I/O.

It never reads a clock, touches a socket, logs, or talks to D-Bus or NVML.
Adapters feed it events (connect, hello, request, release, memory report,
disconnect, tick, settings change) with the current monotonic time `now` in
seconds, and carry out the actions it returns, in order.  next_deadline() says
when the adapter must call tick() next.

Per GPU, with anti-thrash on: at most one exclusive holder and a first-come
first-served queue.  The time quantum counts from the grant; once it is over
and someone waits, the holder is asked to drop; if it has not released
drop_grace after that, its lease is revoked and the next waiter is granted.
A revoke only ever makes room for a waiter: if everyone who waited has left
(withdrawn or disconnected), the drop request stays pending but nothing is
revoked until someone waits again.
With anti-thrash off every request is granted at once, shared.  Switching it
back on asks the shared holders to drop and grants exclusively only when the
GPU is free again (released or revoked), so no one waits on anyone forever.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .settings import Settings
from .snapshot import AgentSnapshot, ClientGpuSnapshot, ClientSnapshot, GpuSnapshot

EXCLUSIVE = "exclusive"
SHARED = "shared"
# Byte counts are u64 wherever they go (the wire, D-Bus 't'); two u64 fields
# of one report can add up to more, which no one could show.
MAX_BYTES = 2**64 - 1


# ---------------------------------------------------------------- actions
# Plain (not frozen) slotted dataclasses: frozen ones cost a few microseconds
# more to build, and the hot path builds two or three per handoff.


@dataclass(slots=True)
class Grant:
    client: int
    pid: int
    gpu: bytes
    lease: int
    exclusive: bool
    waited_s: float


@dataclass(slots=True)
class AskToDrop:
    client: int
    pid: int
    gpu: bytes
    lease: int
    held_s: float


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
class Refuse:
    """A valid frame at the wrong time: the adapter sends ERROR and closes."""

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


# ---------------------------------------------------------------- state


@dataclass(slots=True)
class Lease:
    number: int
    mode: str
    granted_at: float
    drop_requested_at: float | None = None


@dataclass(slots=True)
class GpuState:
    uuid: bytes
    name: str = ""
    memory_total_bytes: int = 0
    from_inventory: bool = False
    holders: dict[int, Lease] = field(default_factory=dict)  # client -> lease, grant order
    waiters: dict[int, float] = field(default_factory=dict)  # client -> requested at, FCFS
    users: set[int] = field(default_factory=set)  # clients that named this GPU


@dataclass(slots=True)
class ClientState:
    pid: int
    uid: int
    gid: int
    greeted: bool = False
    command: str = ""
    gpus: dict[bytes, None] = field(default_factory=dict)  # ordered set
    memory: dict[bytes, int] = field(default_factory=dict)  # gpu -> bytes allocated


class Scheduler:
    def __init__(self, settings: Settings, *, max_gpus_per_client: int = 16, format_gpu=bytes.hex):
        self.settings = settings
        self.max_gpus_per_client = max_gpus_per_client
        self._format_gpu = format_gpu  # only for snapshots: the core keeps raw ids
        self.gpus: dict[bytes, GpuState] = {}
        self.clients: dict[int, ClientState] = {}
        self._last_lease = 0

    # ------------------------------------------------------------ inventory

    def add_gpu(self, uuid: bytes, name: str = "", memory_total_bytes: int = 0) -> None:
        """A GPU the node has (from NVML); kept even when no client uses it."""
        gpu = self.gpus.get(uuid) or self.gpus.setdefault(uuid, GpuState(uuid))
        gpu.name, gpu.memory_total_bytes, gpu.from_inventory = name, memory_total_bytes, True

    # ------------------------------------------------------------ events

    def connect(self, client: int, pid: int, uid: int, gid: int) -> list:
        self.clients[client] = ClientState(pid, uid, gid)
        return []

    def hello(self, client: int, gpus: tuple[bytes, ...], command: str, now: float) -> list:
        state = self.clients[client]
        if state.greeted:
            return [Refuse(client, "second HELLO on one connection")]
        state.greeted, state.command = True, command
        for uuid in gpus:
            refusal = self._use_gpu(client, state, uuid)
            if refusal:
                return [refusal]
        return [
            Greeted(client, state.pid, state.uid, state.gid, command, tuple(state.gpus)),
            SendSettings(client, self.settings),
        ]

    def request(self, client: int, uuid: bytes, now: float) -> list:
        state = self.clients[client]
        if not state.greeted:
            return [Refuse(client, "LOCK_REQUEST before HELLO")]
        refusal = self._use_gpu(client, state, uuid)
        if refusal:
            return [refusal]
        gpu = self.gpus[uuid]
        if client in gpu.holders:
            return [Ignored(client, state.pid, uuid, "duplicate request while holding")]
        if client in gpu.waiters:
            return [Ignored(client, state.pid, uuid, "duplicate request while waiting")]
        gpu.waiters[client] = now
        actions: list = []
        self._update(gpu, now, actions)
        if client in gpu.waiters:
            actions.insert(0, Queued(client, state.pid, uuid, len(gpu.waiters)))
        return actions

    def release(self, client: int, uuid: bytes, lease: int, now: float) -> list:
        state = self.clients[client]
        if not state.greeted:
            return [Refuse(client, "RELEASED before HELLO")]
        gpu = self.gpus.get(uuid)
        held = gpu.holders.get(client) if gpu else None
        if held is not None and held.number == lease:
            del gpu.holders[client]
            drop_to_release = (
                None if held.drop_requested_at is None else now - held.drop_requested_at
            )
            actions: list = [
                LockReleased(
                    client,
                    state.pid,
                    uuid,
                    lease,
                    now - held.granted_at,
                    drop_to_release,
                    "released",
                )
            ]
            self._update(gpu, now, actions)
            return actions
        if gpu and lease == 0 and client in gpu.waiters:
            del gpu.waiters[client]
            return [Withdrawn(client, state.pid, uuid)]
        return [Ignored(client, state.pid, uuid, f"stale release lease={lease}")]

    def memory_report(
        self, client: int, uuid: bytes, managed_bytes: int, unmanaged_bytes: int
    ) -> list:
        state = self.clients[client]
        if not state.greeted:
            return [Refuse(client, "MEMORY_REPORT before HELLO")]
        refusal = self._use_gpu(client, state, uuid)
        if refusal:
            return [refusal]
        total = managed_bytes + unmanaged_bytes
        if total > MAX_BYTES:
            return [Refuse(client, f"MEMORY_REPORT of {total} bytes does not fit in 64 bits")]
        state.memory[uuid] = total
        return []

    def disconnect(self, client: int, now: float) -> list:
        state = self.clients.pop(client, None)
        if state is None:
            return []
        actions: list = []
        for uuid in state.gpus:
            gpu = self.gpus[uuid]
            gpu.waiters.pop(client, None)
            gpu.users.discard(client)
            held = gpu.holders.pop(client, None)
            if held is not None:
                actions.append(
                    LockReleased(
                        client,
                        state.pid,
                        uuid,
                        held.number,
                        now - held.granted_at,
                        None,
                        "disconnect",
                    )
                )
                self._update(gpu, now, actions)
            if not gpu.users and not gpu.from_inventory:
                del self.gpus[uuid]  # learned from clients only: forget it with them
        actions.append(Gone(client, state.pid, state.greeted))
        return actions

    def tick(self, now: float) -> list:
        actions: list = []
        for gpu in list(self.gpus.values()):
            if gpu.holders:
                self._update(gpu, now, actions)
        return actions

    def change_settings(self, settings: Settings, now: float) -> list:
        previous, self.settings = self.settings, settings
        actions: list = [SendSettings(None, settings)]
        for gpu in self.gpus.values():
            if previous.anti_thrash and not settings.anti_thrash:
                for held in gpu.holders.values():
                    held.drop_requested_at = None  # nothing to make room for any more
            elif settings.anti_thrash and not previous.anti_thrash:
                self._drain_shared_holders(gpu, now, actions)
            self._update(gpu, now, actions)
        return actions

    def next_deadline(self) -> float | None:
        """When tick() must run next, or None when no timer is needed."""
        quantum = self.settings.time_quantum_s
        grace = self.settings.drop_grace_ms / 1000.0
        deadline = None
        for gpu in self.gpus.values():
            if not gpu.waiters:
                continue  # no one to make room for: no drop request, no revoke
            for held in gpu.holders.values():
                if held.drop_requested_at is not None:
                    due = held.drop_requested_at + grace
                elif self.settings.anti_thrash:
                    due = held.granted_at + quantum
                else:
                    continue
                if deadline is None or due < deadline:
                    deadline = due
        return deadline

    # ------------------------------------------------------------ internals

    def _use_gpu(self, client: int, state: ClientState, uuid: bytes) -> Refuse | None:
        if uuid in state.gpus:
            return None
        if len(state.gpus) >= self.max_gpus_per_client:
            return Refuse(client, f"more than {self.max_gpus_per_client} GPUs on one connection")
        state.gpus[uuid] = None
        gpu = self.gpus.get(uuid) or self.gpus.setdefault(uuid, GpuState(uuid))
        gpu.users.add(client)
        return None

    def _update(self, gpu: GpuState, now: float, actions: list) -> None:
        """Bring one GPU up to date at `now`: revoke, ask to drop, grant."""
        settings = self.settings
        # Revoking makes room for a waiter; with none left (the only one
        # withdrew or exited after the drop request) it would only cut a
        # holder off for nothing.  The drop request stays pending, so a new
        # waiter does not have to wait another grace for an overdue holder.
        if gpu.holders and gpu.waiters:
            grace = settings.drop_grace_ms / 1000.0
            for client, held in list(gpu.holders.items()):
                if held.drop_requested_at is not None and now >= held.drop_requested_at + grace:
                    del gpu.holders[client]
                    actions.append(
                        Revoke(
                            client,
                            self.clients[client].pid,
                            gpu.uuid,
                            held.number,
                            now - held.granted_at,
                        )
                    )
        if not settings.anti_thrash:
            while gpu.waiters:
                self._grant_first_waiter(gpu, now, SHARED, actions)
            return
        if not gpu.waiters:
            return
        if not gpu.holders:
            self._grant_first_waiter(gpu, now, EXCLUSIVE, actions)
            return
        if len(gpu.holders) == 1:
            client, held = next(iter(gpu.holders.items()))
            if held.drop_requested_at is None and now >= held.granted_at + settings.time_quantum_s:
                held.drop_requested_at = now
                actions.append(
                    AskToDrop(
                        client,
                        self.clients[client].pid,
                        gpu.uuid,
                        held.number,
                        now - held.granted_at,
                    )
                )

    def _grant_first_waiter(self, gpu: GpuState, now: float, mode: str, actions: list) -> None:
        client = next(iter(gpu.waiters))
        requested_at = gpu.waiters.pop(client)
        self._last_lease += 1
        gpu.holders[client] = Lease(self._last_lease, mode, now)
        actions.append(
            Grant(
                client,
                self.clients[client].pid,
                gpu.uuid,
                self._last_lease,
                mode == EXCLUSIVE,
                now - requested_at,
            )
        )

    def _drain_shared_holders(self, gpu: GpuState, now: float, actions: list) -> None:
        """Anti-thrash just came on: shared holders must all leave before anyone
        holds exclusively.  A lone exclusive holder (granted before anti-thrash
        went off, and never joined by others) simply keeps its lease."""
        holders = gpu.holders
        if len(holders) == 1 and next(iter(holders.values())).mode == EXCLUSIVE:
            return
        for client, held in holders.items():
            if held.drop_requested_at is None:
                held.drop_requested_at = now
                actions.append(
                    AskToDrop(
                        client,
                        self.clients[client].pid,
                        gpu.uuid,
                        held.number,
                        now - held.granted_at,
                    )
                )

    # ------------------------------------------------------------ status

    def snapshot(self, now: float) -> AgentSnapshot:
        fmt = self._format_gpu
        gpus = tuple(
            GpuSnapshot(
                fmt(g.uuid),
                g.name,
                g.memory_total_bytes,
                tuple(self.clients[c].pid for c in g.holders),
                tuple(self.clients[c].pid for c in g.waiters),
            )
            for g in self.gpus.values()
        )
        clients = []
        for client, state in self.clients.items():
            if not state.greeted:
                continue
            per_gpu = []
            for uuid in state.gpus:
                gpu = self.gpus[uuid]
                held = gpu.holders.get(client)
                if held is not None:
                    status = "holding" if held.drop_requested_at is None else "draining"
                    holding = now - held.granted_at
                else:
                    status = "waiting" if client in gpu.waiters else "idle"
                    holding = 0.0
                per_gpu.append(
                    ClientGpuSnapshot(fmt(uuid), status, state.memory.get(uuid, 0), holding)
                )
            clients.append(
                ClientSnapshot(state.pid, state.uid, state.gid, state.command, tuple(per_gpu))
            )
        return AgentSnapshot(gpus, tuple(clients))
