"""Share groups: fairness between people, not processes (docs/scheduling.md, "Shares").

Pure, like the rest of the core: the time is an argument, nothing here reads a
clock or does I/O.

A group is what the setting share_by says: the client's user (its uid), its
systemd unit or Kubernetes pod, or the process itself.  Per GPU, each group is
*charged* the GPU time its clients keep the GPU busy (usage.py's running totals),
divided by the group's weight: a virtual time, as in stride scheduling or Linux's
CFS.  Among busy waiters the next turn goes to the group charged least, then to
that group's client with the least recent use.  Two busy groups so get GPU time
in proportion to their weights, whatever number of processes each runs.  The
decaying use of usage.py cannot do this: a turn of 30 s fills a 10 s window, and
after any long turn every other group looks idle, so turns would only alternate.

A group with nothing on a GPU (no lease, no request) for ABSENCE_S cannot bank time there:
when it comes back it is charged at least as much as the least charged group
present, so a user back from lunch does not take the GPU for as long as she was
away, and pays nothing again for what she used before.

Groups need a bound of their own on waits.  A client of a group with three busy
clients, beside another group with one, waits five turns of the quantum between
its own turns when all is fair; the rule "a waiter that has waited a quantum
goes first" (policy.py) would undo the groups.  So here a waiter goes ahead of
the groups once it has waited (f + 1) quanta, f = its *fair factor*: the weights
of the groups with busy work there, over its group's weight, times the busy
clients of its group.  f is at most n^2 x (largest weight / smallest), n the
clients on the GPU; the starvation bound becomes (f + 1) x TQ + n x (TQ + grace).

Memory caps: each client of a group with a cap is told the cap and what the
group's other clients hold on each GPU (MEMORY_CAP), whenever either changes; its
shim refuses an allocation that would take the group past the cap.

Status shows each group's counters of GPU time and seconds waited, its gone
clients' included (group_totals.py): the clients are counted in their groups as
they come, move and leave (joined, settle_totals, client_left).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .actions import Action, SendMemoryCap
from .core_state import FEATURE_MEMORY_CAP, ClientState, GpuState, gpu_seconds_of, waited_of
from .group_totals import GroupTotals, Tally
from .settings import Settings, Share, ShareBy
from .snapshot import GroupFigures, rounded_waits

# The window of each group's share of a GPU's time, shown in status: a minute.
SHARE_WINDOW_S = 60.0
# A group away this long (no lease, no request) comes back, no longer present: a
# pause between a trainer's epochs, or its idle release and the next request, is not.
ABSENCE_S = 10.0
# Accounts of groups with no client left on a GPU, kept for when they come back.
MAX_ABSENT_ACCOUNTS = 1024
NO_SHARE = Share()


@dataclass(slots=True)
class GroupAccount:
    """One group on one GPU."""

    charged_s: float = 0.0  # GPU time / weight, since the group came to the GPU
    seen_s: dict[int, float] = field(default_factory=dict)  # client -> GPU time charged
    seen_at: float | None = None  # when it last had a lease or a request there
    minute_s: float = 0.0  # GPU time, decaying over SHARE_WINDOW_S
    minute_at: float = 0.0
    since: float = 0.0  # when the account began

    def minute_share(self, now: float) -> float:
        """The share of the GPU's time it had over the last minute (0..1, or more
        where its clients ran beside each other): its decaying GPU time over the
        decaying time there was, so that an account younger than a minute reads right."""
        decay = math.exp(-max(0.0, now - self.minute_at) / SHARE_WINDOW_S)
        there = SHARE_WINDOW_S * (1.0 - math.exp(-max(0.0, now - self.since) / SHARE_WINDOW_S))
        return self.minute_s * decay / there if there > 0 else 0.0


def group_of(state: ClientState, share_by: ShareBy, pid: int | None = None) -> str:
    """A client's group id under share_by, as settings name groups."""
    if share_by is ShareBy.PROCESS:
        return f"process:{state.pid if pid is None else pid}"
    if share_by is ShareBy.UNIT and state.share_unit:
        return state.share_unit
    return f"user:{state.uid}"  # unit: until the agent knows it, or where there is none


def unit_group(unit: str, container: str) -> str:
    """The group share_by=unit gives a client (identity.py's figures): its pod in
    Kubernetes, else its systemd unit; "" when it has neither (its user's then)."""
    if container.startswith("pod:"):
        return "pod:" + container.removeprefix("pod:").split("/", 1)[0]
    return f"unit:{unit}" if unit else ""


