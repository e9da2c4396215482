"""How many shim connections the agent keeps open, per uid and in all.

The socket is mode 0666 on purpose (every CUDA process, whatever its user,
must reach it), so any local user can open connections, and each costs the
agent a file descriptor.  Unbounded, one user could take them all: then a real
CUDA process's connect() still succeeds, into the listen backlog, and it hangs
there waiting for a grant that never comes.  So a connection over a limit is
accepted and closed at once with an ERROR frame: its shim says why in one line
and runs unscheduled, as it does whenever it loses the agent.

Pure bookkeeping: the socket adapter passes in the fd limit and the time.
"""

from __future__ import annotations

# A user may legitimately run hundreds of CUDA processes (one connection each).
PER_UID_LIMIT = 1024
TOTAL_LIMIT = 16384
# Kept free below RLIMIT_NOFILE for the agent's own fds: stdio, the listening
# socket, epoll and its wake-up pipe, D-Bus, NVML's child process pipes, the log.
FD_RESERVE = 64
# A line that would repeat (a refusal, per uid; an accept error) is logged at
# most this often, so a user hammering the socket cannot flood the journal.
REPEAT_LOG_INTERVAL_S = 60.0


def total_limit(fd_soft_limit: int) -> int:
    """Connections allowed in all, under a RLIMIT_NOFILE soft limit (-1: unlimited)."""
    if fd_soft_limit < 0:
        return TOTAL_LIMIT
    return max(1, min(TOTAL_LIMIT, fd_soft_limit - FD_RESERVE))


class ConnectionCounts:
    """Open connections per uid; says when one more would be too many."""

    def __init__(self, per_uid_limit: int = PER_UID_LIMIT):
        self.per_uid_limit = per_uid_limit
        self.by_uid: dict[int, int] = {}
        self.total = 0

    def refusal(self, uid: int, fd_soft_limit: int) -> str | None:
        """None when a new connection from `uid` may stay open, else the one-line reason."""
        limit = total_limit(fd_soft_limit)
        if self.total >= limit:
            return f"too many connections to the agent ({self.total} open, the limit is {limit})"
        open_for_uid = self.by_uid.get(uid, 0)
        if open_for_uid >= self.per_uid_limit:
            return (
                f"too many connections from uid {uid} ({open_for_uid} open, "
                f"the limit per uid is {self.per_uid_limit})"
            )
        return None

    def add(self, uid: int) -> None:
        self.by_uid[uid] = self.by_uid.get(uid, 0) + 1
        self.total += 1

    def remove(self, uid: int) -> None:
        left = self.by_uid.get(uid, 0) - 1
        if left > 0:
            self.by_uid[uid] = left
        else:
            self.by_uid.pop(uid, None)
        self.total -= 1


class LogThrottle:
    """Lets one log line per key through per interval, and counts the ones it held back."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self._last: dict = {}  # key -> [time of the last line let through, lines held back since]

    def allow(self, key, now: float) -> int | None:
        """None: hold this line back.  Otherwise log it, with the returned
        number of lines held back since the last one for `key`."""
        entry = self._last.get(key)
        if entry is not None and now - entry[0] < self.interval_s:
            entry[1] += 1
            return None
        held_back = entry[1] if entry is not None else 0
        if len(self._last) >= 1024:  # keys come from peers (uids): forget the quiet ones
            self._last = {k: v for k, v in self._last.items() if now - v[0] < self.interval_s}
        self._last[key] = [now, 0]
        return held_back
