"""The systemd adapter: the listening socket (activation or bind) and sd_notify.

Socket activation follows sd_listen_fds(3): systemd passes the sockets from
fd 3 (SD_LISTEN_FDS_START) on and sets LISTEN_FDS and LISTEN_PID; the fds are
ours only if LISTEN_PID is our pid.  We unset the variables afterwards, as
sd_listen_fds(unset_environment=1) does, so child processes do not inherit them.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

import sdnotify

from . import protocol
from .eventlog import events as log

SD_LISTEN_FDS_START = 3
DEFAULT_SOCKET_PATH = Path(protocol.DEFAULT_SOCKET_PATH)
# The listen() backlog, whether the agent binds the socket or systemd passes
# it: clients that connect while the agent is busy (or out of fds) wait here.
# The kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 4096
# systemd ignores a notify datagram that does not fit its buffer
# (NOTIFY_BUFFER_MAX = PIPE_BUF, 4096 bytes), and `systemctl status` keeps
# showing the last line it took: keep STATUS= well below that.
STATUS_MAX_BYTES = 1024
# A watchdog of a few microseconds cannot be met anyway; petting it that often
# would be a busy loop.  Any WatchdogSec= of 20 ms or more is still met.
MIN_WATCHDOG_INTERVAL_S = 0.01
MAX_SOCKET_PATH_BYTES = 107  # sockaddr_un.sun_path holds 108, the terminating NUL included


class SocketSetupError(Exception):
    """One line saying why we cannot listen."""


def socket_from_systemd() -> socket.socket | None:
    """The first socket systemd passed us, or None when not socket-activated."""
    try:
        pid = int(os.environ.get("LISTEN_PID", ""))
        count = int(os.environ.get("LISTEN_FDS", ""))
    except ValueError:
        return None
    finally:
        for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            os.environ.pop(name, None)
    if pid != os.getpid() or count < 1:
        return None
    if count > 1:
        log.warning("systemd passed %d sockets; using fd %d only", count, SD_LISTEN_FDS_START)
    try:
        sock = socket.socket(fileno=SD_LISTEN_FDS_START)
    except OSError as e:  # closed, or a file: a unit or wrapper that got LISTEN_FDS wrong
        raise SocketSetupError(
            f"fd {SD_LISTEN_FDS_START} from systemd is not a socket ({e.strerror})"
        ) from None
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
        raise SocketSetupError(f"fd {SD_LISTEN_FDS_START} from systemd is not a UNIX stream socket")
    os.set_inheritable(sock.fileno(), False)
    # The unit's Backlog= holds while no agent runs; from now on the same
    # backlog as a socket we bind ourselves.
    try:
        sock.listen(LISTEN_BACKLOG)
    except OSError as e:
        raise SocketSetupError(
            f"cannot listen on fd {SD_LISTEN_FDS_START} from systemd ({e.strerror})"
        ) from None
    return sock


def bind_socket(path: Path) -> socket.socket:
    """Listen on `path` ourselves: directory 0755, socket 0666 (every user's CUDA
    processes connect; who may change settings is the D-Bus side's business)."""
    path = Path(path)
    # bind() would say only "AF_UNIX path too long", without an errno.
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        raise SocketSetupError(
            f"cannot listen on {path}: a UNIX socket path has at most {MAX_SOCKET_PATH_BYTES} bytes"
        )
    try:
        path.parent.mkdir(parents=True, mode=0o755)
        os.chmod(path.parent, 0o755)  # mkdir's mode is filtered by the umask
    except FileExistsError:
        pass
    except OSError as e:
        raise SocketSetupError(f"cannot create {path.parent}: {e.strerror}") from None
    _remove_stale_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        os.chmod(path, 0o666)
        sock.listen(LISTEN_BACKLOG)
    except OSError as e:
        sock.close()
        raise SocketSetupError(f"cannot listen on {path}: {e.strerror or e}") from None
    return sock


def _remove_stale_socket(path: Path) -> None:
    """A socket file left by a dead agent blocks bind(); one that answers is a live agent."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:  # e.g. a parent that is a file
        raise SocketSetupError(f"cannot check {path}: {e.strerror}") from None
    if not stat.S_ISSOCK(mode):
        raise SocketSetupError(f"{path} exists and is not a socket; not touching it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError as e:
        if e.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise SocketSetupError(f"cannot check {path}: {e.strerror}") from None
        os.unlink(path)
    else:
        raise SocketSetupError(f"another agent is already listening on {path}")
    finally:
        probe.close()


class Notifier:
    """sd_notify(3) messages; silent no-ops when NOTIFY_SOCKET is unset."""

    def __init__(self):
        self.enabled = bool(os.environ.get("NOTIFY_SOCKET"))
        self._notifier = sdnotify.SystemdNotifier() if self.enabled else None
        self._last_status = None

    def ready(self) -> None:
        self._send("READY=1")

    def stopping(self) -> None:
        self._send("STOPPING=1")

    def watchdog(self) -> None:
        self._send("WATCHDOG=1")

    def status(self, line: str) -> None:
        line = " ".join(line.split())  # STATUS= is one line
        if line != self._last_status:
            self._last_status = line
            self._send(f"STATUS={line}")

    def _send(self, message: str) -> None:
        if self._notifier is not None:
            self._notifier.notify(message)


def watchdog_interval_s() -> float | None:
    """Half of WATCHDOG_USEC (the sd_watchdog_enabled(3) advice), or None."""
    try:
        usec = int(os.environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    watchdog_pid = os.environ.get("WATCHDOG_PID")
    if usec <= 0 or (watchdog_pid and watchdog_pid != str(os.getpid())):
        return None
    return max(usec / 2e6, MIN_WATCHDOG_INTERVAL_S)
