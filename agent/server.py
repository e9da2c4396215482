"""The socket adapter: shim connections in, scheduler events; actions out, frames and log lines.

One asyncio.BufferedProtocol per connection.  Identity comes from the kernel
(SO_PEERCRED), never from a frame.  Anything malformed closes that one
connection with an ERROR frame (best effort) and one log line; the agent and
every other client carry on.  So does a connection that sends no HELLO in
time, or one over the connection limits (connection_limits.py; listener.py
accepts the connections).  Writes to a peer that has vanished are handled by
asyncio's transport (EPIPE/ECONNRESET end that connection); SIGPIPE is ignored
by the process (see __main__), so many clients exiting at once cannot kill us.
"""

from __future__ import annotations

import asyncio
import functools
import resource
import socket
import struct

from . import protocol
from . import scheduler as core
from .connection_limits import REPEAT_LOG_INTERVAL_S, ConnectionCounts, LogThrottle
from .eventlog import events as log
from .protocol import ErrorCode, FrameReader, LockMessage, MessageType, ProtocolError
from .text import printable

# struct ucred from <sys/socket.h> (pid_t, uid_t, gid_t): the kernel's layout, not ours.
# uid_t and gid_t are unsigned: ids past 2**31 exist (user namespaces).
_UCRED = struct.Struct("iII")

# A legitimate shim sends a few thousand frames per second at most; this is a
# generous ceiling per connection, counted over one-second windows.
FLOOD_FRAMES_PER_SECOND = 20_000
# A peer that stops reading while we queue frames for it is dropped past this.
MAX_UNSENT_BYTES = 1 << 20
# A shim sends HELLO right after connect(); a peer that has not within this
# long only holds an fd (and a place under the connection limits).
HELLO_TIMEOUT_S = 10.0

_GRANT_FLAGS = {True: int(protocol.GrantFlags.EXCLUSIVE), False: int(protocol.GrantFlags.SHARED)}
# Plain ints: comparing with enum members costs an attribute lookup per frame.
_LOCK_REQUEST = int(MessageType.LOCK_REQUEST)
_RELEASED = int(MessageType.RELEASED)

# asyncio's plain Protocol path calls sock.recv(256 KiB) per read: allocating
# that much per call costs ~25 us (glibc hands it out with mmap), more than
# everything else a handoff does.  So connections are BufferedProtocols that
# recv_into this one buffer; the loop is single-threaded and each read is
# consumed (copied out) before the next recv, so one buffer serves them all.
_RECV_BUFFER = memoryview(bytearray(64 * 1024))


@functools.lru_cache(maxsize=1024)
def gpu_name(raw: bytes) -> str:
    return protocol.format_uuid(raw)


