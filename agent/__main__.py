"""nvshare-agent: the node agent. `python -m nvshare_agent --help`.

Exit codes: 0 stopped cleanly, 1 cannot serve (socket), 2 bad usage.  A config
file that cannot be used is no reason to exit: the agent serves with the last good
settings and says what is wrong (settings_files.settings_at_start).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import signal
import sys
from pathlib import Path

from . import daemon, eventlog, settings_files, systemd
from .bus_address import EXAMPLE, bus_address_problem, system_bus_problem
from .text import excerpt
from .version import VersionAction


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="nvshare-agent",
        description="Schedule GPU locks for processes running under libnvshare.",
    )
    parser.add_argument(
        "--socket",
        type=Path,
        default=None,
        help="bind this path instead of taking systemd's socket or binding "
        f"{systemd.DEFAULT_SOCKET_PATH}",
    )
    parser.add_argument(
        "--bus",
        default="system",
        help="where to publish the D-Bus API: system (default), none, or a D-Bus address",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=settings_files.DEFAULT_CONFIG_PATH,
        help=f"config file (default {settings_files.DEFAULT_CONFIG_PATH})",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(
            os.environ.get("STATE_DIRECTORY", "").split(":")[0] or settings_files.DEFAULT_STATE_DIR
        ),
        help="where run-time setting changes persist (default $STATE_DIRECTORY or "
        f"{settings_files.DEFAULT_STATE_DIR})",
    )
    parser.add_argument("--debug", action="store_true", help="log every request and ignored frame")
    parser.add_argument(
        "--version",
        action=VersionAction,
        help="print the version and exit",
    )
    return parser.parse_args(argv)


def bus_option_problem(bus: str) -> str | None:
    """A mistyped address would be retried forever: it is bad usage instead."""
    if bus == "none":
        return None
    if bus == "system":
        return system_bus_problem()
    if not bus:
        return "--bus needs system, none or a D-Bus address"
    problem = bus_address_problem(bus)
    return problem and (
        f"--bus {excerpt(bus)} is not a D-Bus address ({problem}); "
        f"use system, none or an address such as {EXAMPLE}"
    )


def raise_fd_limit() -> None:
    """One fd per client: allow as many as the hard limit lets us."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass


def fail(message: str, code: int) -> int:
    """One line on stderr (the journal) and, under systemd, in the unit's status:
    `systemctl status` and nvsharectl show it after we are gone, to users who may
    not read the journal."""
    print(f"nvshare-agent: error: {message}", file=sys.stderr)
    systemd.Notifier().status(f"cannot start: {message}")
    return code


def main(argv=None) -> int:
    args = parse_args(argv)
    eventlog.setup(args.debug)
    log = eventlog.events
    store = settings_files.SettingsStore(args.state_dir)
    start = settings_files.settings_at_start(args.config, store)
    for warning in start.warnings:
        log.warning("%s", warning)
    if start.config_problem:
        log.error("config error: %s", start.config_problem)
    bus_problem = bus_option_problem(args.bus)
    if bus_problem:
        return fail(bus_problem, 2)

    # Python already ignores SIGPIPE, but say so: a client that exits while we
    # write to it must cost us an EPIPE on that connection, never the process.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    raise_fd_limit()
    # Once the socket exists, clients and systemd see us as started; a SIGTERM
    # from then until the event loop handles it must not kill us half way (the
    # socket file would stay behind): hold it back until run() takes over.
    signal.pthread_sigmask(signal.SIG_BLOCK, daemon.STOP_SIGNALS)
    try:
        listening, bound_path = daemon.open_listening_socket(args.socket)
    except systemd.SocketSetupError as e:
        return fail(str(e), 1)
    options = daemon.Options(
        socket_path=args.socket,
        bus=args.bus,
        state_dir=args.state_dir,
        settings=start.settings,
        overrides=start.overrides,
        store=store,
        config_problem=start.config_problem,
        origin=start.origin,
    )
    asyncio.run(daemon.run(options, listening, bound_path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
