"""Reusable test harness for anything that needs a running nvshare agent.

Other test folders (shim, D-Bus, packaging) import it like this, since the
tests tree is not a package:

    import sys, pathlib
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "agent"))
    from agent_harness import AgentProcess, ShimClient, GPU0, GPU1, wait_until

- AgentProcess(workdir, config=..., extra_args=..., env=...): runs
  `python -m nvshare_agent --socket <workdir>/scheduler.sock --bus none
  --state-dir <workdir>/state --config <workdir>/nvshare.conf` as a subprocess
  (stderr+stdout into <workdir>/agent.log); .start() waits until the socket
  accepts, .wait_for_log(regex), .stop() sends SIGTERM and returns the exit code.
  Pass bus="unix:path=..." to publish on a private bus instead of none.
- ShimClient(socket_path, gpus=(GPU0,)): a blocking fake shim built on
  nvshare_agent.protocol: .hello(), .request(gpu), .wait_grant(gpu),
  .release(grant), .expect(MessageType.X), .expect_closed(), .send_raw(bytes).
- FairShimClient: a ShimClient that announces FAIR and maps the fair pages it is sent
  (.pages, .fair_slots, .slot_state(gpu)).
- AsyncShimClient: the same over asyncio streams, for agents run in-process.
- wait_until(predicate, timeout, what): poll a condition (no timing assertions).
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nvshare_agent import protocol
from nvshare_agent.protocol import MessageType

GPU0 = protocol.parse_uuid("GPU-00000000-0000-4000-8000-00000000a000")
GPU1 = protocol.parse_uuid("GPU-00000000-0000-4000-8000-00000000a001")

# Generous: CI is a loaded 2-core machine.
TIMEOUT_S = 15.0

FAST_CONFIG = """\
[scheduler]
time_quantum = 1
anti_thrash = on
idle_release_ms = 100
drop_grace_ms = 300
"""


def wait_until(
    predicate, timeout: float = TIMEOUT_S, what: str = "a condition", interval: float = 0.01
):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


@contextlib.contextmanager
def fd_limit_at_least(wanted: int):
    """Lets this test process hold `wanted` fds (client sockets by the thousand); skips the
    test where the hard limit is lower, and puts the old limit back afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"needs an fd hard limit of {wanted}, this one is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class AgentProcess:
    def __init__(
        self,
        workdir: Path,
        *,
        config: str | None = FAST_CONFIG,
        bus: str = "none",
        extra_args: tuple = (),
        env: dict | None = None,
        socket_path: Path | None = None,
        state_dir: Path | None = None,
        debug: bool = False,
    ):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.socket_path = Path(socket_path or self.workdir / "scheduler.sock")
        self.state_dir = Path(state_dir or self.workdir / "state")
        self.config_path = self.workdir / "nvshare.conf"
        if config is not None:
            self.config_path.write_text(config)
        self.log_path = self.workdir / "agent.log"
        self.bus, self.extra_args, self.env, self.debug = bus, tuple(extra_args), env, debug
        self.process: subprocess.Popen | None = None

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "nvshare_agent",
            "--socket",
            str(self.socket_path),
            "--bus",
            self.bus,
            "--state-dir",
            str(self.state_dir),
            "--config",
            str(self.config_path),
            *self.extra_args,
        ]
        return cmd + (["--debug"] if self.debug else [])

    def start(self, wait: bool = True) -> AgentProcess:
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(self.env or {}))
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=env
            )
        if wait:
            wait_until(
                self._accepting, what=f"the agent to listen on {self.socket_path}\n{self.log()}"
            )
        return self

    def _accepting(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"agent exited with {self.process.returncode}:\n{self.log()}")
        return unix_socket_accepts(self.socket_path)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for_log(self, pattern: str, timeout: float = TIMEOUT_S, count: int = 1) -> re.Match:
        regex = re.compile(pattern)
        found = wait_until(
            lambda: len(regex.findall(self.log())) >= count and list(regex.finditer(self.log())),
            timeout,
            what=f"log line /{pattern}/ x{count}\n--- agent log ---\n{self.log()[-4000:]}",
        )
        return found[count - 1]

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.process.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def stop(self, timeout: float = TIMEOUT_S) -> int:
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise AssertionError(
                    f"agent ignored SIGTERM for {timeout} s:\n{self.log()[-4000:]}"
                )
        return self.process.returncode


