"""One HTTP/1.x request on a connection that systemd accepted for us (inetd
style: nvshare-metrics.socket has Accept=yes and hands the connection over as
standard input and output), one answer, then the connection is closed.

Everything a client sends is bounded: the request head (request line and
headers) must arrive whole within `timeout_s` and fit MAX_HEAD_BYTES, and the
answer must be taken within the same time, so a slow or silent client
(slowloris) holds its process for at most about twice `timeout_s`.  A body is
never read: no request here has one.  systemd's MaxConnections= bounds how
many such processes there are at once, RuntimeMaxSec= how long any one lives.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

# Prometheus sends a request head of ~300 bytes; browsers and curl well under 8 KiB.
MAX_HEAD_BYTES = 8192
# Read and dropped after the answer, so that the client is not sent a reset
# (over unread bytes) before it has read the answer.
MAX_DRAIN_BYTES = 65536
DRAIN_S = 0.5

REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    505: "HTTP Version Not Supported",
}


@dataclass
class Request:
    method: str
    target: str  # as sent: the path and any query
    version: str
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names, the last one wins

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


class BadRequest(Exception):
    """The request cannot be served: `status` says why, and is answered (except 0:
    the client went away before it sent a whole request, so nobody reads an answer)."""

    def __init__(self, status: int, reason: str, request: Request | None = None):
        super().__init__(reason)
        self.status, self.reason, self.request = status, reason, request


def read_request(connection: socket.socket, timeout_s: float) -> Request:
    """The request head, read within timeout_s in all (not per read: a client
    that sends one byte a second must not keep the process forever)."""
    deadline = time.monotonic() + timeout_s
    head = b""
    while True:
        end = _head_end(head)
        if end is not None:
            break
        if len(head) > MAX_HEAD_BYTES:
            raise BadRequest(431, f"request head longer than {MAX_HEAD_BYTES} bytes")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BadRequest(408, f"no complete request head within {timeout_s:g} s")
        connection.settimeout(remaining)
        try:
            chunk = connection.recv(4096)
        except TimeoutError:
            raise BadRequest(408, f"no complete request head within {timeout_s:g} s") from None
        except OSError as error:  # a reset: the client is gone
            raise BadRequest(0, f"connection lost: {error.strerror or error}") from None
        if not chunk:
            raise BadRequest(0, "closed before a complete request head")
        head += chunk
    if end > MAX_HEAD_BYTES:
        raise BadRequest(431, f"request head longer than {MAX_HEAD_BYTES} bytes")
    return parse_head(head[:end])


def _head_end(data: bytes) -> int | None:
    """Where the head ends: the first empty line (CRLF CRLF, or bare LF LF, which
    RFC 9112 lets a server accept)."""
    ends = [i for i in (data.find(b"\r\n\r\n"), data.find(b"\n\n")) if i >= 0]
    return min(ends) if ends else None


def parse_head(head: bytes) -> Request:
    text = head.decode("latin-1")  # any octet decodes; only ASCII is compared
    request_line, *header_lines = text.replace("\r\n", "\n").split("\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or not all(parts):
        raise BadRequest(400, "request line is not METHOD TARGET HTTP-VERSION")
    method, target, version = parts
    request = Request(method, target, version)
    if not version.startswith("HTTP/"):
        raise BadRequest(400, "request line is not METHOD TARGET HTTP-VERSION", request)
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise BadRequest(505, "only HTTP/1.0 and HTTP/1.1", request)
    for line in header_lines:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise BadRequest(400, "a header line is not NAME: VALUE", request)
        request.headers[name.lower()] = value.strip()
    return request


def respond(
    connection: socket.socket,
    status: int,
    body: bytes,
    content_type: str = "text/plain; charset=utf-8",
    *,
    extra_headers: tuple[tuple[str, str], ...] = (),
    send_body: bool = True,
    timeout_s: float,
) -> None:
    """The answer, then the connection closed (Connection: close: one request per
    process).  Raises OSError when the client does not take it in time."""
    lines = [
        f"HTTP/1.1 {status} {REASONS[status]}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in extra_headers),
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
    connection.settimeout(timeout_s)  # since 3.5 a total for sendall, not per send
    connection.sendall(head + body if send_body else head)
    _close_gently(connection)


def _close_gently(connection: socket.socket) -> None:
    """Half-close, then read what the client still sends for a moment: closing
    with unread bytes (a request body we never read) makes the kernel send a
    reset, and the client may then lose the answer it has not read yet."""
    try:
        connection.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + DRAIN_S
        drained = 0
        while drained < MAX_DRAIN_BYTES:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            connection.settimeout(remaining)
            chunk = connection.recv(4096)
            if not chunk:
                break
            drained += len(chunk)
    except OSError:
        pass
