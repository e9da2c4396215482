"""The scheduling core: a synchronous state machine with no I/O.

It never reads a clock, touches a socket, logs, or talks to D-Bus or NVML.
The engine (engine.py) feeds it events (connect, hello, request, release,
memory figures, disconnect, tick, settings change) with the current monotonic
time `now` in seconds, and carries out the actions (actions.py) it returns, in
order.  next_deadline() says when tick() must run next.  With decide_later (the
engine's), the rules look at the GPUs events touched only at decide_pending().

Per GPU, by the anti-thrash setting (docs/scheduling.md has the diagrams):

- on: at most one exclusive holder and a first-come first-served queue.  The
  time quantum counts from the grant; once it is over and someone waits, the
  holder is asked to drop; if it has not released drop_grace after that, its
  lease is revoked and the next waiter is granted.  A revoke only ever makes
  room for a waiter: if everyone who waited has left, the drop request stays
  pending but nothing is revoked until someone waits again.
- off: every request is granted at once, shared.  Switching it back on asks
  the shared holders to drop and grants exclusively only when the GPU is free
  again (released or revoked), so no one waits on anyone forever.
- auto (policy.Policy.decide, docs/scheduling.md's one page): what fits together
  runs together, but two clients that each keep the GPU busy take short turns
  where turns pay; work owed more GPU time goes first and may cut a turn short;
  a holder in a waiter's way that does not keep the GPU busy gives it back at its
  next idle moment.  Use is GPU time, measured by the shim (usage.py).

Each GPU runs by its own settings (GpuState.settings): the node-wide ones with
what the GPU sets for itself over them, by NVML index and, over that, by UUID.
They are worked out when a GPU appears, when settings change and when the
inventory gives a GPU its index; a GPU whose mode changes goes through the same
transitions as a node-wide switch (node_gpus.NodeGpus.settle).

The core's events are short methods that update the state they name and have the
rules look at the GPUs they touched.  What they keep track of besides has modules of
its own: the rules (policy.py), the node's GPUs, their settings and memory fit
(node_gpus.py), the share groups' accounts and memory caps (share_groups.py), the
deadlines (deadlines.py) and the snapshot (snapshot.take_snapshot).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from .actions import (
    Action,
    Gone,
    Greeted,
    Ignored,
    LockReleased,
    Queued,
    Refuse,
    SendSettings,
    Withdrawn,
)
from .core_state import ClientState, GpuState, Waiter
from .deadlines import CoreDeadlines
from .node_gpus import MAX_BYTES, NodeGpus
from .policy import Policy
from .process_past import ProcessPast
from .settings import Settings
from .share_groups import ShareGroups, own_figures, unit_group
from .snapshot import AgentSnapshot, take_snapshot
from .usage import meter_of

# MEMORY_CAP frames that memory reports make due go out at most this often per GPU: what
# a group's other processes hold may be this much stale (docs/scheduling.md, "Shares").
CAPS_EVERY_S = 0.01
# A shim sends HELLO right after connect(); a peer that has not within this
# long only holds an fd (and a place under the connection limits).
HELLO_TIMEOUT_S = 10.0


class Scheduler:
    def __init__(
        self,
        settings: Settings,
        *,
        max_gpus_per_client: int = 16,
        hello_timeout_s: float = HELLO_TIMEOUT_S,
        format_gpu: Callable[[bytes], str] = bytes.hex,
    ):
        self.hello_timeout_s = hello_timeout_s
        self._format_gpu = format_gpu  # only for snapshots and refusals: the core keeps raw ids
        self.gpus: dict[bytes, GpuState] = {}
        self.clients: dict[int, ClientState] = {}
        self.process_past = ProcessPast()  # gone connections of processes still here
        self._deadlines = CoreDeadlines(self.gpus, self.clients, hello_timeout_s)
        self.shares = ShareGroups()  # share groups' accounts and memory caps
        self.policy = Policy(self.clients, self.gpus, self.shares)  # the rules
        self.node = NodeGpus(  # the GPUs, their settings and memory fit
            settings, self.gpus, self.clients, self.policy.leases, max_gpus_per_client, format_gpu
        )
        # The engine's choice: the rules look at the GPUs events touched once per batch
        # of events (decide_pending), not at each: a look costs a few microseconds per
        # client, and a crowd arriving at once cost seconds.
        self.decide_later = False
        self._undecided: dict[bytes, GpuState] = {}
        self._asked: list[tuple[int, bytes]] = []  # requests since: client, GPU

    # ------------------------------------------------------------ inventory

    @property
    def settings(self) -> Settings:
        return self.node.settings

    def add_gpu(
        self,
        uuid: bytes,
        name: str = "",
        memory_total_bytes: int = 0,
        now: float = 0.0,
        index: int | None = None,
    ) -> list[Action]:
        """A GPU the node has (from NVML): node_gpus.NodeGpus.add."""
        actions: list[Action] = []
        gpu = self.node.add(uuid, name, memory_total_bytes, now, index, actions)
        self._update(gpu, now, actions)
        return actions

    def inventory_missing(self) -> list[Action]:
        """NVML could not be read: GPUs come from clients only, and none has an index."""
        actions: list[Action] = []
        self.node.inventory_missing(actions)
        return actions

    def allow_gpu(self, uuid: bytes) -> None:
        """An id the inventory knows but does not schedule on its own (a MIG instance)."""
        self.node.allow(uuid)

    def nvml_processes(self, readings: dict[bytes, dict[int, int]], now: float) -> list[Action]:
        """NVML's per-process memory on each GPU (pid -> bytes), all processes."""
        actions: list[Action] = []
        for uuid, by_pid in readings.items():
            gpu = self.gpus.get(uuid)
            if gpu is None:
                continue
            gpu.process_bytes = dict(by_pid)
            self.node.refit(gpu, now, actions, "nvml reading")
            self._update(gpu, now, actions)
        return actions

    # ------------------------------------------------------------ events

    def connect(self, client: int, pid: int, uid: int, gid: int, now: float = 0.0) -> list[Action]:
        self.clients[client] = ClientState(pid, uid, gid, connected_at=now)
        self.process_past.connected(pid)
        self._deadlines.push(now + self.hello_timeout_s, client)
        return []

    def hello(
        self, client: int, gpus: tuple[bytes, ...], command: str, now: float, features: int = 0
    ) -> list[Action]:
        state = self.clients[client]
        if state.greeted:
            return [Refuse(client, "second HELLO on one connection")]
        state.greeted, state.command, state.features = True, command, features
        notes: list[Action] = []
        for uuid in gpus:
            refusal = self._use_gpu(client, state, uuid, notes)
            if refusal:
                return [refusal]
        return [
            Greeted(client, state.pid, state.uid, state.gid, command, tuple(state.gpus)),
            *notes,
            SendSettings(client, self.settings),
        ]

    def request(self, client: int, uuid: bytes, now: float) -> list[Action]:
        state = self.clients[client]
        if not state.greeted:
            return [Refuse(client, "LOCK_REQUEST before HELLO")]
        actions: list[Action] = []
        refusal = self._use_gpu(client, state, uuid, actions)
        if refusal:
            return [refusal]
        gpu = self.gpus[uuid]
        if client in gpu.holders:
            return [Ignored(client, state.pid, uuid, "duplicate request while holding")]
        if client in gpu.waiters:
            return [Ignored(client, state.pid, uuid, "duplicate request while waiting")]
        if uuid not in state.active:
            state.active.add(uuid)  # its context now takes memory there
            self.node.refit(gpu, now, actions, "new client")
        gpu.waiters[client] = Waiter(now)
        state.asked_at[uuid] = now
        meter_of(state, uuid, now)  # its stay there counts from its first request
        self._update(gpu, now, actions)
        if self.decide_later:  # queued or granted: decide_pending says
            self._asked.append((client, uuid))
        elif client in gpu.waiters:
            actions.insert(0, Queued(client, state.pid, uuid, len(gpu.waiters)))
        return actions

    def release(
        self, client: int, uuid: bytes, lease: int, now: float, idle_ms: int = 0
    ) -> list[Action]:
        state = self.clients[client]
        if not state.greeted:
            return [Refuse(client, "RELEASED before HELLO")]
        gpu = self.gpus.get(uuid)
        held = gpu.holders.get(client) if gpu else None
        if gpu is not None and held is not None and held.number == lease:
            del gpu.holders[client]
            self.policy.leases.lease_ended(state, uuid, held, now, idle_ms / 1000.0)
            drop_to_release = (
                None if held.drop_requested_at is None else now - held.drop_requested_at
            )
            actions: list[Action] = [
                LockReleased(
                    client,
                    state.pid,
                    uuid,
                    lease,
                    now - held.granted_at,
                    drop_to_release,
                    "released",
                    idle_ms,
                )
            ]
            self._update(gpu, now, actions)
            return actions
        if gpu and lease == 0 and client in gpu.waiters:
            self.policy.note_wait(gpu, client, gpu.waiters.pop(client), "", now)
            meter_of(state, uuid, now).thaw(now)  # no longer waiting: its use decays again
            actions = [Withdrawn(client, state.pid, uuid)]
            self._update(gpu, now, actions)  # the best waiter may have changed
            return actions
        return [Ignored(client, state.pid, uuid, f"stale release lease={lease}")]

    def memory_report(
        self, client: int, uuid: bytes, managed_bytes: int, unmanaged_bytes: int, now: float = 0.0
    ) -> list[Action]:
        state = self.clients[client]
        if not state.greeted:
            return [Refuse(client, "MEMORY_REPORT before HELLO")]
        total = managed_bytes + unmanaged_bytes
        if total > MAX_BYTES:
            return [Refuse(client, f"MEMORY_REPORT of {total} bytes does not fit in 64 bits")]
        actions: list[Action] = []
        refusal = self._use_gpu(client, state, uuid, actions)
        if refusal:
            return [refusal]
        state.managed[uuid], state.unmanaged[uuid] = managed_bytes, unmanaged_bytes
        if total:
            state.active.add(uuid)
        gpu = self.gpus[uuid]
        self.node.refit(gpu, now, actions, f"memory report pid={state.pid}")
        gpu.caps_due = True  # its group's others: soon (_update)
        self._update(gpu, now, actions)
        return actions

    def gpu_usage(self, client: int, uuid: bytes, busy_us: int, now: float) -> list[Action]:
        """A measuring shim's GPU time on a GPU: a running total since its HELLO.
        Read by the rules at their next look (requests, the light check), so a
        report itself decides nothing."""
        state = self.clients[client]
        if not state.greeted:
            return [Refuse(client, "GPU_USAGE before HELLO")]
        if uuid not in state.gpus:
            return [Ignored(client, state.pid, uuid, "usage of a GPU it never named")]
        self.policy.leases.note_usage(client, uuid, busy_us / 1e6, now)
        return []

    def gpu_memory(self, client: int, uuid: bytes, total_bytes: int, now: float) -> list[Action]:
        """A client's shim says how much memory a GPU has."""
        state = self.clients[client]
        if not state.greeted:
            return [Refuse(client, "GPU_MEMORY before HELLO")]
        actions: list[Action] = []
        refusal = self._use_gpu(client, state, uuid, actions)
        if refusal:
            return [refusal]
        gpu = self.gpus[uuid]
        gpu.reported_totals[client] = total_bytes
        self.node.refit(gpu, now, actions, "gpu memory reported")
        self._update(gpu, now, actions)
        return actions

    def disconnect(self, client: int, now: float) -> list[Action]:
        return self.disconnect_many((client,), now)

    def disconnect_many(self, clients: Iterable[int], now: float) -> list[Action]:
        """Clients gone at once (many waiters exiting together): all of them leave
        every queue before anyone is granted, so no grant goes to one already gone."""
        actions: list[Action] = []
        gone: list[Action] = []
        touched: dict[bytes, GpuState] = {}
        for client in clients:
            state = self.clients.pop(client, None)
            if state is None:
                continue
            figures = {
                uuid: own_figures(state, self.gpus[uuid], client, now) for uuid in state.gpus
            }
            self.process_past.left(state.pid, figures)
            for uuid in state.gpus:
                gpu = self.gpus[uuid]
                self.shares.client_left(gpu, client, state, now)  # its wait under way too
                gpu.waiters.pop(client, None)
                gpu.users.discard(client)
                gpu.displaced.pop(client, None)
                gpu.reported_totals.pop(client, None)
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
                touched[uuid] = gpu
            gpu_seconds = sum(tally.gpu_s for tally in figures.values())
            gone.append(Gone(client, state.pid, state.greeted, gpu_seconds))
        for uuid, gpu in touched.items():
            if not gpu.users and not gpu.from_inventory:
                self.node.forget_learned(gpu)
                self.shares.forget_gpu(uuid)
                del self.gpus[uuid]  # learned from clients only: forget it with them
                continue
            self.node.refit(gpu, now, actions, "client gone")
            # Its group's others hold less: told with the reports' (_update), at most
            # every CAPS_EVERY_S.  A crowd that leaves at once was told n times n.
            gpu.caps_due = True
            self._update(gpu, now, actions)
        return actions + gone

    # ------------------------------------------------------------ share groups

    def identified(self, client: int, unit: str, container: str, now: float) -> list[Action]:
        """Where a client comes from (its systemd unit, its pod), once the engine has
        read it: its group under share_by=unit (share_groups.py)."""
        state = self.clients.get(client)
        if state is None:
            return []
        state.share_unit = unit_group(unit, container)
        for uuid in state.gpus:  # what it did so far stays with the group it was in
            self.shares.settle_totals(self.gpus[uuid], self.clients, now)
        return self.memory_caps(client)

    def memory_caps(self, client: int | None = None) -> list[Action]:
        """MEMORY_CAP frames due on the GPUs a client named (the engine asks after
        WELCOME), or on every GPU."""
        state = self.clients.get(client) if client is not None else None
        gpus = self.gpus.values() if state is None else [self.gpus[u] for u in state.gpus]
        return self.shares.memory_caps(gpus, self.clients)

    def tick(self, now: float) -> list[Action]:
        actions: list[Action] = []
        for key in self._deadlines.due(now):
            if isinstance(key, int):
                message = f"no HELLO within {self.hello_timeout_s:g} s of connecting"
                actions.append(Refuse(key, message))
            else:
                gpu = self.gpus[key]
                gpu.deadline = None
                self._update(gpu, now, actions)
        return actions

    def change_settings(self, settings: Settings, now: float) -> list[Action]:
        """New settings, node-wide and per GPU: each GPU switches to what it now
        runs by (node_gpus.NodeGpus.settle)."""
        actions: list[Action] = []
        self.node.change_settings(settings, actions)
        for gpu in self.gpus.values():
            self.node.settle(gpu, now, actions)
            self.shares.settle_totals(gpu, self.clients, now)  # share_by may have changed
            self._update(gpu, now, actions)
        return actions + self.memory_caps()

    def next_deadline(self) -> float | None:
        """When tick() must run next, or None when no timer is needed."""
        return self._deadlines.earliest()

    # ------------------------------------------------------------ who may name which GPU

    def _use_gpu(
        self, client: int, state: ClientState, uuid: bytes, actions: list[Action]
    ) -> Refuse | None:
        """It names a GPU: refused, or its user, counted in its share group there from now."""
        if uuid in state.gpus:
            return None
        refusal = self.node.use(client, state, uuid, actions)
        if refusal is None:
            self.shares.joined(self.gpus[uuid], client, state)
        return refusal

    # ------------------------------------------------------------ the rules, per GPU

    def decide_pending(self, now: float) -> list[Action]:
        """With decide_later: the rules look at each GPU that events touched since the
        last call (a thousand requests at once: one look, not a thousand)."""
        actions: list[Action] = []
        undecided, self._undecided = self._undecided, {}
        for uuid, gpu in undecided.items():
            if self.gpus.get(uuid) is gpu:  # a learned GPU goes with its last client
                self._decide(gpu, now, actions)
        asked, self._asked = self._asked, []
        for client, uuid in asked:
            waiting_on, state = self.gpus.get(uuid), self.clients.get(client)
            if waiting_on is not None and state is not None and client in waiting_on.waiters:
                actions.append(Queued(client, state.pid, uuid, len(waiting_on.waiters)))
        return actions

    @property
    def undecided(self) -> bool:
        """decide_pending has GPUs to look at."""
        return bool(self._undecided)

    def _update(self, gpu: GpuState, now: float, actions: list[Action]) -> None:
        if self.decide_later:
            self._undecided[gpu.uuid] = gpu
        else:
            self._decide(gpu, now, actions)

    def _decide(self, gpu: GpuState, now: float, actions: list[Action]) -> None:
        """Bring one GPU up to date at `now` (the policy decides), and note when it must
        be looked at next."""
        due = self.policy.decide(gpu, now, actions)
        if gpu.caps_due:
            # A thousand capped processes of one group that start at once report a
            # thousand times: telling each the others' figures every time was a million
            # frames, and the agent fell seconds behind.  At most every CAPS_EVERY_S.
            if now >= gpu.caps_told_at + CAPS_EVERY_S:
                gpu.caps_due, gpu.caps_told_at = False, now
                actions += self.shares.memory_caps([gpu], self.clients)
            else:
                due = min(gpu.caps_told_at + CAPS_EVERY_S, due if due is not None else math.inf)
        if due != gpu.deadline:
            gpu.deadline = due
            if due is not None:
                self._deadlines.push(due, gpu.uuid)

    # ------------------------------------------------------------ status

    def snapshot(self, now: float) -> AgentSnapshot:
        return take_snapshot(
            self.gpus,
            self.clients,
            now,
            format_gpu=self._format_gpu,
            recent_use=self.policy.usage,
            group_figures=lambda gpu, at: self.shares.figures(gpu, self.clients, at),
            process_past=self.process_past.of,
        )
