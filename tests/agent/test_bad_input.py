"""Malformed or hostile input closes that one connection; the agent serves on."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
from agent_harness import GPU0, ShimClient, wait_until

from nvshare_agent import protocol
from nvshare_agent.protocol import ErrorCode, MessageType


def assert_still_serves(agent):
    with ShimClient(agent.socket_path) as good:
        good.request()
        grant = good.wait_grant()
        good.release(grant)
    assert agent.alive()


def closed_with(agent, frames: bytes, hello: bool = True) -> protocol.Error | None:
    with ShimClient(agent.socket_path, hello=hello) as c:
        try:
            c.send_raw(frames)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return c.expect_closed()


def lock_frame(msg_type=MessageType.LOCK_REQUEST) -> bytes:
    return protocol.encode_lock(msg_type, GPU0)


@pytest.mark.parametrize(
    "frame, code, reason",
    [
        (
            protocol.encode_header(MessageType.LOCK_REQUEST, 32, version=2) + bytes(32),
            ErrorCode.VERSION_MISMATCH,
            "protocol version 2, this agent speaks 1",
        ),
        (
            protocol.encode_header(MessageType.LOCK_REQUEST, 32, magic=0x12345678) + bytes(32),
            ErrorCode.BAD_MAGIC,
            "bad magic 0x12345678",
        ),
        (
            protocol.encode_header(99, 32) + bytes(32),
            ErrorCode.BAD_FRAME,
            "unknown message type 99",
        ),
        (
            protocol.encode_header(MessageType.LOCK_REQUEST, 31) + bytes(31),
            ErrorCode.BAD_FRAME,
            "LOCK_REQUEST payload of 31 bytes, expected 32",
        ),
        (protocol.encode_header(MessageType.HELLO, 4096), ErrorCode.BAD_FRAME, "the limit is 512"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", ErrorCode.BAD_MAGIC, "not an nvshare peer"),
        (
            lock_frame(MessageType.LOCK_GRANT),
            ErrorCode.PROTOCOL,
            "LOCK_GRANT is sent by the agent only",
        ),
    ],
    ids=[
        "version",
        "magic",
        "unknown-type",
        "short-payload",
        "oversized",
        "garbage",
        "agent-only-type",
    ],
)
def test_bad_frame_closes_the_connection_with_a_reason(start_agent, frame, code, reason):
    agent = start_agent()
    error = closed_with(agent, frame)
    assert error is not None and error.code == code and reason in error.text
    agent.wait_for_log(f"closing pid={os.getpid()} code={code.name} reason=.*")
    assert_still_serves(agent)


def test_version_mismatch_in_hello_is_refused(start_agent):
    agent = start_agent()
    hello = protocol.encode_hello([GPU0], "old-shim")
    bad = protocol.encode_header(
        MessageType.HELLO, protocol.PAYLOAD_BYTES[MessageType.HELLO], version=7
    )
    error = closed_with(agent, bad + hello[protocol.HEADER_BYTES :], hello=False)
    assert error.code == ErrorCode.VERSION_MISMATCH
    assert "protocol version 7" in error.text
    assert_still_serves(agent)


def test_hello_must_come_first_and_only_once(start_agent):
    agent = start_agent()
    assert closed_with(agent, lock_frame(), hello=False).code == ErrorCode.PROTOCOL
    assert "before HELLO" in agent.wait_for_log("closing .*before HELLO").group(0)
    assert closed_with(agent, protocol.encode_hello([GPU0], "again")).code == ErrorCode.PROTOCOL
    assert_still_serves(agent)


def test_hello_with_too_many_gpus_is_refused(start_agent):
    agent = start_agent()
    hello = bytearray(protocol.encode_hello([GPU0], "greedy"))
    count_at = protocol.HEADER_BYTES + protocol.ffi.offsetof("struct nvshare_hello", "gpu_count")
    hello[count_at : count_at + 4] = (protocol.MAX_GPUS + 1).to_bytes(4, sys.byteorder)
    error = closed_with(agent, bytes(hello), hello=False)
    assert error.code == ErrorCode.BAD_FRAME and "17 GPUs" in error.text
    assert_still_serves(agent)


def test_a_flood_of_frames_closes_that_connection(start_agent):
    agent = start_agent()
    error = closed_with(agent, lock_frame() * 30_000)
    assert error is not None and error.code == ErrorCode.FLOOD
    agent.wait_for_log("closing .*code=FLOOD")
    assert_still_serves(agent)


def test_fuzzed_frames_never_take_the_agent_down(start_agent):
    """10,000+ random and mutated frames over many connections, then a good client is served."""
    agent = start_agent()
    rng = random.Random(20261122)
    templates = [
        protocol.encode_hello([GPU0], "fuzz"),
        lock_frame(),
        lock_frame(MessageType.RELEASED),
        protocol.encode_memory_report(GPU0, 1 << 30),
        protocol.encode_error(1, "x"),
        protocol.encode_settings(
            anti_thrash=0, time_quantum_ms=1, idle_release_ms=1, drop_grace_ms=1
        ),
    ]
    sent = 0
    while sent < 10_000:
        frames = []
        for _ in range(rng.randint(1, 20)):
            frame = bytearray(rng.choice(templates))
            kind = rng.random()
            if kind < 0.3:
                for _ in range(rng.randint(1, 4)):
                    frame[rng.randrange(len(frame))] = rng.randrange(256)
            elif kind < 0.45:
                frame = frame[: rng.randrange(len(frame))]
            elif kind < 0.6:
                frame = bytearray(rng.randbytes(rng.randint(1, 700)))
            elif kind < 0.7:
                frame += rng.randbytes(rng.randint(1, 64))
            frames.append(bytes(frame))
        sent += len(frames)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(15)
        sock.connect(str(agent.socket_path))
        try:
            if rng.random() < 0.5:
                sock.sendall(protocol.encode_hello([GPU0], "fuzz"))
            sock.sendall(b"".join(frames))
        except (BrokenPipeError, ConnectionResetError):
            pass
        sock.close()
    assert sent >= 10_000
    wait_until(
        lambda: agent.log().count(" closing pid=") >= 500, what="the agent to reject the fuzz"
    )
    assert agent.alive()
    assert_still_serves(agent)


@pytest.mark.slow  # several seconds: make check runs it, check-fast does not
def test_many_queued_clients_and_the_holder_vanishing_together(start_agent, tmp_path):
    """The original C scheduler died of SIGPIPE here: it wrote grants to clients that had just exited."""
    agent = start_agent()
    crowd = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(os.path.dirname(__file__))!r})
        from agent_harness import ShimClient
        clients = [ShimClient({str(agent.socket_path)!r}) for _ in range(60)]
        for c in clients:
            c.request()
        clients[0].wait_grant()
        print("ready", flush=True)
        sys.stdin.readline()
        os.kill(os.getpid(), signal.SIGKILL)   # every socket closes at once, unread grants pending
    """)
    for _round in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", crowd], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout.readline().strip() == "ready"
        wait_until(
            lambda: agent.log().count(" connect pid=%d " % proc.pid) >= 60, what="60 clients"
        )
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.wait(15) == -signal.SIGKILL
        agent.wait_for_log(rf"disconnect pid={proc.pid}\b", count=60)
        assert agent.alive()
    assert_still_serves(agent)


def test_control_characters_in_the_command_cannot_forge_log_lines(start_agent):
    agent = start_agent()
    forged = "evil\n2026-01-01 ERROR x\x1b[2J\rtail\u202e"  # fits the 32-byte field
    with ShimClient(agent.socket_path, command=forged):
        line = agent.wait_for_log(r"connect pid=\d+ .*\n").group(0)
    assert line.count("\n") == 1 and "evil" in line and "tail" in line
    assert not any(not char.isprintable() for char in line[:-1]), repr(line)
    assert "\n2026-01-01" not in agent.log()
    assert_still_serves(agent)
