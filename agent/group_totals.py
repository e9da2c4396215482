"""Share groups' counters (docs/metrics.md): per GPU, the GPU time of each group's
clients and the seconds they waited, by cause, those that have left included, so
that a group's figures never go backwards when one of its processes ends.

Pure, like the rest of the core; share_groups.ShareGroups owns it and feeds it.
A group's figure is what its clients that left, or moved to another group, did
while in it (banked as they went), plus what each client in it now did since it
joined it: the client's own figures (core_state.gpu_seconds_of, waited_of) less
what they were when it joined, which is nothing for a client that was in the
group from its start.  A client moves when its unit becomes known (share_by =
unit) or share_by changes; what it did before stays with the group it did it in.
So a GPU's groups add up to what its clients did there, present and gone.

A gone group (no client left on the GPU, no settings of its own) is kept
GONE_GROUP_KEEP_S after its last client left, so that scrapes see its last
figures, and at most MAX_GONE_GROUPS of them per GPU, the longest gone forgotten
first, so that 10,000 short-lived units, or processes under share_by = process,
cannot grow the agent without bound.  A forgotten group that comes back counts
from 0 again: a new series, which Prometheus takes as a counter's reset.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass, field

# How long a gone group's counters stay: ten scrapes and more at Prometheus' usual
# intervals (15 s to a minute), so that its last figures are scraped; a user back
# within it goes on with her series.
GONE_GROUP_KEEP_S = 600.0
# Gone groups' counters kept per GPU at most: every user of a busy node, not every
# process that came and went under share_by = process.
MAX_GONE_GROUPS = 256


@dataclass(slots=True)
class Tally:
    """GPU seconds, and seconds waited by cause (policy.WaitCause's values)."""

    gpu_s: float = 0.0
    waited_s: dict[str, float] = field(default_factory=dict)

    def add(self, more: Tally) -> None:
        self.gpu_s += more.gpu_s
        for cause, seconds in more.waited_s.items():
            self.waited_s[cause] = self.waited_s.get(cause, 0.0) + seconds

    def since(self, earlier: Tally) -> Tally:
        """What these figures grew by after `earlier` (the same client's, before)."""
        grown = {c: s - earlier.waited_s.get(c, 0.0) for c, s in self.waited_s.items()}
        return Tally(self.gpu_s - earlier.gpu_s, grown)


@dataclass(slots=True)
class _Member:
    group: str
    at_join: Tally  # the client's own figures when it joined the group: none from its start


@dataclass(slots=True)
class _Group:
    banked: Tally = field(default_factory=Tally)  # its clients that left or moved, while in it
    members: int = 0


class GroupTotals:
    """Every GPU's groups' counters, and which group each client there counts in."""

    def __init__(self) -> None:
        self._groups: dict[bytes, dict[str, _Group]] = {}
        self._members: dict[bytes, dict[int, _Member]] = {}
        # Per GPU, the groups with no client left and no settings, in the order they
        # went, with when: the oldest first, to be forgotten first.
        self._gone: dict[bytes, dict[str, float]] = {}

    def join(self, uuid: bytes, client: int, group: str) -> None:
        """A client came to a GPU: it counts in `group` from its start."""
        members = self._members.setdefault(uuid, {})
        if client not in members:
            members[client] = _Member(group, Tally())
            self._enter(uuid, group)

    def place(
        self, uuid: bytes, client: int, group: str, figures: Callable[[], Tally], now: float
    ) -> None:
        """The client on this GPU is in `group` now: if it was in another, what it did
        there is banked there, and it counts here from its figures now."""
        member = self._members.get(uuid, {}).get(client)
        if member is None:
            self.join(uuid, client, group)
        elif member.group != group:
            own = figures()
            self._bank(uuid, member, own, now)
            self._members[uuid][client] = _Member(group, own)
            self._enter(uuid, group)

    def left(
        self,
        uuid: bytes,
        client: int,
        group: str,
        figures: Tally,
        configured: Container[str],
        now: float,
    ) -> None:
        """A client leaves the GPU with these figures (its own, all it did there): they
        stay with its group.  configured: the groups with settings, kept while they have
        them."""
        member = self._members.get(uuid, {}).pop(client, None)
        if member is None:  # never placed: it counted in its group from its start
            member = _Member(group, Tally())
            self._enter(uuid, group)
        self._bank(uuid, member, figures, now)
        self._forget_gone(uuid, configured, now)

    def tidy(self, uuid: bytes, configured: Container[str], now: float) -> None:
        """Gone groups past the bounds forgotten.  A gone group given settings is kept
        while it has them; one whose settings were taken away is gone from now."""
        groups = self._groups.get(uuid, {})
        gone = self._gone.setdefault(uuid, {})
        for group in [g for g in gone if g in configured]:
            del gone[group]
        for group, counted in groups.items():
            if not counted.members and group not in configured and group not in gone:
                gone[group] = now
        self._forget_gone(uuid, configured, now)

    def read(self, uuid: bytes, figures: Callable[[int], Tally]) -> dict[str, Tally]:
        """Each group's counters on the GPU, now (figures: a client's own, now)."""
        totals: dict[str, Tally] = {}
        for group, counted in self._groups.get(uuid, {}).items():
            totals[group] = Tally()
            totals[group].add(counted.banked)
        for client, member in self._members.get(uuid, {}).items():
            totals[member.group].add(figures(client).since(member.at_join))
        return totals

    def forget_gpu(self, uuid: bytes) -> None:
        self._groups.pop(uuid, None)
        self._members.pop(uuid, None)
        self._gone.pop(uuid, None)

    def _enter(self, uuid: bytes, group: str) -> None:
        self._groups.setdefault(uuid, {}).setdefault(group, _Group()).members += 1
        self._gone.get(uuid, {}).pop(group, None)  # back before it was forgotten

    def _bank(self, uuid: bytes, member: _Member, own: Tally, now: float) -> None:
        """What the member did in its group, banked there as it goes."""
        counted = self._groups[uuid][member.group]
        counted.banked.add(own.since(member.at_join))
        counted.members -= 1
        if not counted.members:
            self._gone.setdefault(uuid, {})[member.group] = now

    def _forget_gone(self, uuid: bytes, configured: Container[str], now: float) -> None:
        gone = self._gone.get(uuid, {})
        groups = self._groups.get(uuid, {})
        while gone:
            group, since = next(iter(gone.items()))
            if len(gone) <= MAX_GONE_GROUPS and now - since <= GONE_GROUP_KEEP_S:
                break
            del gone[group]
            if group not in configured:  # else kept while it has settings (tidy)
                del groups[group]
