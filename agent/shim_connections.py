"""The socket adapter: shim connections in, engine calls; engine's frames out.

One asyncio.BufferedProtocol per connection.  Identity comes from the kernel
(SO_PEERCRED), never from a frame.  Anything malformed closes that one
connection with an ERROR frame (best effort) and one log line; the agent and
every other client carry on.  So does a connection over the connection limits
(connection_limits.py; listener.py accepts the connections).  Writes to a
peer that has vanished are handled by asyncio's transport (EPIPE/ECONNRESET
end that connection); SIGPIPE is ignored by the process (see __main__), so
many clients exiting at once cannot kill us.
"""

from __future__ import annotations

import asyncio
import os
import resource
import select
import socket
import struct

from . import protocol
from .connection_limits import REPEAT_LOG_INTERVAL_S, ConnectionCounts, LogThrottle
from .engine import Engine
from .eventlog import events as log
from .protocol import ErrorCode, FrameReader, ProtocolError
from .text import printable

# struct ucred from <sys/socket.h> (pid_t, uid_t, gid_t): the kernel's layout, not ours.
# uid_t and gid_t are unsigned: ids past 2**31 exist (user namespaces).
_UCRED = struct.Struct("iII")

# A legitimate shim sends a few thousand frames per second at most; this is a
# generous ceiling per connection, counted over one-second windows.
FLOOD_FRAMES_PER_SECOND = 20_000
# A peer that stops reading while we queue frames for it is dropped past this.
MAX_UNSENT_BYTES = 1 << 20

# asyncio's plain Protocol path calls sock.recv(256 KiB) per read: allocating
# that much per call costs ~25 us (glibc hands it out with mmap), more than
# everything else a handoff does.  So connections are BufferedProtocols that
# recv_into this one buffer; the loop is single-threaded and each read is
# consumed (copied out) before the next recv, so one buffer serves them all.
_RECV_BUFFER = memoryview(bytearray(64 * 1024))

# Asking whether a peer has hung up: one poll(2) with a zero timeout (register
# and unregister only change this object's list).  POLLRDHUP: the peer closed.
_HANG_UP_POLL = select.poll()
_HUNG_UP = select.POLLHUP | select.POLLRDHUP | select.POLLERR | select.POLLNVAL


