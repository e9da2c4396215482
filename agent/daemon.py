"""Wiring: the engine and its adapters, and the daemon's run loop.

The engine (engine.py) is the one place that acts; this module only creates
it and the adapters around it (the listening socket and shim connections, the
D-Bus API, systemd's notifications, the NVML readers), and stops them.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path

from . import nvml, systemd
from .engine import Engine
from .eventlog import events as log
from .listener import Listener
from .settings import Settings
from .settings_changes import describe_settings
from .settings_files import SettingsStore
from .settings_sources import SettingsOrigin
from .shim_connections import ShimConnections
from .snapshot import AgentSnapshot

STATUS_INTERVAL_S = 2.0
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
# A stop takes milliseconds; a part that does not end when cancelled is a bug,
# cancelled again every STOP_RECANCEL_S and left after STOP_LIMIT_S, well
# within the unit's TimeoutStopSec=.
STOP_RECANCEL_S = 0.2
STOP_LIMIT_S = 0.8
# How long READY=1 waits for the D-Bus API to take its name: a connection and
# two round trips, milliseconds; a bus that is slower only delays READY=1.
READY_BUS_WAIT_S = 2.0


def status_line(
    snapshot: AgentSnapshot, max_bytes: int = systemd.STATUS_MAX_BYTES, config_problem: str = ""
) -> str:
    """One line for systemd's STATUS=: a config problem first, where there is
    one (`systemctl status` shows it to an admin who never looks at the journal);
    clients, and who holds each GPU; only counts when that would be longer than
    max_bytes (clients may name GPUs and hold them shared by the hundred)."""
    if config_problem:
        problem = f"CONFIG ERROR: {config_problem}; "
        room = max_bytes - len(f"{len(snapshot.clients)} clients; 999 GPUs, 999 held, 999 waiting")
        if len(problem.encode()) > room:
            problem = problem.encode()[: max(room - 4, 0)].decode(errors="ignore") + "…; "
        return problem + status_line(snapshot, max_bytes - len(problem.encode()))
    parts = [f"{len(snapshot.clients)} clients"]
    for gpu in snapshot.gpus:
        holders = ",".join(str(p) for p in gpu.holder_pids) or "none"
        parts.append(f"{gpu.uuid[:12]} {gpu.mode} holder={holders} waiting={len(gpu.queue_pids)}")
    line = "; ".join(parts)
    if len(line.encode()) <= max_bytes:
        return line
    held = sum(1 for gpu in snapshot.gpus if gpu.holder_pids)
    waiting = sum(len(gpu.queue_pids) for gpu in snapshot.gpus)
    return (
        f"{len(snapshot.clients)} clients; {len(snapshot.gpus)} GPUs, {held} held, "
        f"{waiting} waiting"
    )


@dataclass
class Options:
    socket_path: Path | None
    bus: str
    state_dir: Path
    settings: Settings
    overrides: dict
    store: SettingsStore
    config_problem: str = ""  # the config file cannot be used: what, where, what instead
    origin: SettingsOrigin | None = None  # what the config gave: each value's source


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
    engine = Engine(options.settings, options.store, options.overrides, loop, options.origin)
    connections = ShimConnections(engine)
    listener = Listener(listening, connections)
    listener.start()
    notifier = systemd.Notifier()

    stop = asyncio.Event()
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stop.set)
    # Held back since before the socket was bound (see __main__): one that came
    # in meanwhile is delivered now, to the handler, and stops us cleanly.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    log.info("serving %s state_dir=%s", describe_settings(engine.settings), options.state_dir)
    # Everything allocated so far (modules, cffi types, the loop) lives as long
    # as the process: take it out of the collector's scans, which otherwise
    # walk it again and again while the hot path churns small objects.
    gc.collect()
    gc.freeze()
    tasks = [
        asyncio.create_task(_read_nvml(engine)),
        asyncio.create_task(_report_status(engine, notifier, options.config_problem)),
    ]
    watchdog = systemd.watchdog_interval_s()
    if watchdog:
        tasks.append(asyncio.create_task(_pet_watchdog(notifier, watchdog)))
    on_bus = asyncio.Event()
    if options.bus != "none":
        tasks.append(
            asyncio.create_task(_export_on_bus(engine, options.bus, options.config_problem, on_bus))
        )
    else:
        on_bus.set()
    # READY=1 once the D-Bus API answers too, or cannot (its first try failed or
    # is slow): `systemctl restart` then returns with the name taken, and a call
    # that waited for the name through the restart is answered by this agent
    # even when the next restart follows at once.  Sent before, a loop of
    # restarts stopped agent after agent before any took the name, and the
    # call waited through them all (issue 45).
    await _first_of(on_bus.wait(), stop.wait(), timeout_s=READY_BUS_WAIT_S)
    notifier.ready()
    notifier.status(status_line(engine.snapshot(), config_problem=options.config_problem))

    await stop.wait()
    # A second SIGTERM asks for nothing more.  Held back, it cannot kill us half
    # way once asyncio.run has put the default action back on its way out.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    log.info("stopping")
    notifier.stopping()
    listener.close()
    engine.cancel_timers()
    connections.close_all()
    engine.fair_pages.close()
    await _cancel_and_wait(tasks)
    if bound_path is not None:
        try:
            os.unlink(bound_path)
        except FileNotFoundError:
            pass
    log.flush()


async def _first_of(*waits: Coroutine, timeout_s: float) -> None:
    """Returns when the first of the waits ends, or after timeout_s."""
    waiting = [asyncio.ensure_future(wait) for wait in waits]
    try:
        await asyncio.wait(waiting, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waiting:
            wait.cancel()


async def _cancel_and_wait(tasks: list[asyncio.Task]) -> None:
    """Cancels the tasks and waits for them to end.  systemd waits TimeoutStopSec=
    and then kills, so a task that outlives its cancellation (a library that
    swallowed it, as 3.11's wait_for can) is cancelled again, said in the journal,
    and after STOP_LIMIT_S left to asyncio.run's last cancellation."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STOP_LIMIT_S
    pending = set(tasks)
    while pending:
        for task in pending:
            task.cancel()
        done, pending = await asyncio.wait(pending, timeout=STOP_RECANCEL_S)
        for task in done:
            if not task.cancelled():
                task.exception()  # each part logs its own failures
        if pending:
            names = ", ".join(sorted(_task_name(task) for task in pending))
            if loop.time() >= deadline:
                log.warning("stopping without %s, which did not end when cancelled", names)
                return
            log.warning("%s did not end when cancelled; cancelling again", names)


def _task_name(task: asyncio.Task) -> str:
    return getattr(task.get_coro(), "__qualname__", task.get_name())


async def _read_nvml(engine: Engine) -> None:
    node = await nvml.read_node()
    if node.problem or not node.gpus:
        reason = node.problem or "NVML lists no GPU"
        log.info("no GPU inventory (%s); learning GPUs from clients", reason)
        engine.inventory_missing()
        return
    engine.add_gpus(node.gpus, node.mig_uuids)
    try:
        async for readings in nvml.watch_processes():
            engine.nvml_processes(readings)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        log.warning(
            "no per-process GPU memory from NVML (%s); anti-thrash auto counts what clients "
            "report only",
            e,
        )


async def _report_status(engine: Engine, notifier: systemd.Notifier, config_problem: str) -> None:
    if not notifier.enabled:
        return
    while True:
        await asyncio.sleep(STATUS_INTERVAL_S)
        notifier.status(status_line(engine.snapshot(), config_problem=config_problem))


async def _pet_watchdog(notifier: systemd.Notifier, interval_s: float) -> None:
    while True:
        notifier.watchdog()
        await asyncio.sleep(interval_s)


async def _export_on_bus(
    engine: Engine, address: str, config_problem: str, on_bus: asyncio.Event
) -> None:
    """on_bus is set once the API is on the bus, or its first try failed."""
    try:
        from . import dbus_service
    except ImportError as e:
        on_bus.set()
        log.warning("no D-Bus API (%s); serving the shim only", e)
        return
    try:
        await dbus_service.export_on_bus(
            engine, address, config_problem=config_problem, first_try=on_bus
        )
    except asyncio.CancelledError:
        raise
    except Exception as e:
        log.warning("D-Bus API stopped (%s); serving the shim only", e)
    finally:
        on_bus.set()


__all__ = ["Options", "open_listening_socket", "run", "status_line"]
