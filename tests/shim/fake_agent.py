"""A scripted agent on a real UNIX socket, for what the real agent cannot stage: one
that never answers, answers as an older agent did, grants with given flags, asks a
holder to drop when idle, withholds a grant while sending keepalives, or goes away
and comes back.  Frames are encoded and decoded with nvshare_agent.protocol.

    with FakeAgent(path, answer="welcome") as agent:
        client = world.client(...)
        connection = agent.wait_for_connection()
        hello = connection.wait_for(protocol.Hello)
        grant = connection.wait_for_sent(protocol.MessageType.LOCK_GRANT)

Every frame received and sent is kept with its time (time.time(), the clock of the
stand-in's call log).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from nvshare_agent import protocol
from nvshare_agent.protocol import Features, GrantFlags, MessageType

TIMEOUT_S = 30.0
WELCOME_FEATURES = int(Features.GPU_MEMORY | Features.KEEPALIVE)
PATIENT_SETTINGS = dict(
    anti_thrash=1, time_quantum_ms=60_000, idle_release_ms=60_000, drop_grace_ms=20_000
)


@dataclass
class Seen:
    t: float
    message: object


def frame_type(message) -> int | None:
    """The MessageType of a decoded frame."""
    if isinstance(message, protocol.LockMessage):
        return message.type
    return {
        protocol.Hello: MessageType.HELLO,
        protocol.WireSettings: MessageType.SETTINGS,
        protocol.MemoryReport: MessageType.MEMORY_REPORT,
        protocol.Error: MessageType.ERROR,
        protocol.Welcome: MessageType.WELCOME,
        protocol.GpuMemory: MessageType.GPU_MEMORY,
        protocol.Keepalive: MessageType.KEEPALIVE,
    }.get(type(message))


class Connection:
    """One shim's connection: what came in, what went out, and the agent's script."""

    def __init__(self, agent: FakeAgent, sock: socket.socket):
        self.agent, self.sock = agent, sock
        self.accepted_at = time.time()
        self.received: list[Seen] = []
        self.sent: list[Seen] = []
        self.closed = False
        self._cond = threading.Condition()
        self._send_lock = threading.Lock()
        self._waiting: set[bytes] = set()  # GPUs with a request not yet granted
        threading.Thread(target=self._read, daemon=True).start()

    # ---- what the test does

    def send(self, data: bytes) -> None:
        message = protocol.FrameReader().feed(data)[0]
        with self._send_lock, contextlib.suppress(OSError):
            # Stamped before it goes: the shim may act on it before sendall returns here.
            sent_at = time.time()
            self.sock.sendall(data)
        with self._cond:
            self.sent.append(Seen(sent_at, message))
            self._cond.notify_all()

    def send_raw(self, data: bytes) -> None:
        """Bytes sent as they are, not decoded or kept (a frame type no shim knows)."""
        with self._send_lock, contextlib.suppress(OSError):
            self.sock.sendall(data)

    def grant(self, gpu: bytes, flags: int | None = None) -> protocol.LockMessage:
        lease = self.agent.next_lease()
        flags = self.agent.grant_flags if flags is None else flags
        grant = protocol.LockMessage(MessageType.LOCK_GRANT, gpu, lease, flags)
        with self._cond:
            self._waiting.discard(gpu)
        self.send(protocol.encode_lock(MessageType.LOCK_GRANT, gpu, lease, flags))
        if self.agent.on_grant is not None:
            self.agent.on_grant(self, grant)
        return grant

    def drop(self, grant: protocol.LockMessage, flags: int = 0, idle_ms: int = 0) -> None:
        self.send(
            protocol.encode_lock(MessageType.DROP_REQUEST, grant.gpu, grant.lease, flags, idle_ms)
        )

    def wait_for(self, kind, timeout: float = TIMEOUT_S, count: int = 1) -> Seen:
        """The count-th frame received of a type (a MessageType or a protocol class)."""
        return self._wait(self.received, kind, timeout, count, "received")

    def wait_for_sent(self, kind, timeout: float = TIMEOUT_S, count: int = 1) -> Seen:
        return self._wait(self.sent, kind, timeout, count, "sent")

    def all(self, kind) -> list[Seen]:
        with self._cond:
            return [seen for seen in self.received if _is(seen.message, kind)]

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()

    # ---- the script

    def _wait(self, frames, kind, timeout, count, what) -> Seen:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [seen for seen in frames if _is(seen.message, kind)]
                if len(found) >= count:
                    return found[count - 1]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"no {kind} {what} within {timeout} s; received "
                        f"{[type(s.message).__name__ for s in self.received]}"
                    )
                self._cond.wait(left)

    def _read(self) -> None:
        reader = protocol.FrameReader()
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            try:
                messages = reader.feed(data)
            except protocol.ProtocolError as error:
                messages = error.messages
            now = time.time()
            for message in messages:
                with self._cond:
                    self.received.append(Seen(now, message))
                    self._cond.notify_all()
                self._react(message)
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def _react(self, message) -> None:
        agent = self.agent
        if isinstance(message, protocol.Hello):
            if agent.answer in ("settings", "welcome"):
                self.send(protocol.encode_settings(**agent.settings))
            if agent.answer == "welcome":
                self.send(protocol.encode_welcome(agent.features, agent.keepalive_ms))
            if agent.after_answer:
                self.send_raw(agent.after_answer)
        elif frame_type(message) == MessageType.LOCK_REQUEST and agent.grant:
            with self._cond:
                self._waiting.add(message.gpu)
            threading.Thread(target=self._grant_later, args=(message.gpu,), daemon=True).start()

    def _grant_later(self, gpu: bytes) -> None:
        agent = self.agent
        deadline = time.monotonic() + agent.grant_after_s
        while not self.closed and time.monotonic() < deadline:
            if agent.keepalive_every_s is not None:
                time.sleep(min(agent.keepalive_every_s, max(0.0, deadline - time.monotonic())))
                if time.monotonic() < deadline and not self.closed:
                    self.send(protocol.encode_keepalive(1))
            else:
                time.sleep(max(0.0, deadline - time.monotonic()))
        if not self.closed:
            self.grant(gpu)


def _is(message, kind) -> bool:
    if isinstance(kind, type):
        return isinstance(message, kind)
    return frame_type(message) == kind


class FakeAgent:
    """answer: "welcome" (SETTINGS then WELCOME, as this protocol's agents do),
    "settings" (SETTINGS only, as older agents do) or "none" (accepts, never answers).
    grant: grant every request, after grant_after_s, sending a KEEPALIVE every
    keepalive_every_s meanwhile (None: none); on_grant(connection, grant) runs after
    each grant.  after_answer: raw bytes sent right after the answer to HELLO (frames a
    newer agent might send).  accept=False listens without ever accepting."""

    def __init__(
        self,
        socket_path: Path,
        *,
        answer: str = "welcome",
        after_answer: bytes = b"",
        features: int = WELCOME_FEATURES,
        keepalive_ms: int = 1000,
        settings: dict | None = None,
        grant: bool = True,
        grant_flags: int = int(GrantFlags.EXCLUSIVE),
        grant_after_s: float = 0.0,
        keepalive_every_s: float | None = None,
        on_grant=None,
        accept: bool = True,
        backlog: int = 16,
    ):
        self.socket_path = Path(socket_path)
        self.answer, self.features, self.keepalive_ms = answer, features, keepalive_ms
        self.after_answer = after_answer
        self.settings = dict(PATIENT_SETTINGS, **(settings or {}))
        self.grant, self.grant_flags, self.grant_after_s = grant, grant_flags, grant_after_s
        self.keepalive_every_s, self.on_grant = keepalive_every_s, on_grant
        self.accept, self.backlog = accept, backlog
        self.connections: list[Connection] = []
        self.listening_since: float | None = None
        self._listener: socket.socket | None = None
        self._lease = 0
        self._cond = threading.Condition()

    def __enter__(self) -> FakeAgent:
        return self.listen()

    def __exit__(self, *exc) -> None:
        self.close()

    def next_lease(self) -> int:
        with self._cond:
            self._lease += 1
            return self._lease

    def listen(self) -> FakeAgent:
        """Creates the socket and listens (again): the time is listening_since."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.socket_path))
        listener.listen(self.backlog)
        self.listening_since = time.time()
        self._listener = listener
        if self.accept:
            threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def go_away(self, remove: bool = True) -> None:
        """Stops listening and closes every connection, as an agent that exits does."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
        for connection in list(self.connections):
            connection.close()

    def close(self) -> None:
        self.go_away()

    def wait_for_connection(self, count: int = 1, timeout: float = TIMEOUT_S) -> Connection:
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.connections) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no connection #{count} within {timeout} s")
                self._cond.wait(left)
            return self.connections[count - 1]

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            connection = Connection(self, sock)
            with self._cond:
                self.connections.append(connection)
                self._cond.notify_all()