class ClientConnection(asyncio.BufferedProtocol):
    """One shim process (or anything else that connects)."""

    def __init__(self, server: SocketServer):
        self.server = server
        self.client_id = 0
        self.pid = self.uid = self.gid = -1
        self.greeted = False
        self.closing = False
        self.transport: asyncio.Transport | None = None
        self.hello_timer: asyncio.TimerHandle | None = None
        self._reader = FrameReader()
        self._window_start = 0.0
        self._window_frames = 0

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        try:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
            self.pid, self.uid, self.gid = _UCRED.unpack(creds)
        except OSError:
            pass  # peer gone already; connection_lost follows
        self.server.attach(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return _RECV_BUFFER

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(bytes(_RECV_BUFFER[:nbytes]))

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        try:
            messages = self._reader.feed(data)
            error = None
        except ProtocolError as e:
            messages, error = e.messages, e
        server = self.server
        if messages:
            self._handle_batch(messages)
        if error is not None:
            self.fail(error.code, str(error))
            server.flush()

    def _handle_batch(self, messages: list) -> None:
        server = self.server
        now = server.loop.time()
        if now - self._window_start >= 1.0:
            self._window_start, self._window_frames = now, 0
        self._window_frames += len(messages)
        if self._window_frames > FLOOD_FRAMES_PER_SECOND:
            self.fail(ErrorCode.FLOOD, f"more than {FLOOD_FRAMES_PER_SECOND} frames in one second")
            return
        for message in messages:
            server.handle(self, message, now)
            if self.closing:
                return
        server.flush()

    def connection_lost(self, exc) -> None:
        self.closing = True
        self.server.detach(self)

    def send(self, frame: bytes) -> None:
        if self.closing:
            return
        transport = self.transport
        transport.write(frame)
        if transport.get_write_buffer_size() > MAX_UNSENT_BYTES:
            log.info(
                "closing pid=%d reason=peer stopped reading (%d bytes unsent)",
                self.pid,
                transport.get_write_buffer_size(),
            )
            self.closing = True
            transport.abort()
            self.server.detach(self)

    def fail(self, code: int, reason: str, *, logged: bool = True) -> None:
        """Tell the peer why (best effort), close, and forget it at once."""
        if self.closing:
            return
        if logged:
            log.info("closing pid=%d code=%s reason=%s", self.pid, ErrorCode(code).name, reason)
        try:
            self.transport.write(protocol.encode_error(code, reason))
        except Exception:
            pass
        self.closing = True
        self.transport.close()
        self.server.detach(self)


class SocketServer:
    """Routes frames into the scheduler core and carries out its actions."""

    def __init__(self, scheduler: core.Scheduler, loop: asyncio.AbstractEventLoop, on_change=None):
        self.core = scheduler
        self.loop = loop
        self.connections: dict[int, ClientConnection] = {}
        self._on_change = on_change or (lambda: None)
        self._last_client_id = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self.connection_counts = ConnectionCounts()
        self._refusal_log = LogThrottle(REPEAT_LOG_INTERVAL_S)
        self._execute = {
            core.Grant: self._grant,
            core.AskToDrop: self._ask_to_drop,
            core.Revoke: self._revoke,
            core.LockReleased: self._log_release,
            core.Queued: self._log_queued,
            core.Withdrawn: self._log_withdrawn,
            core.Ignored: self._log_ignored,
            core.SendSettings: self._send_settings,
            core.Refuse: self._refuse,
            core.Greeted: self._greeted,
            core.Gone: self._gone,
        }

    def protocol_factory(self) -> ClientConnection:
        return ClientConnection(self)

    # ------------------------------------------------------------ connections

    def attach(self, conn: ClientConnection) -> None:
        # Read each time: an admin may change the limit of the running agent (prlimit).
        fd_soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        refusal = self.connection_counts.refusal(conn.uid, fd_soft_limit)
        if refusal is not None:
            self._refuse_over_limit(conn, refusal)
            return
        self._last_client_id += 1
        conn.client_id = self._last_client_id
        self.connections[conn.client_id] = conn
        self.connection_counts.add(conn.uid)
        conn.hello_timer = self.loop.call_later(HELLO_TIMEOUT_S, self._hello_overdue, conn)
        self.core.connect(conn.client_id, conn.pid, conn.uid, conn.gid)

    def _refuse_over_limit(self, conn: ClientConnection, reason: str) -> None:
        """The ERROR frame tells the shim; one log line a minute per uid tells the admin."""
        conn.fail(ErrorCode.FLOOD, reason, logged=False)
        held_back = self._refusal_log.allow(conn.uid, self.loop.time())
        if held_back is not None:
            more = f" ({held_back} more refused since the last such line)" if held_back else ""
            log.warning(
                "refusing connection pid=%d uid=%d reason=%s%s", conn.pid, conn.uid, reason, more
            )

    def _hello_overdue(self, conn: ClientConnection) -> None:
        conn.hello_timer = None
        if not conn.greeted:
            conn.fail(ErrorCode.PROTOCOL, f"no HELLO within {HELLO_TIMEOUT_S:g} s of connecting")

    def detach(self, conn: ClientConnection) -> None:
        if self.connections.pop(conn.client_id, None) is not None:
            self.connection_counts.remove(conn.uid)
            if conn.hello_timer is not None:
                conn.hello_timer.cancel()
                conn.hello_timer = None
            self.execute(self.core.disconnect(conn.client_id, self.loop.time()))

    def close_all(self) -> None:
        for conn in list(self.connections.values()):
            conn.closing = True
            if conn.hello_timer is not None:
                conn.hello_timer.cancel()
            conn.transport.close()
        self.connections.clear()

    # ------------------------------------------------------------ frames in

    def handle(self, conn: ClientConnection, message, now: float) -> None:
        """One decoded frame from `conn`. Call flush() after a batch."""
        cid = conn.client_id
        if type(message) is LockMessage:
            if message.type == _LOCK_REQUEST:
                if log.debug_enabled:
                    log.debug("request gpu=%s pid=%d", gpu_name(message.gpu), conn.pid)
                actions = self.core.request(cid, message.gpu, now)
            elif message.type == _RELEASED:
                actions = self.core.release(cid, message.gpu, message.lease, now)
            else:
                conn.fail(
                    ErrorCode.PROTOCOL,
                    f"{MessageType(message.type).name} is sent by the agent only",
                )
                return
        elif type(message) is protocol.Hello:
            actions = self.core.hello(cid, message.gpus, printable(message.command), now)
        elif type(message) is protocol.MemoryReport:
            actions = self.core.memory_report(
                cid, message.gpu, message.managed_bytes, message.unmanaged_bytes
            )
        else:
            conn.fail(
                ErrorCode.PROTOCOL, f"{type(message).__name__.upper()} is sent by the agent only"
            )
            return
        for action in actions:
            self._execute[type(action)](action)

    def flush(self) -> None:
        """After a batch of events: re-arm the timer, tell subscribers."""
        self._arm_timer()
        self._on_change()

    def execute(self, actions: list) -> None:
        for action in actions:
            self._execute[type(action)](action)
        self.flush()

    # ------------------------------------------------------------ timer

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
        self.execute(self.core.tick(max(self.loop.time(), fired_for)))

    def cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = self._timer_at = None

    # ------------------------------------------------------------ actions out

    def _send_lock(
        self, client: int, msg_type: int, gpu: bytes, lease: int, flags: int = 0
    ) -> None:
        conn = self.connections.get(client)
        if conn is not None:
            conn.send(protocol.encode_lock(msg_type, gpu, lease, flags))

    def _grant(self, a: core.Grant) -> None:
        self._send_lock(a.client, MessageType.LOCK_GRANT, a.gpu, a.lease, _GRANT_FLAGS[a.exclusive])
        if log.info_enabled:
            log.info(
                "grant gpu=%s pid=%d lease=%d mode=%s waited_ms=%.2f",
                gpu_name(a.gpu),
                a.pid,
                a.lease,
                "exclusive" if a.exclusive else "shared",
                a.waited_s * 1e3,
            )

    def _ask_to_drop(self, a: core.AskToDrop) -> None:
        self._send_lock(a.client, MessageType.DROP_REQUEST, a.gpu, a.lease)
        log.info(
            "drop gpu=%s pid=%d lease=%d held_ms=%.1f",
            gpu_name(a.gpu),
            a.pid,
            a.lease,
            a.held_s * 1e3,
        )

    def _revoke(self, a: core.Revoke) -> None:
        self._send_lock(a.client, MessageType.REVOKED, a.gpu, a.lease)
        log.warning(
            "revoke gpu=%s pid=%d lease=%d held_ms=%.1f reason=no release within %d ms of the drop request",
            gpu_name(a.gpu),
            a.pid,
            a.lease,
            a.held_s * 1e3,
            self.core.settings.drop_grace_ms,
        )

    def _log_release(self, a: core.LockReleased) -> None:
        if not log.info_enabled:
            return
        extra = ""
        if a.drop_to_release_s is not None:
            extra = f" drop_to_release_ms={a.drop_to_release_s * 1e3:.1f}"
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

    def _log_queued(self, a: core.Queued) -> None:
        if log.debug_enabled:
            log.debug("queued gpu=%s pid=%d position=%d", gpu_name(a.gpu), a.pid, a.position)

    def _log_withdrawn(self, a: core.Withdrawn) -> None:
        if log.info_enabled:
            log.info("withdraw gpu=%s pid=%d", gpu_name(a.gpu), a.pid)

    def _log_ignored(self, a: core.Ignored) -> None:
        if log.debug_enabled:
            log.debug("ignored gpu=%s pid=%d reason=%s", gpu_name(a.gpu), a.pid, a.reason)

    def _send_settings(self, a: core.SendSettings) -> None:
        s = a.settings
        frame = protocol.encode_settings(
            anti_thrash=s.anti_thrash,
            time_quantum_ms=s.time_quantum_s * 1000,
            idle_release_ms=s.idle_release_ms,
            drop_grace_ms=s.drop_grace_ms,
        )
        if a.client is not None:
            conn = self.connections.get(a.client)
            if conn is not None:
                conn.send(frame)
            return
        for conn in list(self.connections.values()):
            if conn.greeted:
                conn.send(frame)

    def _refuse(self, a: core.Refuse) -> None:
        conn = self.connections.get(a.client)
        if conn is not None:
            conn.fail(ErrorCode.PROTOCOL, a.reason)

    def _greeted(self, a: core.Greeted) -> None:
        conn = self.connections.get(a.client)
        if conn is not None:
            conn.greeted = True
            if conn.hello_timer is not None:
                conn.hello_timer.cancel()
                conn.hello_timer = None
        log.info(
            "connect pid=%d uid=%d gid=%d command=%s gpus=%s",
            a.pid,
            a.uid,
            a.gid,
            a.command.replace(" ", "_") or "-",
            ",".join(gpu_name(g) for g in a.gpus) or "-",
        )

    def _gone(self, a: core.Gone) -> None:
        if a.greeted:
            log.info("disconnect pid=%d", a.pid)
        elif log.debug_enabled:
            log.debug("disconnect pid=%d before hello", a.pid)
