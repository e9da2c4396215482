"""The engine's timers: the core's next deadline, keepalives to the shims that
wait, and change notifications coalesced for subscribers.  Each is one asyncio
timer handle at most, armed and cancelled here; what happens when it fires is
the engine's (it passes the callback in)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Protocol

from . import protocol
from .eventlog import events as log
from .protocol import Features
from .scheduler import Scheduler

# How often a waiting shim hears from the agent (the shim gives up on a silent
# agent after 3 of these: liveness).
KEEPALIVE_S = 1.0
# Subscribers hear about changes at most this often: a busy node hands locks
# over thousands of times a second, and D-Bus watchers need not see each one.
CHANGE_COALESCE_S = 0.1
_FEATURE_KEEPALIVE = int(Features.KEEPALIVE)


class KeepaliveLink(Protocol):
    features: int

    def send(self, frame: bytes) -> None: ...


class CoreTimer:
    """One timer at the core's next deadline; fire(now) runs the core's tick."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fire: Callable[[float], None]):
        self._loop = loop
        self._fire = fire
        self._handle: asyncio.TimerHandle | None = None
        self._at: float | None = None

    def arm(self, deadline: float | None) -> None:
        # An armed timer that fires too early is harmless (tick does nothing and
        # we re-arm), so only move it when the new deadline is sooner.
        if deadline is None or (self._at is not None and self._at <= deadline):
            return
        if self._handle is not None:
            self._handle.cancel()
        self._at = deadline
        self._handle = self._loop.call_at(deadline, self.fire)

    def fire(self) -> None:
        fired_for = self._at
        self._handle = self._at = None
        # asyncio runs timers up to one clock resolution early: do not let that
        # make the core think the deadline has not come yet.
        now = self._loop.time() if fired_for is None else max(self._loop.time(), fired_for)
        self._fire(now)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._at = None


class Keepalives:
    """To every shim that waits for a grant and asked for it (KEEPALIVE): "still
    here", every KEEPALIVE_S while anyone waits, so a long legitimate wait is not
    taken for a wedged agent."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        core: Scheduler,
        links: Mapping[int, KeepaliveLink],
    ):
        self._loop = loop
        self._core = core
        self._links = links  # the engine's: a client gone is not in it
        self._handle: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        """Armed when someone is queued (not by looking at every GPU after each batch of
        frames: a request's cost must not grow with the GPUs other clients named)."""
        if self._handle is None:
            self._handle = self._loop.call_later(KEEPALIVE_S, self.send)

    def send(self) -> None:
        self._handle = None
        waiting: dict[int, int] = {}
        for gpu in self._core.gpus.values():
            for client in gpu.waiters:
                waiting[client] = waiting.get(client, 0) + 1
        for client, count in waiting.items():
            link = self._links.get(client)
            if link is not None and link.features & _FEATURE_KEEPALIVE:
                link.send(protocol.encode_keepalive(count))
        if waiting:
            self.arm()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None


class ChangeNotifier:
    """Subscribers (D-Bus, systemd's status line) told that something changed,
    at most every CHANGE_COALESCE_S."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._subscribers: list[Callable[[], None]] = []
        self._handle: asyncio.TimerHandle | None = None

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """callback() runs in the loop after changes, at most every CHANGE_COALESCE_S.
        Returns an unsubscribe function."""
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    def changed(self) -> None:
        if self._subscribers and self._handle is None:
            self._handle = self._loop.call_later(CHANGE_COALESCE_S, self._notify)

    def _notify(self) -> None:
        self._handle = None
        for callback in list(self._subscribers):
            try:
                callback()
            except Exception as e:
                log.error("change subscriber failed: %s: %s", type(e).__name__, e)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = None