class ShareGroups:
    """Every GPU's group accounts, and the memory caps last told to each client."""

    def __init__(self) -> None:
        self._accounts: dict[bytes, dict[str, GroupAccount]] = {}
        self._home: dict[tuple[int, bytes], str] = {}  # (client, gpu) -> its group there
        self._caps_sent: dict[bytes, dict[int, tuple[int, int]]] = {}  # gpu -> client -> told
        self._shares_of: tuple[Settings | None, dict[str, Share]] = (None, {})
        self._totals = GroupTotals()  # the groups' counters, their gone clients' included

    def _shares(self, settings: Settings) -> dict[str, Share]:
        """The groups with settings, by group (kept while settings stay the same)."""
        cached_for, by_group = self._shares_of
        if cached_for is not settings:
            by_group = dict(settings.shares)
            self._shares_of = (settings, by_group)
        return by_group

    def share(self, settings: Settings, group: str) -> Share:
        return self._shares(settings).get(group, NO_SHARE)

    def weight(self, settings: Settings, group: str) -> int:
        return self.share(settings, group).weight or 1

    def client_weight(self, gpu: GpuState, state: ClientState) -> int:
        """A client's group's weight on gpu (its slot in the GPU's fair page)."""
        return self.weight(gpu.settings, group_of(state, gpu.settings.share_by))

    # ------------------------------------------------------------ accounting

    def sync(
        self, gpu: GpuState, clients: dict[int, ClientState], now: float
    ) -> dict[str, GroupAccount]:
        """Charge each group on gpu what its clients used since the last look, and
        bring groups that came back up to the least charged one present."""
        settings = gpu.settings
        accounts = self._accounts.setdefault(gpu.uuid, {})
        members: dict[str, list[int]] = {}
        group_of_client: dict[int, str] = {}
        for client in gpu.users:
            state = clients[client]
            group = group_of_client[client] = group_of(state, settings.share_by)
            members.setdefault(group, []).append(client)
            account = accounts.get(group)
            if account is None:
                account = accounts[group] = GroupAccount(minute_at=now, since=now)
            total = gpu_seconds_of(state, gpu.uuid, now)
            home = self._home.get((client, gpu.uuid))
            if home != group:
                if home is not None:  # moved (its unit became known, share_by changed)
                    accounts.get(home, GroupAccount()).seen_s.pop(client, None)
                    account.seen_s[client] = total
                self._home[(client, gpu.uuid)] = group
            used = max(0.0, total - account.seen_s.get(client, 0.0))
            account.seen_s[client] = total
            if used:
                account.charged_s += used / self.weight(settings, group)
                decay = math.exp(-max(0.0, now - account.minute_at) / SHARE_WINDOW_S)
                account.minute_s = account.minute_s * decay + used
                account.minute_at = now
        holding = {group_of_client[c] for c in gpu.holders}
        present = holding | {group_of_client[c] for c in gpu.waiters}

        # A waiting group has been here since its earliest request, whenever the rules
        # last looked: a 30 s turn with no event in it once made a group that waited
        # through it look away and come back, and lose its weight.
        since: dict[str, float] = {}
        for client, waiter in gpu.waiters.items():
            group = group_of_client[client]
            since[group] = min(since.get(group, waiter.requested_at), waiter.requested_at)

        def back(group: str) -> bool:
            seen = accounts[group].seen_at
            return group not in holding and (
                seen is None or since.get(group, now) - seen > ABSENCE_S
            )

        stayed = [accounts[g].charged_s for g in present if not back(g)]
        floor = min(stayed, default=None)
        for group in present:
            account = accounts[group]
            if back(group) and floor is not None:
                account.charged_s = max(account.charged_s, floor)
            account.seen_at = now
        for account in accounts.values():
            for client in [c for c in account.seen_s if c not in gpu.users]:
                del account.seen_s[client]  # gone: what it used is charged
                self._home.pop((client, gpu.uuid), None)
        # The least charged present, those back brought up included: a look reads its
        # accounts once, and an absent group charged no more than that is forgotten now.
        least = min((accounts[g].charged_s for g in present), default=None)
        self._forget_absent(accounts, members, least)
        return accounts

    def _forget_absent(
        self, accounts: dict[str, GroupAccount], members: dict[str, list[int]], floor: float | None
    ) -> None:
        """An account with no client left matters only while it is charged more than
        the groups present (it would be brought up to them when it came back)."""
        absent = [g for g in accounts if g not in members]
        for group in absent:
            if floor is not None and accounts[group].charged_s <= floor:
                del accounts[group]
        absent = [g for g in accounts if g not in members]
        if len(absent) > MAX_ABSENT_ACCOUNTS:
            absent.sort(key=lambda g: accounts[g].charged_s)
            for group in absent[: len(absent) - MAX_ABSENT_ACCOUNTS]:
                del accounts[group]

    def forget_gpu(self, uuid: bytes) -> None:
        self._totals.forget_gpu(uuid)
        self._accounts.pop(uuid, None)
        self._caps_sent.pop(uuid, None)
        for key in [k for k in self._home if k[1] == uuid]:  # (client, GPU) -> group
            del self._home[key]

    def look(
        self, gpu: GpuState, clients: dict[int, ClientState], now: float
    ) -> dict[str, GroupAccount]:
        """The group accounts for one look of the rules, brought up to now (sync): read by
        charged() and turn_order() for the rest of that look.  None (empty) under
        share_by=process, where the policy compares clients by their use alone."""
        if gpu.settings.share_by is ShareBy.PROCESS:
            return {}
        return self.sync(gpu, clients, now)

    def charged(
        self, gpu: GpuState, clients: dict[int, ClientState], accounts: dict[str, GroupAccount]
    ) -> Callable[[int], float]:
        """Each client's group's charge on gpu (GPU time over weight; 0 under
        share_by=process), from this look's accounts."""
        if gpu.settings.share_by is ShareBy.PROCESS:
            return lambda client: 0.0
        share_by = gpu.settings.share_by

        def of(client: int) -> float:
            account = accounts.get(group_of(clients[client], share_by))
            return 0.0 if account is None else account.charged_s

        return of

    # ------------------------------------------------------------ the order of busy waiters

    def turn_order(
        self,
        gpu: GpuState,
        clients: dict[int, ClientState],
        accounts: dict[str, GroupAccount],
        now: float,
        reached: Callable[[float], bool],
    ) -> Callable[[int], tuple[bool, float, bool, float, float]] | None:
        """The key that orders gpu's waiters by groups (least first): a waiter
        overdue by its fair factor first, oldest first; then the group charged
        least; then, within the group, the policy's own order (one that waited a
        quantum, then the least recent use, then request order).  Where only one
        group has busy work, that order alone.  None under share_by=process."""
        settings = gpu.settings
        if settings.share_by is ShareBy.PROCESS:
            return None
        busy: dict[str, int] = {}  # group -> its clients that hold or wait
        for client in (*gpu.holders, *gpu.waiters):
            group = group_of(clients[client], settings.share_by)
            busy[group] = busy.get(group, 0) + 1
        weights = sum(self.weight(settings, g) for g in busy)
        quantum = settings.time_quantum_s

        def key(client: int) -> tuple[bool, float, bool, float, float]:
            state = clients[client]
            waiter = gpu.waiters[client]
            group = group_of(state, settings.share_by)
            starving = reached(waiter.requested_at + quantum)
            if busy.keys() <= {group}:
                fair = 0.0  # its group alone: the policy's order, as per process
            else:
                weight = self.weight(settings, group)
                fair = (
                    max(1, busy.get(group, 0)) * (weights + weight * (group not in busy)) / weight
                )
            deadline = waiter.requested_at + (fair + 1) * quantum if fair else None
            if starving if deadline is None else reached(deadline):
                return (False, 0.0, False, 0.0, waiter.requested_at)  # overdue: oldest first
            account = accounts.get(group)
            charged = 0.0 if account is None else account.charged_s
            meter = state.usage.get(gpu.uuid)
            used = 0.0 if starving or meter is None else meter.at(now)
            return (True, charged, not starving, used, waiter.requested_at)

        return key

    def turn_goes_on(
        self,
        gpu: GpuState,
        holder: int,
        best: int,
        order: Callable[[int], tuple[Any, ...]],
        clients: dict[int, ClientState],
        turn_s: float,
    ) -> bool:
        """Whether the turn holder, its turn over, keeps the turn for another of turn_s:
        its group, charged that turn, would still be charged no more than the best
        waiter's, which is of another group and not overdue.  (A group of weight 2
        beside a group of weight 1, one client each, must take two turns in a row:
        there is nobody else of its group to take the second.  Without the turn's own
        charge, a holder a hair behind took a second turn, and the other the same.)
        `order` is this look's turn_order()."""
        settings = gpu.settings
        if settings.share_by is ShareBy.PROCESS:
            return False
        key = order(best)
        in_time, theirs = bool(key[0]), float(key[1])
        mine = group_of(clients[holder], settings.share_by)
        if not in_time or mine == group_of(clients[best], settings.share_by):
            return False
        account = self._accounts[gpu.uuid].get(mine)
        if account is None or theirs <= 0.0:
            return False
        return account.charged_s + turn_s / self.weight(settings, mine) <= theirs

    # ------------------------------------------------------------ counters

    def joined(self, gpu: GpuState, client: int, state: ClientState) -> None:
        """A client came to gpu: it counts in its group there from its start."""
        self._totals.join(gpu.uuid, client, group_of(state, gpu.settings.share_by))

    def settle_totals(self, gpu: GpuState, clients: dict[int, ClientState], now: float) -> None:
        """Each client on gpu counted in its group now: one that moved (its unit became
        known, share_by changed) leaves what it did so far with the group it was in.
        Gone groups past their bounds are forgotten (group_totals.py)."""
        share_by = gpu.settings.share_by
        for client in gpu.users:
            state = clients[client]
            figures = functools.partial(own_figures, state, gpu, client, now)
            self._totals.place(gpu.uuid, client, group_of(state, share_by), figures, now)
        self._totals.tidy(gpu.uuid, self._shares(gpu.settings), now)

    def client_left(self, gpu: GpuState, client: int, state: ClientState, now: float) -> None:
        """A client leaves gpu (still in its queue, if it waited: its wait counts up to
        now): what it did there stays in its group's counters."""
        self._totals.left(
            gpu.uuid,
            client,
            group_of(state, gpu.settings.share_by),
            own_figures(state, gpu, client, now),
            self._shares(gpu.settings),
            now,
        )

    # ------------------------------------------------------------ status

    def figures(
        self, gpu: GpuState, clients: dict[int, ClientState], now: float
    ) -> list[GroupFigures]:
        """Each group on gpu, each group with settings, and each gone group whose
        counters are kept (group_totals.py): (group, weight, memory cap, recent use (the
        sum of its clients'), share of the last minute, clients, GPU seconds, seconds
        waited by cause (its clients', gone ones' included))."""
        accounts = self.sync(gpu, clients, now)
        self.settle_totals(gpu, clients, now)
        totals = self._totals.read(
            gpu.uuid, lambda client: own_figures(clients[client], gpu, client, now)
        )
        settings = gpu.settings
        use: dict[str, float] = {}
        count: dict[str, int] = {}
        for client in gpu.users:
            state = clients[client]
            group = group_of(state, settings.share_by)
            meter = state.usage.get(gpu.uuid)
            use[group] = use.get(group, 0.0) + (0.0 if meter is None else meter.at(now))
            count[group] = count.get(group, 0) + 1
        rows = []
        for group in sorted(set(totals) | set(self._shares(settings))):
            share = self.share(settings, group)
            account = accounts.get(group)
            counted = totals.get(group, Tally())
            rows.append(
                (
                    group,
                    share.weight or 1,
                    share.memory_cap_bytes or 0,
                    round(use.get(group, 0.0), 3),
                    round(0.0 if account is None else account.minute_share(now), 3),
                    count.get(group, 0),
                    round(counted.gpu_s, 6),
                    rounded_waits(counted.waited_s),
                )
            )
        return rows

    # ------------------------------------------------------------ memory caps

    def memory_caps(
        self, gpus: Iterable[GpuState], clients: dict[int, ClientState]
    ) -> list[Action]:
        """MEMORY_CAP for each client on these GPUs whose cap, or what its group's
        other clients hold, changed since it was last told, to shims that take it.
        Its own allocations are the shim's to count."""
        actions: list[Action] = []
        for gpu in gpus:
            settings = gpu.settings
            held: dict[str, int] = {}
            groups: dict[int, str] = {}
            for client in gpu.users:
                state = clients[client]
                group = groups[client] = group_of(state, settings.share_by)
                held[group] = held.get(group, 0) + _holds(state, gpu.uuid)
            told_here = self._caps_sent.setdefault(gpu.uuid, {})
            for client in [c for c in told_here if c not in groups]:
                del told_here[client]  # gone from the GPU
            for client, group in groups.items():
                state = clients[client]
                if not state.features & FEATURE_MEMORY_CAP:
                    continue
                cap = self.share(settings, group).memory_cap_bytes or 0
                others = held[group] - _holds(state, gpu.uuid) if cap else 0
                if told_here.get(client, (0, 0)) != (cap, others):
                    told_here[client] = (cap, others)
                    actions.append(SendMemoryCap(client, state.pid, gpu.uuid, cap, others, group))
        return actions


def own_figures(state: ClientState, gpu: GpuState, client: int, now: float) -> Tally:
    """A client's own figures on gpu so far, as its status shows them."""
    waited = waited_of(state, gpu.waiters.get(client), gpu.uuid, now)
    return Tally(gpu_seconds_of(state, gpu.uuid, now), waited)


def _holds(state: ClientState, uuid: bytes) -> int:
    return state.managed.get(uuid, 0) + state.unmanaged.get(uuid, 0)
