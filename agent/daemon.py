"""Wiring: the `Agent` facade (used by the D-Bus adapter) and the daemon's run loop.

Data flows one way: socket adapter -> scheduler core -> actions -> adapters.
The facade is the only way settings change at run time (nothing a shim sends
can change them); it validates, applies to the core, pushes SETTINGS to every
client, persists, and tells subscribers.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path

from . import nvml, protocol, systemd
from .eventlog import events as log
from .listener import Listener
from .scheduler import Scheduler
from .server import SocketServer, gpu_name
from .settings import Settings, SettingsError, SettingsNotSaved, SettingsStore
from .snapshot import AgentSnapshot

# Subscribers hear about changes at most this often: a busy node hands locks
# over thousands of times a second, and D-Bus watchers need not see each one.
CHANGE_COALESCE_S = 0.1
STATUS_INTERVAL_S = 2.0
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


class Agent:
    """What the adapters (socket server, D-Bus) see of the daemon: settings,
    change_settings, snapshot, subscribe."""

    def __init__(
        self,
        settings: Settings,
        store: SettingsStore,
        overrides: dict | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ):
        self._loop = loop or asyncio.get_running_loop()
        self._store = store
        self._overrides = dict(overrides or {})
        self._core = Scheduler(settings, max_gpus_per_client=protocol.MAX_GPUS, format_gpu=gpu_name)
        self.server = SocketServer(self._core, self._loop, on_change=self._changed)
        self._subscribers: list = []
        self._notify_handle: asyncio.TimerHandle | None = None

    @property
    def settings(self) -> Settings:
        return self._core.settings

    def change_settings(
        self, *, time_quantum_s: int | None = None, anti_thrash: bool | None = None
    ) -> Settings:
        """Validate, save, apply.  Raises SettingsError (a bad value) or
        SettingsNotSaved (the state file cannot be written), each one human
        sentence, and changes nothing then."""
        changes = {}
        if time_quantum_s is not None:
            changes["time_quantum_s"] = time_quantum_s
        if anti_thrash is not None:
            changes["anti_thrash"] = anti_thrash
        new = self.settings.replaced(**changes)
        # Save before applying: a change that only lasts until the next restart,
        # reported as done, would silently undo itself later.  Persist even an
        # unchanged value: the admin chose it explicitly.
        overrides = {**self._overrides, **changes}
        try:
            self._store.save_overrides(overrides)
        except OSError as e:
            reason = f"settings not changed: could not save them to {self._store.path}: {e.strerror or e}"
            log.error("%s", reason)
            raise SettingsNotSaved(reason) from None
        self._overrides = overrides
        if new != self.settings:
            self.server.execute(self._core.change_settings(new, self._loop.time()))
            log.info(
                "settings time_quantum_s=%d anti_thrash=%s idle_release_ms=%d drop_grace_ms=%d",
                new.time_quantum_s,
                "on" if new.anti_thrash else "off",
                new.idle_release_ms,
                new.drop_grace_ms,
            )
        self._changed()
        return new

    def snapshot(self) -> AgentSnapshot:
        return self._core.snapshot(self._loop.time())

    def subscribe(self, callback) -> callable:
        """callback() runs in the loop after changes (coalesced). Returns an unsubscribe function."""
        self._subscribers.append(callback)

        def unsubscribe():
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    def add_gpus(self, gpus: list[nvml.GpuInfo]) -> None:
        for gpu in gpus:
            self._core.add_gpu(gpu.uuid, gpu.name, gpu.memory_total_bytes)
        self._changed()

    def _changed(self) -> None:
        if self._subscribers and self._notify_handle is None:
            self._notify_handle = self._loop.call_later(CHANGE_COALESCE_S, self._notify_subscribers)

    def _notify_subscribers(self) -> None:
        self._notify_handle = None
        for callback in list(self._subscribers):
            try:
                callback()
            except Exception as e:
                log.error("change subscriber failed: %s: %s", type(e).__name__, e)


def status_line(snapshot: AgentSnapshot, max_bytes: int = systemd.STATUS_MAX_BYTES) -> str:
    """One line for systemd's STATUS=: clients, and who holds each GPU; only
    counts when that would be longer than max_bytes (clients may name GPUs
    and hold them shared by the hundred)."""
    parts = [f"{len(snapshot.clients)} clients"]
    for gpu in snapshot.gpus:
        holders = ",".join(str(p) for p in gpu.holder_pids) or "none"
        parts.append(f"{gpu.uuid[:12]} holder={holders} waiting={len(gpu.queue_pids)}")
    line = "; ".join(parts)
    if len(line.encode()) <= max_bytes:
        return line
    held = sum(1 for gpu in snapshot.gpus if gpu.holder_pids)
    waiting = sum(len(gpu.queue_pids) for gpu in snapshot.gpus)
    return f"{len(snapshot.clients)} clients; {len(snapshot.gpus)} GPUs, {held} held, {waiting} waiting"


@dataclass
class Options:
    socket_path: Path | None
    bus: str
    state_dir: Path
    settings: Settings
    overrides: dict
    store: SettingsStore


def open_listening_socket(socket_path: Path | None) -> tuple[socket.socket, Path | None]:
    """(socket, path we bound or None). --socket wins over systemd's fd."""
    if socket_path is None:
        sock = systemd.socket_from_systemd()
        if sock is not None:
            log.info("listening on the socket systemd passed (fd %d)", sock.fileno())
            return sock, None
        socket_path = systemd.DEFAULT_SOCKET_PATH
    sock = systemd.bind_socket(socket_path)
    log.info("listening on %s", socket_path)
    return sock, socket_path