class ShimConnection(asyncio.BufferedProtocol):
    """One shim process (or anything else that connects); the engine's ClientLink."""

    def __init__(self, connections: ShimConnections):
        self.connections = connections
        self.engine = connections.engine
        self.client_id = 0
        self.pid = self.uid = self.gid = -1
        self.greeted = False
        self.features = 0
        self.closing = False
        # Set by connection_made, before asyncio calls anything else.
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self._fd = -1
        self._reader = FrameReader()
        self._window_start = 0.0
        self._window_frames = 0

    # ------------------------------------------------------------ asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        self._fd = sock.fileno()
        try:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
            self.pid, self.uid, self.gid = _UCRED.unpack(creds)
        except OSError:
            pass  # peer gone already; connection_lost follows
        self.connections.attach(self)

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
        engine = self.engine
        if messages:
            self._handle_batch(messages)
        if error is not None and not self.closing:
            engine.client_failed(self.client_id, error.code, str(error))
            engine.batch_done()

    def _handle_batch(self, messages: list) -> None:
        engine = self.engine
        now = engine.loop.time()
        if now - self._window_start >= 1.0:
            self._window_start, self._window_frames = now, 0
        self._window_frames += len(messages)
        if self._window_frames > FLOOD_FRAMES_PER_SECOND:
            engine.client_failed(
                self.client_id,
                ErrorCode.FLOOD,
                f"more than {FLOOD_FRAMES_PER_SECOND} frames in one second",
            )
            return
        client = self.client_id
        for message in messages:
            if type(message) is protocol.Hello:
                # Commands come from any process: printable before they reach a log line.
                message = protocol.Hello(message.gpus, printable(message.command), message.features)
            engine.client_message(client, message, now)
            if self.closing:
                return
        engine.batch_done()

    def connection_lost(self, exc) -> None:
        self.closing = True
        self.connections.detach(self)

    # ------------------------------------------------------------ the engine's side (ClientLink)

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
            self.connections.detach(self)

    def send_with_fd(self, frame: bytes, fd: int) -> bool:
        """frame with a descriptor (SCM_RIGHTS), where nothing is queued before it: the
        descriptor rides on the frame's first byte, so the frames before must be out.
        False: not sent (try again later)."""
        if self.closing or self._fd < 0 or self.transport.get_write_buffer_size():
            return False
        # A socket object of our own (a dup, closed at once): asyncio's is not for sending.
        with socket.socket(fileno=os.dup(self._fd)) as sock:
            try:
                sent = socket.send_fds(sock, [frame], [fd])
            except OSError:  # full (try later) or gone (connection_lost follows)
                return False
        if sent < len(frame):
            self.transport.write(frame[sent:])  # in order: nothing else was queued
        return True

    def hung_up(self) -> bool:
        """Whether the peer has closed its end, though asyncio may not have told us
        yet: when many shims exit at once, their hang-ups reach the loop over several
        turns, and a grant to one of them would only wait for its own."""
        if self.closing or self._fd < 0:
            return self.closing
        _HANG_UP_POLL.register(self._fd, select.POLLRDHUP)
        try:
            events = _HANG_UP_POLL.poll(0)
        finally:
            _HANG_UP_POLL.unregister(self._fd)
        return bool(events and events[0][1] & _HUNG_UP)

    def close_hung_up(self) -> None:
        """The engine found the peer gone (hung_up) before asyncio told us: close now,
        so that the frames it sent before it closed are never read; detach tells the
        engine, as connection_lost would have."""
        if self.closing:
            return
        self.closing = True
        self.transport.close()
        self.connections.detach(self)

    def close(self, code: int, reason: str) -> None:
        """Tell the peer why (best effort), close, and forget it at once."""
        if self.closing:
            return
        try:
            self.transport.write(protocol.encode_error(code, reason))
        except Exception:
            pass
        self.closing = True
        self.transport.close()
        self.connections.detach(self)


class ShimConnections:
    """The open shim connections: the connection limits, and the engine's links."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.loop = engine.loop
        self.open: dict[int, ShimConnection] = {}
        self.connection_counts = ConnectionCounts()
        self._refusal_log = LogThrottle(REPEAT_LOG_INTERVAL_S)

    def protocol_factory(self) -> ShimConnection:
        return ShimConnection(self)

    def attach(self, conn: ShimConnection) -> None:
        # Read each time: an admin may change the limit of the running agent (prlimit).
        fd_soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        refusal = self.connection_counts.refusal(conn.uid, fd_soft_limit)
        if refusal is not None:
            self._refuse_over_limit(conn, refusal)
            return
        self.connection_counts.add(conn.uid)
        conn.client_id = self.engine.client_connected(conn)
        self.open[conn.client_id] = conn

    def _refuse_over_limit(self, conn: ShimConnection, reason: str) -> None:
        """The ERROR frame tells the shim; one log line a minute per uid tells the admin."""
        conn.close(ErrorCode.FLOOD, reason)
        held_back = self._refusal_log.allow(conn.uid, self.loop.time())
        if held_back is not None:
            more = f" ({held_back} more refused since the last such line)" if held_back else ""
            log.warning(
                "refusing connection pid=%d uid=%d reason=%s%s", conn.pid, conn.uid, reason, more
            )

    def detach(self, conn: ShimConnection) -> None:
        if self.open.pop(conn.client_id, None) is not None:
            self.connection_counts.remove(conn.uid)
            self.engine.client_gone(conn.client_id)

    def close_all(self) -> None:
        for conn in list(self.open.values()):
            conn.closing = True
            conn.transport.close()
        self.open.clear()
