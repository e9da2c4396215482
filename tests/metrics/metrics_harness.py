"""The exporter run as a real process, as systemd runs it: one connection as its
standard input and output.  Either a socket pair (one end is the process's
stdin and stdout, the test holds the other), or systemd-socket-activate
--accept --inetd on a TCP port of 127.0.0.1, which starts one process per
connection as nvshare-metrics.socket does."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

TIMEOUT_S = 30.0
# Where no bus is: the exporter answers nvshare_agent_up 0.
NO_BUS = "unix:path=/nonexistent/nvshare-test-bus"


def exporter_command(bus_address: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "nvshare_metrics", "--bus", bus_address, *extra]


@dataclass
class Answer:
    raw: bytes
    log: str  # the exporter's stderr
    returncode: int
    seconds: float  # from the request sent to the connection closed
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def __post_init__(self):
        if not self.raw:
            return
        head, _, self.body = self.raw.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("ascii").split("\r\n")
        version, code, _reason = status_line.split(" ", 2)
        assert version == "HTTP/1.1", status_line
        self.status = int(code)
        for line in lines:
            name, _, value = line.partition(":")
            self.headers[name.lower()] = value.strip()
        assert int(self.headers["content-length"]) == len(self.body) or not self.body

    @property
    def log_lines(self) -> list[str]:
        return self.log.splitlines()


def exchange(
    command: list[str],
    request: bytes,
    *,
    env: dict | None = None,
    trickle_s: float = 0.0,
    shut_write: bool = False,
) -> Answer:
    """Send `request` (a byte every trickle_s when given) on a socket pair whose
    other end is the exporter's stdin and stdout; read until it closes."""
    ours, theirs = socket.socketpair()
    with ours:
        process = subprocess.Popen(
            command, stdin=theirs, stdout=theirs, stderr=subprocess.PIPE, env=env
        )
        theirs.close()
        began = time.monotonic()
        ours.settimeout(TIMEOUT_S)
        try:
            if trickle_s:
                for byte in request:
                    ours.sendall(bytes([byte]))
                    time.sleep(trickle_s)
            else:
                ours.sendall(request)
            if shut_write:
                ours.shutdown(socket.SHUT_WR)
        except OSError:  # it closed while we were still sending: read what it said
            pass
        raw = read_until_closed(ours)
        seconds = time.monotonic() - began
        _, log = process.communicate(timeout=TIMEOUT_S)
    return Answer(raw, log.decode(errors="replace"), process.returncode, seconds)


def read_until_closed(connection: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = connection.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def get(path: str = "/metrics", accept: str = "", method: str = "GET") -> bytes:
    headers = "Host: 127.0.0.1:9402\r\nUser-Agent: nvshare-test\r\n"
    if accept:
        headers += f"Accept: {accept}\r\n"
    return f"{method} {path} HTTP/1.1\r\n{headers}\r\n".encode()


def samples(text: str, parse=text_string_to_metric_families) -> dict:
    """{(sample name, frozenset of labels): value} of a scrape, by prometheus_client's
    parser, a bucket's "le" as a number; a sample seen twice fails (Prometheus would
    drop it)."""
    found: dict = {}
    for family in parse(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            if "le" in labels:
                labels["le"] = float(labels["le"])
            key = (sample.name, frozenset(labels.items()))
            assert key not in found, f"duplicate sample {key}"
            found[key] = sample.value
    return found


class InetdListener:
    """systemd-socket-activate --accept --inetd on 127.0.0.1: one exporter process
    per connection, the connection on its stdin and stdout (Accept=yes)."""

    def __init__(self, command: list[str], log_path: Path, env: dict | None = None):
        self.command, self.log_path, self.env = command, log_path, env
        self.process: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> InetdListener:
        for _ in range(20):  # a port taken between our probe and its bind: try another
            probe = socket.socket()
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
            probe.close()
            with open(self.log_path, "wb") as log:
                self.process = subprocess.Popen(
                    [
                        "systemd-socket-activate",
                        "--accept",
                        "--inetd",
                        "--listen",
                        f"127.0.0.1:{self.port}",
                        *self.command,
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                )
            deadline = time.monotonic() + TIMEOUT_S
            while time.monotonic() < deadline and self.process.poll() is None:
                if re.search(rb"Listening on \S+ as 3", self.log_path.read_bytes()):
                    return self
                time.sleep(0.02)
            self.stop()
        raise AssertionError(f"systemd-socket-activate did not listen: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def connect(self) -> socket.socket:
        connection = socket.create_connection(("127.0.0.1", self.port), timeout=TIMEOUT_S)
        return connection

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=TIMEOUT_S)


def other_env(**extra: str) -> dict:
    return {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **extra}