def unix_socket_accepts(path) -> bool:
    """Whether something listens on the Unix socket at path: its file comes with bind(),
    and a connect before listen() is refused."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


class ShimClient:
    """A well-behaved fake shim over a blocking socket."""

    def __init__(
        self,
        socket_path,
        gpus=(GPU0,),
        command: str = "fake-shim",
        *,
        hello: bool = True,
        timeout: float = TIMEOUT_S,
        features: int = 0,
    ):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(socket_path))
        self.gpus, self.command, self.timeout = tuple(gpus), command, timeout
        self.features = features
        self.welcome: protocol.Welcome | None = None
        self.keepalives = 0
        self.reader = protocol.FrameReader()
        self.inbox: list = []
        self.settings: protocol.WireSettings | None = None
        if hello:
            self.hello()

    def hello(self) -> protocol.WireSettings:
        self.send_raw(protocol.encode_hello(self.gpus, self.command, self.features))
        self.settings = self.expect(MessageType.SETTINGS)
        return self.settings

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, gpu: bytes = GPU0) -> None:
        self.send_raw(protocol.encode_lock(MessageType.LOCK_REQUEST, gpu))

    def release(self, grant: protocol.LockMessage) -> None:
        self.send_raw(protocol.encode_lock(MessageType.RELEASED, grant.gpu, grant.lease))

    def report_memory(self, gpu: bytes, managed: int, unmanaged: int = 0) -> None:
        self.send_raw(protocol.encode_memory_report(gpu, managed, unmanaged))

    def report_gpu_memory(self, gpu: bytes, total_bytes: int) -> None:
        self.send_raw(protocol.encode_gpu_memory(gpu, total_bytes))

    def recv(self, timeout: float | None = None):
        """The next message, or None at end of stream. Raises TimeoutError.  WELCOME
        and KEEPALIVE are noted (welcome, keepalives) rather than returned."""
        while True:
            while not self.inbox:
                self.sock.settimeout(self.timeout if timeout is None else timeout)
                try:
                    data = self._receive()
                except TimeoutError:
                    raise TimeoutError("no frame from the agent") from None
                except ConnectionResetError:
                    data = b""
                if not data:
                    return None
                self.inbox.extend(self.reader.feed(data))
            message = self.inbox.pop(0)
            if not _noted(self, message):
                return message

    def _receive(self) -> bytes:
        return self.sock.recv(65536)

    def expect(self, msg_type: int, timeout: float | None = None, gpu: bytes | None = None):
        message = self.recv(timeout)
        assert message is not None, (
            f"connection closed while expecting {MessageType(msg_type).name}"
        )
        got = (
            MessageType.ERROR
            if isinstance(message, protocol.Error)
            else getattr(message, "type", None)
        )
        if isinstance(message, protocol.WireSettings):
            got = MessageType.SETTINGS
        elif isinstance(message, protocol.FairSlot):
            got = MessageType.FAIR_SLOT
        assert got == msg_type, f"expected {MessageType(msg_type).name}, got {message}"
        if gpu is not None:
            assert message.gpu == gpu, f"frame for the wrong GPU: {message}"
        return message

    def wait_grant(self, gpu: bytes = GPU0, timeout: float | None = None) -> protocol.LockMessage:
        return self.expect(MessageType.LOCK_GRANT, timeout, gpu)

    def nothing_within(self, seconds: float) -> bool:
        """True when no frame arrives within `seconds` (for 'must not be granted yet')."""
        try:
            message = self.recv(seconds)
        except TimeoutError:
            return True
        self.inbox.insert(0, message) if message is not None else None
        return False

    def expect_closed(self, timeout: float | None = None) -> protocol.Error | None:
        """Reads until EOF; returns the ERROR frame the agent sent first, if any."""
        error = None
        while True:
            message = self.recv(timeout)
            if message is None:
                return error
            if isinstance(message, protocol.Error):
                error = message

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class FairShimClient(ShimClient):
    """A fake shim that announces FAIR and maps each fair page that comes with a
    FAIR_SLOT frame, as shim/fair_share.c does: .pages[gpu] is the page (an mmap),
    .fair_slots[gpu] the frame.  The FAIR_SLOT frames stay in the inbox, in order."""

    def __init__(self, socket_path, gpus=(GPU0,), **kwargs):
        self._fds: list[int] = []  # descriptors received, not yet matched to a frame
        self.pages: dict[bytes, mmap.mmap] = {}
        self.fair_slots: dict[bytes, protocol.FairSlot] = {}
        super().__init__(socket_path, gpus, features=int(protocol.Features.FAIR), **kwargs)

    def _receive(self) -> bytes:
        # Each FAIR_SLOT's descriptor rides on its first byte: in the order of the frames.
        data, fds, _, _ = socket.recv_fds(self.sock, 65536, 4)
        self._fds.extend(fds)
        return data

    def recv(self, timeout: float | None = None):
        message = super().recv(timeout)
        if isinstance(message, protocol.FairSlot):
            fd = self._fds.pop(0)
            try:
                self.pages[message.gpu] = mmap.mmap(fd, 0)
            finally:
                os.close(fd)
            self.fair_slots[message.gpu] = message
        return message

    def slot_state(self, gpu: bytes = GPU0, slot: int | None = None) -> dict:
        """The fields of a slot of gpu's page (this client's own when slot is None), as
        the shims read them: vtime_ns, seen_ns, backlogged, weight, in_use, on_gpu."""
        if slot is None:
            slot = self.fair_slots[gpu].slot
        state = protocol.derived_struct("struct nvshare_fair_state")
        names = [name for name, _ in protocol.ffi.typeof("struct nvshare_fair_state").fields]
        at = protocol.ffi.offsetof("struct nvshare_fair_page", "slots") + slot * state.size
        return dict(zip(names, state.unpack_from(self.pages[gpu], at)))

    def close(self) -> None:
        for page in self.pages.values():
            page.close()
        for fd in self._fds:
            os.close(fd)
        super().close()


def _noted(client, message) -> bool:
    """WELCOME and KEEPALIVE come unasked: keep them on the client, not in its inbox."""
    if isinstance(message, protocol.Welcome):
        client.welcome = message
        return True
    if isinstance(message, protocol.Keepalive):
        client.keepalives = getattr(client, "keepalives", 0) + 1
        return True
    return False


class AsyncShimClient:
    """The same fake shim over asyncio streams, for an agent running in the test's loop."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, gpus):
        self._reader, self._writer, self.gpus = reader, writer, tuple(gpus)
        self._frames = protocol.FrameReader()
        self.inbox: list = []
        self.settings: protocol.WireSettings | None = None
        self.welcome: protocol.Welcome | None = None
        self.keepalives = 0

    @classmethod
    async def connect(
        cls, socket_path, gpus=(GPU0,), command: str = "fake-shim", features: int = 0
    ) -> AsyncShimClient:
        reader, writer = await asyncio.open_unix_connection(str(socket_path))
        client = cls(reader, writer, gpus)
        client._writer.write(protocol.encode_hello(client.gpus, command, features))
        client.settings = await client.expect(MessageType.SETTINGS)
        return client

    def request(self, gpu: bytes = GPU0) -> None:
        self._writer.write(protocol.encode_lock(MessageType.LOCK_REQUEST, gpu))

    def release(self, grant: protocol.LockMessage, idle_ms: int = 0) -> None:
        self._writer.write(
            protocol.encode_lock(MessageType.RELEASED, grant.gpu, grant.lease, idle_ms=idle_ms)
        )

    def report_memory(self, gpu: bytes, managed: int, unmanaged: int = 0) -> None:
        self._writer.write(protocol.encode_memory_report(gpu, managed, unmanaged))

    def report_gpu_memory(self, gpu: bytes, total_bytes: int) -> None:
        self._writer.write(protocol.encode_gpu_memory(gpu, total_bytes))

    def report_usage(self, gpu: bytes, busy_us: int) -> None:
        """GPU time on gpu since HELLO, a running total (a measuring shim's GPU_USAGE)."""
        self._writer.write(protocol.encode_gpu_usage(gpu, busy_us))

    async def recv(self, timeout: float = TIMEOUT_S):
        while True:
            while not self.inbox:
                data = await asyncio.wait_for(self._reader.read(65536), timeout)
                if not data:
                    return None
                self.inbox.extend(self._frames.feed(data))
            message = self.inbox.pop(0)
            if not _noted(self, message):
                return message

    async def expect(self, msg_type: int, timeout: float = TIMEOUT_S, gpu: bytes | None = None):
        message = await self.recv(timeout)
        assert message is not None, (
            f"connection closed while expecting {MessageType(msg_type).name}"
        )
        got = getattr(message, "type", None)
        if isinstance(message, protocol.WireSettings):
            got = MessageType.SETTINGS
        elif isinstance(message, protocol.Error):
            got = MessageType.ERROR
        assert got == msg_type, f"expected {MessageType(msg_type).name}, got {message}"
        if gpu is not None:
            assert message.gpu == gpu, f"frame for the wrong GPU: {message}"
        return message

    async def wait_grant(
        self, gpu: bytes = GPU0, timeout: float = TIMEOUT_S
    ) -> protocol.LockMessage:
        return await self.expect(MessageType.LOCK_GRANT, timeout, gpu)

    async def nothing_within(self, seconds: float) -> bool:
        try:
            message = await self.recv(seconds)
        except TimeoutError:
            return True
        if message is not None:
            self.inbox.insert(0, message)
        return False

    async def close(self) -> None:
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except OSError:
            pass
