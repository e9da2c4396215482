"""The accept loop on the listening socket: new shim connections in, one
asyncio transport each, handed to the socket adapter (shim_connections.py).

Our own loop instead of loop.create_unix_server, for what happens when the
agent runs out of file descriptors (EMFILE, ENFILE).  asyncio 3.11 then keeps
calling accept() for every connection waiting in the backlog, logs a traceback
for each, and schedules a retry timer for each: thousands a second, which pile
up into a busy loop and a flood of log.  Here accepting pauses for
ACCEPT_RETRY_S and one line a minute says why; the clients wait in the
backlog meanwhile.  The connection limits (connection_limits.py) keep this
from happening in the first place; it is the last line of defence.
"""

from __future__ import annotations

import asyncio
import resource
import socket

from .connection_limits import REPEAT_LOG_INTERVAL_S, LogThrottle
from .eventlog import events as log
from .shim_connections import ShimConnections

# Bounds how long one wake-up of the loop may spend accepting; the rest of a
# burst is taken on the next wake-up, after other clients' frames.
ACCEPTS_PER_WAKEUP = 128
ACCEPT_RETRY_S = 0.25


class Listener:
    def __init__(self, sock: socket.socket, connections: ShimConnections):
        self.sock = sock
        self._connections = connections
        self._loop = connections.loop
        self._retry: asyncio.TimerHandle | None = None
        self._error_log = LogThrottle(REPEAT_LOG_INTERVAL_S)

    def start(self) -> None:
        self.sock.setblocking(False)
        self._loop.add_reader(self.sock.fileno(), self._accept_ready)

    def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self.sock.fileno() >= 0:
            self._loop.remove_reader(self.sock.fileno())
            self.sock.close()

    def _accept_ready(self) -> None:
        for _ in range(ACCEPTS_PER_WAKEUP):
            try:
                conn, _address = self.sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as error:  # EMFILE, ENFILE, ENOBUFS, ENOMEM: nothing to accept with now
                self._pause(error)
                return
            conn.setblocking(False)
            self._loop.create_task(self._serve(conn))

    async def _serve(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._connections.protocol_factory, conn)
        except OSError as error:  # the peer left before we could set up its transport
            log.debug("connection lost while accepting: %s", error.strerror or error)
            conn.close()

    def _pause(self, error: OSError) -> None:
        self._loop.remove_reader(self.sock.fileno())
        self._retry = self._loop.call_later(ACCEPT_RETRY_S, self._resume)
        held_back = self._error_log.allow("accept", self._loop.time())
        if held_back is not None:
            more = f" ({held_back} more since the last such line)" if held_back else ""
            log.error(
                "cannot accept connections: %s (%d open, fd limit %d); new clients wait in the "
                "backlog, retrying every %g s%s",
                error.strerror or error,
                len(self._connections.open),
                resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                ACCEPT_RETRY_S,
                more,
            )

    def _resume(self) -> None:
        self._retry = None
        self._loop.add_reader(self.sock.fileno(), self._accept_ready)
