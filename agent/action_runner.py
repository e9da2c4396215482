"""Carrying out the core's actions, in order: frames to shims through their
links, a log line for each, the counters per GPU.  The engine owns one
ActionRunner and hands it every batch of actions the core returns; it never
calls the core back (a hang-up it notices becomes an event, see
_gone_before_grant)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol

from . import actions as act
from . import protocol
from .eventlog import events as log
from .protocol import ErrorCode, MessageType
from .settings import AntiThrash, Settings
from .statistics import GpuStatistics
from .timers import Keepalives

_WIRE_ANTI_THRASH = {
    AntiThrash.OFF: int(protocol.AntiThrashWire.OFF),
    AntiThrash.ON: int(protocol.AntiThrashWire.ON),
    AntiThrash.AUTO: int(protocol.AntiThrashWire.AUTO),
}


@functools.lru_cache(maxsize=1024)
def gpu_name(raw: bytes) -> str:
    return protocol.format_uuid(raw)


class ClientLink(Protocol):
    """What the engine needs of one shim connection; the socket adapter implements it."""

    pid: int
    uid: int
    gid: int
    greeted: bool
    features: int

    def send(self, frame: bytes) -> None: ...

    def send_with_fd(self, frame: bytes, fd: int) -> bool:
        """frame with a descriptor (the fair page); False: not now."""

    def hung_up(self) -> bool:
        """The peer closed its end (cheap to ask: no read)."""

    def close(self, code: int, reason: str) -> None:
        """Tell the peer why (ERROR), close; the adapter then calls client_gone()."""

    def close_hung_up(self) -> None:
        """The peer has hung up (hung_up()): close without a word, and read nothing more of
        what it sent before; the adapter then calls client_gone()."""


class ActionRunner:
    def __init__(
        self,
        links: dict[int, ClientLink],
        keepalives: Keepalives,
        settings: Callable[[], Settings],
        greeted: Callable[[int, int, int], None],
        granted: Callable[[act.Grant], None],
    ):
        self._links = links  # the engine's: a client leaves it the moment it is gone
        self._keepalives = keepalives
        self._settings = settings  # the node's now (the revoke line names its grace)
        self._greeted = greeted  # (client, pid, uid): the engine looks up who it is
        # A grant whose frame went to a live client: the engine tells its fair slot, so
        # that a client gone before its grant is never given one.
        self._granted = granted
        self.statistics: dict[bytes, GpuStatistics] = {}
        self._run: dict[type, Callable] = {
            act.Grant: self._grant,
            act.AskToDrop: self._ask_to_drop,
            act.Revoke: self._revoke,
            act.LockReleased: self._log_release,
            act.Queued: self._queued,
            act.Withdrawn: self._log_withdrawn,
            act.Ignored: self._log_ignored,
            act.SendSettings: self._send_settings,
            act.Refuse: self._refuse,
            act.Greeted: self._log_greeted,
            act.Gone: self._log_gone,
            act.ModeChanged: self._log_mode,
            act.GpuSettingsApplied: self._log_gpu_settings,
            act.IndexSettingsUnused: self._log_index_settings_unused,
            act.SendMemoryCap: self._send_memory_cap,
        }

    def run(self, actions: list) -> None:
        run = self._run
        for action in actions:
            if type(action) is act.Grant and self._gone_before_grant(action):
                continue
            run[type(action)](action)

    def close_client(self, client: int, code: int, reason: str) -> None:
        """A client that broke the protocol: one log line, ERROR, close."""
        link = self._links.get(client)
        if link is not None:
            log.info("closing pid=%d code=%s reason=%s", link.pid, ErrorCode(code).name, reason)
            link.close(code, reason)

    def _gone_before_grant(self, grant: act.Grant) -> bool:
        """A client that is gone, or has hung up though asyncio has not told us yet,
        is not granted.  Its hang-up becomes an event like any other (client_gone):
        the core hears of it after this batch of actions, frees the lease and grants
        the next in line.  Not here: calling the core back while its actions are
        carried out would forget a client whose connection still delivers the frames
        it sent before it closed (issue 36)."""
        link = self._links.get(grant.client)
        if link is not None and not link.hung_up():
            return False
        if log.debug_enabled:
            reason = "gone" if link is None else "hung up"
            log.debug("not granted gpu=%s pid=%d reason=%s", gpu_name(grant.gpu), grant.pid, reason)
        if link is not None:
            link.close_hung_up()  # and the adapter calls client_gone()
        return True

    def _stats(self, gpu: bytes) -> GpuStatistics:
        stats = self.statistics.get(gpu)
        if stats is None:
            stats = self.statistics[gpu] = GpuStatistics()
        return stats

    def _send(self, client: int, frame: bytes) -> None:
        link = self._links.get(client)
        if link is not None:
            link.send(frame)

    def _grant(self, a: act.Grant) -> None:
        self._stats(a.gpu).granted(a.waited_s)
        flags = int(protocol.GrantFlags.EXCLUSIVE if a.exclusive else protocol.GrantFlags.SHARED)
        if a.release_when_idle:
            flags |= int(protocol.GrantFlags.RELEASE_WHEN_IDLE)
        if a.short_queue:
            flags |= int(protocol.GrantFlags.SHORT_QUEUE)
        if a.displaced:
            flags |= int(protocol.GrantFlags.DISPLACED)
        self._send(a.client, protocol.encode_lock(MessageType.LOCK_GRANT, a.gpu, a.lease, flags))
        if log.info_enabled:
            log.info(
                "grant gpu=%s pid=%d lease=%d mode=%s waited_ms=%.2f%s%s%s",
                gpu_name(a.gpu),
                a.pid,
                a.lease,
                "exclusive" if a.exclusive else "shared",
                a.waited_s * 1e3,
                f" role={a.role}" if a.role else "",
                f" use={a.use:.3f}" if a.use >= 0 else "",
                " displaced=1" if a.displaced else "",
            )
        self._granted(a)

    def _ask_to_drop(self, a: act.AskToDrop) -> None:
        flags = int(protocol.DropFlags.WHEN_IDLE) if a.when_idle_ms else 0
        frame = protocol.encode_lock(
            MessageType.DROP_REQUEST, a.gpu, a.lease, flags, a.when_idle_ms
        )
        self._send(a.client, frame)
        if a.when_idle_ms:
            if log.debug_enabled:
                log.debug(
                    "yield gpu=%s pid=%d lease=%d when_idle_ms=%d reason=%s",
                    gpu_name(a.gpu),
                    a.pid,
                    a.lease,
                    a.when_idle_ms,
                    a.reason.replace(" ", "_"),
                )
            return
        self._stats(a.gpu).drops += 1
        log.info(
            "drop gpu=%s pid=%d lease=%d held_ms=%.1f reason=%s use=%.3f",
            gpu_name(a.gpu),
            a.pid,
            a.lease,
            a.held_s * 1e3,
            a.reason.replace(" ", "_") or "-",
            a.use,
        )

    def _revoke(self, a: act.Revoke) -> None:
        self._stats(a.gpu).revokes += 1
        self._send(a.client, protocol.encode_lock(MessageType.REVOKED, a.gpu, a.lease))
        log.warning(
            "revoke gpu=%s pid=%d lease=%d held_ms=%.1f reason=no release within %d ms of the drop request",
            gpu_name(a.gpu),
            a.pid,
            a.lease,
            a.held_s * 1e3,
            self._settings().drop_grace_ms,
        )

    def _log_release(self, a: act.LockReleased) -> None:
        if not log.info_enabled:
            return
        extra = ""
        if a.drop_to_release_s is not None:
            extra = f" drop_to_release_ms={a.drop_to_release_s * 1e3:.1f}"
        if a.idle_ms:
            extra += f" idle_ms={a.idle_ms}"
        if a.reason != "released":
            extra += f" reason={a.reason}"
        log.info(
            "release gpu=%s pid=%d lease=%d held_ms=%.2f%s",
            gpu_name(a.gpu),
            a.pid,
            a.lease,
            a.held_s * 1e3,
            extra,
        )

    def _queued(self, a: act.Queued) -> None:
        self._keepalives.arm()
        if log.debug_enabled:
            log.debug("queued gpu=%s pid=%d position=%d", gpu_name(a.gpu), a.pid, a.position)

    def _log_withdrawn(self, a: act.Withdrawn) -> None:
        if log.info_enabled:
            log.info("withdraw gpu=%s pid=%d", gpu_name(a.gpu), a.pid)

    def _log_ignored(self, a: act.Ignored) -> None:
        if log.debug_enabled:
            log.debug("ignored gpu=%s pid=%d reason=%s", gpu_name(a.gpu), a.pid, a.reason)

    def _log_mode(self, a: act.ModeChanged) -> None:
        capacity = "unknown" if a.capacity_bytes is None else str(a.capacity_bytes)
        log.info(
            "mode gpu=%s mode=%s demand_bytes=%d capacity_bytes=%s reason=%s",
            gpu_name(a.gpu),
            a.mode,
            a.demand_bytes,
            capacity,
            a.reason.replace(" ", "_"),
        )

    def _log_gpu_settings(self, a: act.GpuSettingsApplied) -> None:
        s = a.settings
        log.info(
            "gpu settings gpu=%s index=%s time_quantum_s=%d anti_thrash=%s "
            "memory_limit_bytes=%d own=%s",
            gpu_name(a.gpu),
            "-" if a.index is None else a.index,
            s.time_quantum_s,
            s.anti_thrash,
            s.memory_limit_bytes,
            ",".join(a.own) or "-",
        )

    def _log_index_settings_unused(self, a: act.IndexSettingsUnused) -> None:
        log.warning(
            "settings for GPU %s by NVML index apply to no GPU: there is no NVML inventory "
            "to number the GPUs (name them by UUID instead)",
            ", ".join(a.gpu_ids),
        )

    def _send_settings(self, a: act.SendSettings) -> None:
        # The shim applies idle release and drop grace, per process; the quantum and
        # the mode it only logs.  All node-wide: a GPU's own settings stay here.
        s = a.settings
        frame = protocol.encode_settings(
            anti_thrash=_WIRE_ANTI_THRASH[s.anti_thrash],
            time_quantum_ms=s.time_quantum_s * 1000,
            idle_release_ms=s.idle_release_ms,
            drop_grace_ms=s.drop_grace_ms,
        )
        if a.client is not None:
            self._send(a.client, frame)
            return
        for link in list(self._links.values()):
            if link.greeted:
                link.send(frame)

    def _send_memory_cap(self, a: act.SendMemoryCap) -> None:
        self._send(a.client, protocol.encode_memory_cap(a.gpu, a.cap_bytes, a.others_bytes))
        log.info(
            "memory cap gpu=%s pid=%d group=%s cap_bytes=%d others_bytes=%d",
            gpu_name(a.gpu),
            a.pid,
            a.group,
            a.cap_bytes,
            a.others_bytes,
        )

    def _refuse(self, a: act.Refuse) -> None:
        self.close_client(a.client, ErrorCode.PROTOCOL, a.reason)

    def _log_greeted(self, a: act.Greeted) -> None:
        link = self._links.get(a.client)
        if link is not None:
            link.greeted = True
            self._greeted(a.client, a.pid, a.uid)
        log.info(
            "connect pid=%d uid=%d gid=%d command=%s gpus=%s",
            a.pid,
            a.uid,
            a.gid,
            a.command.replace(" ", "_") or "-",
            ",".join(gpu_name(g) for g in a.gpus) or "-",
        )

    def _log_gone(self, a: act.Gone) -> None:
        if a.greeted:
            log.info("disconnect pid=%d gpu_s=%.3f", a.pid, a.gpu_seconds)
        elif log.debug_enabled:
            log.debug("disconnect pid=%d before hello", a.pid)