async def run(options: Options, listening: socket.socket, bound_path: Path | None) -> None:
    loop = asyncio.get_running_loop()
    agent = Agent(options.settings, options.store, options.overrides, loop)
    listener = Listener(listening, agent.server)
    listener.start()
    notifier = systemd.Notifier()

    stop = asyncio.Event()
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stop.set)
    # Held back since before the socket was bound (see __main__): one that came
    # in meanwhile is delivered now, to the handler, and stops us cleanly.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    s = agent.settings
    log.info(
        "serving time_quantum_s=%d anti_thrash=%s idle_release_ms=%d drop_grace_ms=%d state_dir=%s",
        s.time_quantum_s,
        "on" if s.anti_thrash else "off",
        s.idle_release_ms,
        s.drop_grace_ms,
        options.state_dir,
    )
    # Everything allocated so far (modules, cffi types, the loop) lives as long
    # as the process: take it out of the collector's scans, which otherwise
    # walk it again and again while the hot path churns small objects.
    gc.collect()
    gc.freeze()
    notifier.ready()
    notifier.status(status_line(agent.snapshot()))
    tasks = [
        asyncio.create_task(_inventory(agent)),
        asyncio.create_task(_report_status(agent, notifier)),
    ]
    watchdog = systemd.watchdog_interval_s()
    if watchdog:
        tasks.append(asyncio.create_task(_pet_watchdog(notifier, watchdog)))
    if options.bus != "none":
        tasks.append(asyncio.create_task(_export_on_bus(agent, options.bus)))

    await stop.wait()
    log.info("stopping")
    notifier.stopping()
    listener.close()
    agent.server.cancel_timer()
    agent.server.close_all()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if bound_path is not None:
        try:
            os.unlink(bound_path)
        except FileNotFoundError:
            pass
    log.flush()


async def _inventory(agent: Agent) -> None:
    gpus, problem = await nvml.read_inventory()
    if problem:
        log.info("no GPU inventory (%s); learning GPUs from clients", problem)
        return
    agent.add_gpus(gpus)
    for gpu in gpus:
        log.info(
            "gpu uuid=%s name=%s memory_total_bytes=%d",
            gpu_name(gpu.uuid),
            gpu.name.replace(" ", "_"),
            gpu.memory_total_bytes,
        )


async def _report_status(agent: Agent, notifier: systemd.Notifier) -> None:
    if not notifier.enabled:
        return
    while True:
        await asyncio.sleep(STATUS_INTERVAL_S)
        notifier.status(status_line(agent.snapshot()))


async def _pet_watchdog(notifier: systemd.Notifier, interval_s: float) -> None:
    while True:
        notifier.watchdog()
        await asyncio.sleep(interval_s)


async def _export_on_bus(agent: Agent, address: str) -> None:
    try:
        from . import dbus_service
    except ImportError as e:
        log.warning("no D-Bus API (%s); serving the shim only", e)
        return
    try:
        await dbus_service.export_on_bus(agent, address)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        log.warning("D-Bus API stopped (%s); serving the shim only", e)


__all__ = [
    "Agent",
    "AgentSnapshot",
    "Options",
    "Settings",
    "SettingsError",
    "SettingsNotSaved",
    "open_listening_socket",
    "run",
]
