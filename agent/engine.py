"""The engine: the one place that acts.  It owns the scheduling core, the clock
and the core's timer, carries out every action the core returns (frames to
shims through their links, log lines), applies settings changes (validated,
saved off the event loop, then pushed to every shim), and tells subscribers
(D-Bus, systemd's status line) that something changed.

Adapters only translate: the socket adapter (shim_connections.py) turns
frames into calls of client_* here and implements ClientLink; the D-Bus
adapter (dbus_api.py) turns property reads, writes and method calls into
snapshot() and change_settings(); the NVML adapter feeds add_gpus() and
nvml_processes().  Data flows one way: adapter -> engine -> core -> actions
-> adapters; nothing reaches back into the core from inside an adapter.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable
from typing import Protocol

from . import actions as act
from . import protocol
from .eventlog import events as log
from .identity import ClientIdentity, identify
from .nvml import GpuInfo
from .protocol import ErrorCode, Features, MessageType
from .scheduler import Scheduler
from .settings import (
    AntiThrash,
    Settings,
    SettingsError,
    SettingsNotSaved,
    gpu_override_entries,
)
from .settings_files import SettingsStore, overrides_after
from .snapshot import AgentSnapshot
from .statistics import GpuStatistics

# Subscribers hear about changes at most this often: a busy node hands locks
# over thousands of times a second, and D-Bus watchers need not see each one.
CHANGE_COALESCE_S = 0.1
# What this agent announces in WELCOME, and how often a waiting shim hears
# from it (the shim gives up on a silent agent after 3 of these: liveness).
AGENT_FEATURES = int(Features.GPU_MEMORY) | int(Features.KEEPALIVE) | int(Features.USAGE)
KEEPALIVE_S = 1.0
_FEATURE_KEEPALIVE = int(Features.KEEPALIVE)

_LOCK_REQUEST = int(MessageType.LOCK_REQUEST)
_RELEASED = int(MessageType.RELEASED)
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

    def hung_up(self) -> bool:
        """The peer closed its end (cheap to ask: no read)."""

    def close(self, code: int, reason: str) -> None:
        """Tell the peer why (ERROR), close; the adapter then calls client_gone()."""

    def close_hung_up(self) -> None:
        """The peer has hung up (hung_up()): close without a word, and read nothing more of
        what it sent before; the adapter then calls client_gone()."""


class Engine:
    def __init__(
        self,
        settings: Settings,
        store: SettingsStore,
        overrides: dict | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ):
        self.loop = loop or asyncio.get_running_loop()
        self.core = Scheduler(settings, max_gpus_per_client=protocol.MAX_GPUS, format_gpu=gpu_name)
        self.links: dict[int, ClientLink] = {}
        self._store = store
        self._overrides = dict(overrides or {})
        self._settings_lock = asyncio.Lock()
        self._last_client_id = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._keepalive: asyncio.TimerHandle | None = None
        self._gone: list[int] = []
        self.identities: dict[int, ClientIdentity] = {}
        self.statistics: dict[bytes, GpuStatistics] = {}
        self._subscribers: list[Callable[[], None]] = []
        self._notify_handle: asyncio.TimerHandle | None = None
        self._execute: dict[type, Callable] = {
            act.Grant: self._grant,
            act.AskToDrop: self._ask_to_drop,
            act.Revoke: self._revoke,
            act.LockReleased: self._log_release,
            act.Queued: self._queued,
            act.Withdrawn: self._log_withdrawn,
            act.Ignored: self._log_ignored,
            act.SendSettings: self._send_settings,
            act.Refuse: self._refuse,
            act.Greeted: self._greeted,
            act.Gone: self._gone_logged,
            act.ModeChanged: self._log_mode,
            act.GpuSettingsApplied: self._log_gpu_settings,
            act.IndexSettingsUnused: self._log_index_settings_unused,
            act.SendMemoryCap: self._send_memory_cap,
        }

    # ------------------------------------------------------------ from the socket adapter

    def client_connected(self, link: ClientLink) -> int:
        self._last_client_id += 1
        client = self._last_client_id
        self.links[client] = link
        self.core.connect(client, link.pid, link.uid, link.gid, self.loop.time())
        self._arm_timer()
        return client

    def client_message(self, client: int, message, now: float) -> None:
        """One decoded frame from a shim; call batch_done() after a batch.

        A client leaves self.links the moment the engine learns it is gone, and the
        core only after that (_flush_gone): a frame for a client not in self.links
        (read after its hang-up) must not reach the core, which may have forgotten it."""
        link = self.links.get(client)
        if link is None:
            if log.debug_enabled:
                log.debug("dropped frame=%s client=%d reason=gone", type(message).__name__, client)
            return
        core = self.core
        if type(message) is protocol.LockMessage:
            if message.type == _LOCK_REQUEST:
                if log.debug_enabled:
                    log.debug("request gpu=%s pid=%d", gpu_name(message.gpu), link.pid)
                actions = core.request(client, message.gpu, now)
            elif message.type == _RELEASED:
                actions = core.release(client, message.gpu, message.lease, now, message.idle_ms)
            else:
                name = MessageType(message.type).name
                self.client_failed(client, ErrorCode.PROTOCOL, f"{name} is sent by the agent only")
                return
        elif type(message) is protocol.Hello:
            link.features = message.features
            actions = core.hello(client, message.gpus, message.command, now, message.features)
            self.execute(actions)
            if link.greeted:
                link.send(protocol.encode_welcome(AGENT_FEATURES, int(KEEPALIVE_S * 1000)))
                self.execute(core.memory_caps(client))  # after WELCOME, as docs/protocol.md says
            return
        elif type(message) is protocol.MemoryReport:
            actions = core.memory_report(
                client, message.gpu, message.managed_bytes, message.unmanaged_bytes, now
            )
        elif type(message) is protocol.GpuUsage:
            actions = core.gpu_usage(client, message.gpu, message.busy_us, now)
        elif type(message) is protocol.GpuMemory:
            actions = core.gpu_memory(client, message.gpu, message.total_bytes, now)
        else:
            name = type(message).__name__.upper()
            self.client_failed(client, ErrorCode.PROTOCOL, f"{name} is sent by the agent only")
            return
        self.execute(actions)

    def client_failed(self, client: int, code: int, reason: str) -> None:
        """A frame the peer must not send: one log line, ERROR, close."""
        link = self.links.get(client)
        if link is not None:
            log.info("closing pid=%d code=%s reason=%s", link.pid, ErrorCode(code).name, reason)
            link.close(code, reason)

    def client_gone(self, client: int) -> None:
        """The connection closed.  The core hears of it as an event a moment later,
        after the actions being carried out now, together with every other connection
        that closed in the same turn of the event loop (many waiters exiting at once),
        so that no grant goes to one of them in between.  Until then the client is in
        the core but not in self.links: frames for it are dropped (client_message),
        grants to it are not sent (_gone_before_grant)."""
        if self.links.pop(client, None) is None:
            return
        self.identities.pop(client, None)
        if not self._gone:
            self.loop.call_soon(self._flush_gone)
        self._gone.append(client)

    def _flush_gone(self) -> None:
        gone, self._gone = self._gone, []
        self.execute(self.core.disconnect_many(gone, self.loop.time()))
        self.batch_done()

    def batch_done(self) -> None:
        """After a batch of frames: re-arm the timer, tell subscribers."""
        self._arm_timer()
        self._changed()

    def close_all(self, reason: str = "agent stopping") -> None:
        self.cancel_timers()
        for link in list(self.links.values()):
            link.close(ErrorCode.PROTOCOL, reason)
        self.links.clear()

    # ------------------------------------------------------------ from NVML

    def add_gpus(self, gpus: list[GpuInfo], also_known: tuple[bytes, ...] = ()) -> None:
        now = self.loop.time()
        for uuid in also_known:
            self.core.allow_gpu(uuid)
        for gpu in gpus:
            log.info(
                "gpu uuid=%s name=%s memory_total_bytes=%d index=%s",
                gpu_name(gpu.uuid),
                gpu.name.replace(" ", "_"),
                gpu.memory_total_bytes,
                "-" if gpu.index is None else gpu.index,
            )
            self.execute(
                self.core.add_gpu(gpu.uuid, gpu.name, gpu.memory_total_bytes, now, gpu.index)
            )
        self.batch_done()

    def inventory_missing(self) -> None:
        """NVML could not be read (or lists no GPU): GPUs come from clients only."""
        self.execute(self.core.inventory_missing())

    def nvml_processes(self, readings: dict[bytes, dict[int, int]]) -> None:
        self.execute(self.core.nvml_processes(readings, self.loop.time()))
        self.batch_done()

    # ------------------------------------------------------------ control (D-Bus)

    @property
    def settings(self) -> Settings:
        return self.core.settings

    def snapshot(self) -> AgentSnapshot:
        snapshot = self.core.snapshot(self.loop.time())
        if not self.identities:
            return snapshot
        by_pid = {self.links[c].pid: who for c, who in self.identities.items() if c in self.links}
        clients = tuple(
            dataclasses.replace(c, user=who.user, unit=who.unit, container=who.container)
            if (who := by_pid.get(c.pid)) is not None
            else c
            for c in snapshot.clients
        )
        return dataclasses.replace(snapshot, clients=clients)

    def gpu_statistics(self) -> dict[str, GpuStatistics]:
        """What was done on each GPU since the agent started, by UUID."""
        return {gpu_name(uuid): stats for uuid, stats in self.statistics.items()}

    def _stats(self, gpu: bytes) -> GpuStatistics:
        stats = self.statistics.get(gpu)
        if stats is None:
            stats = self.statistics[gpu] = GpuStatistics()
        return stats

    async def change_settings(self, **changes) -> Settings:
        """Validate, save, apply.  gpu_overrides, when given, replaces every GPU's
        own settings: (GPU id, GpuOverrides) pairs.  Raises SettingsError (a bad
        value) or SettingsNotSaved (the state file cannot be written), each one
        human sentence, and changes nothing then."""
        async with self._settings_lock:  # two Sets at once must not lose one's save
            if "gpu_overrides" in changes:
                changes["gpu_overrides"] = gpu_override_entries(changes["gpu_overrides"])
            new = self.settings.replaced(**changes)
            # Save before applying: a change that only lasts until the next restart,
            # reported as done, would silently undo itself later.  Persist even an
            # unchanged node-wide value: the admin chose it explicitly.  fsync can
            # take seconds on a busy disk: not on the event loop.
            overrides = overrides_after(self._overrides, self.settings, new, changes)
            try:
                await self.loop.run_in_executor(None, self._store.save_overrides, overrides)
            except OSError as e:
                reason = (
                    f"settings not changed: could not save them to {self._store.path}: "
                    f"{e.strerror or e}"
                )
                log.error("%s", reason)
                raise SettingsNotSaved(reason) from None
            self._overrides = overrides
            if new != self.settings:
                self.execute(self.core.change_settings(new, self.loop.time()))
                log.info("settings %s", describe_settings(new))
            self.batch_done()
            return new

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """callback() runs in the loop after changes, at most every CHANGE_COALESCE_S.
        Returns an unsubscribe function."""
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    def _changed(self) -> None:
        if self._subscribers and self._notify_handle is None:
            self._notify_handle = self.loop.call_later(CHANGE_COALESCE_S, self._notify)

    def _notify(self) -> None:
        self._notify_handle = None
        for callback in list(self._subscribers):
            try:
                callback()
            except Exception as e:
                log.error("change subscriber failed: %s: %s", type(e).__name__, e)

    # ------------------------------------------------------------ timers

    def _arm_timer(self) -> None:
        deadline = self.core.next_deadline()
        # An armed timer that fires too early is harmless (tick does nothing and
        # we re-arm), so only move it when the new deadline is sooner.
        if deadline is None or (self._timer_at is not None and self._timer_at <= deadline):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self.loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        fired_for = self._timer_at
        self._timer = self._timer_at = None
        # asyncio runs timers up to one clock resolution early: do not let that
        # make the core think the deadline has not come yet.
        now = self.loop.time() if fired_for is None else max(self.loop.time(), fired_for)
        self.execute(self.core.tick(now))
        self.batch_done()

    def _arm_keepalive(self) -> None:
        """Armed when someone is queued (not by looking at every GPU after each batch of
        frames: a request's cost must not grow with the GPUs other clients named)."""
        if self._keepalive is None:
            self._keepalive = self.loop.call_later(KEEPALIVE_S, self._send_keepalives)

    def _send_keepalives(self) -> None:
        """To every shim that waits for a grant and asked for it: "still here", so a
        long legitimate wait is not taken for a wedged agent."""
        self._keepalive = None
        waiting: dict[int, int] = {}
        for gpu in self.core.gpus.values():
            for client in gpu.waiters:
                waiting[client] = waiting.get(client, 0) + 1
        for client, count in waiting.items():
            link = self.links.get(client)
            if link is not None and link.features & _FEATURE_KEEPALIVE:
                link.send(protocol.encode_keepalive(count))
        if waiting:
            self._arm_keepalive()

    def cancel_timers(self) -> None:
        for handle in (self._timer, self._keepalive, self._notify_handle):
            if handle is not None:
                handle.cancel()
        self._timer = self._timer_at = self._keepalive = self._notify_handle = None

    # ------------------------------------------------------------ actions

    def execute(self, actions: list) -> None:
        execute = self._execute
        for action in actions:
            if type(action) is act.Grant and self._gone_before_grant(action):
                continue
            execute[type(action)](action)

    def _gone_before_grant(self, grant: act.Grant) -> bool:
        """A client that is gone, or has hung up though asyncio has not told us yet,
        is not granted.  Its hang-up becomes an event like any other (client_gone):
        the core hears of it after this batch of actions, frees the lease and grants
        the next in line.  Not here: calling the core back while its actions are
        carried out would forget a client whose connection still delivers the frames
        it sent before it closed (issue 36)."""
        link = self.links.get(grant.client)
        if link is not None and not link.hung_up():
            return False
        if log.debug_enabled:
            reason = "gone" if link is None else "hung up"
            log.debug("not granted gpu=%s pid=%d reason=%s", gpu_name(grant.gpu), grant.pid, reason)
        if link is not None:
            link.close_hung_up()  # and the adapter calls client_gone()
        return True

    def _send(self, client: int, frame: bytes) -> None:
        link = self.links.get(client)
        if link is not None:
            link.send(frame)

    def _grant(self, a: act.Grant) -> None:
        self._stats(a.gpu).granted(a.waited_s)
        flags = int(protocol.GrantFlags.EXCLUSIVE if a.exclusive else protocol.GrantFlags.SHARED)
        if a.release_when_idle:
            flags |= int(protocol.GrantFlags.RELEASE_WHEN_IDLE)
        if a.short_queue:
            flags |= int(protocol.GrantFlags.SHORT_QUEUE)
        self._send(a.client, protocol.encode_lock(MessageType.LOCK_GRANT, a.gpu, a.lease, flags))
        if log.info_enabled:
            log.info(
                "grant gpu=%s pid=%d lease=%d mode=%s waited_ms=%.2f%s%s",
                gpu_name(a.gpu),
                a.pid,
                a.lease,
                "exclusive" if a.exclusive else "shared",
                a.waited_s * 1e3,
                f" role={a.role}" if a.role else "",
                f" use={a.use:.3f}" if a.use >= 0 else "",
            )

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
            self.settings.drop_grace_ms,
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
        self._arm_keepalive()
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
        for link in list(self.links.values()):
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
        self.client_failed(a.client, ErrorCode.PROTOCOL, a.reason)

    def _greeted(self, a: act.Greeted) -> None:
        link = self.links.get(a.client)
        if link is not None:
            link.greeted = True
            self._look_up_identity(a.client, a.pid, a.uid)
        log.info(
            "connect pid=%d uid=%d gid=%d command=%s gpus=%s",
            a.pid,
            a.uid,
            a.gid,
            a.command.replace(" ", "_") or "-",
            ",".join(gpu_name(g) for g in a.gpus) or "-",
        )

    def _gone_logged(self, a: act.Gone) -> None:
        if a.greeted:
            log.info("disconnect pid=%d", a.pid)
        elif log.debug_enabled:
            log.debug("disconnect pid=%d before hello", a.pid)

    def _look_up_identity(self, client: int, pid: int, uid: int) -> None:
        """User name and unit for status, read off the loop (NSS may block)."""

        def done(future: asyncio.Future[ClientIdentity]) -> None:
            if future.cancelled() or future.exception() is not None:
                return
            if client in self.links:
                who = self.identities[client] = future.result()
                self.execute(
                    self.core.identified(client, who.unit, who.container, self.loop.time())
                )
                self._changed()

        try:
            self.loop.run_in_executor(None, identify, pid, uid).add_done_callback(done)
        except RuntimeError:  # the loop's executor is shut down: stopping
            pass


def describe_settings(s: Settings) -> str:
    """The settings as one log line's key=value pairs (GPUs' own: gpu settings lines)."""
    own = ",".join(
        f"{gpu_id}:" + "+".join(f"{k}={_plain(v)}" for k, v in o.given().items())
        for gpu_id, o in s.gpu_overrides
    )
    return (
        f"time_quantum_s={s.time_quantum_s} anti_thrash={s.anti_thrash} "
        f"idle_release_ms={s.idle_release_ms} drop_grace_ms={s.drop_grace_ms} "
        f"light_wait_ms={s.light_wait_ms} min_slice_ms={s.min_slice_ms} "
        f"memory_limit_bytes={s.memory_limit_bytes} "
        f"gpu_settings={own or '-'} share_by={s.share_by} shares={_shares_text(s) or '-'}"
    )


def _shares_text(s: Settings) -> str:
    return ",".join(
        f"{group}:" + "+".join(f"{k}={v}" for k, v in share.given().items())
        for group, share in s.shares
    )


def _plain(value: object) -> object:
    return value.value if isinstance(value, AntiThrash) else value


__all__ = [
    "AGENT_FEATURES",
    "ClientLink",
    "Engine",
    "SettingsError",
    "SettingsNotSaved",
    "describe_settings",
    "gpu_name",
]
