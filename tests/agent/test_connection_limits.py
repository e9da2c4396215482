"""The socket is open to every local user: one of them must not be able to use
up the agent's connections or file descriptors and lock everyone else out.
Each test runs the real agent process; fd limits are lowered on it with prlimit(2)."""

from __future__ import annotations

import os
import resource
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from agent_harness import GPU0, TIMEOUT_S, AgentProcess, ShimClient, fd_limit_at_least, wait_until
from other_users import other_user_env, python_as

from nvshare_agent import protocol
from nvshare_agent.connection_limits import (
    FD_RESERVE,
    PER_UID_LIMIT,
    TOTAL_LIMIT,
    ConnectionCounts,
    LogThrottle,
    total_limit,
)
from nvshare_agent.protocol import ErrorCode
from nvshare_agent.scheduler import HELLO_TIMEOUT_S

HELLO = protocol.encode_hello([GPU0], "crowd")


@pytest.fixture
def many_fds():
    """Enough fds in this test process for a thousand and more client sockets."""
    with fd_limit_at_least(PER_UID_LIMIT + 256):
        yield


@pytest.fixture
def start_settled_agent(start_agent):
    """An agent that has forgotten the probe connection start() makes, so that
    every connection a test counts is its own."""

    def start(**kwargs) -> AgentProcess:
        agent = start_agent(debug=True, **kwargs)
        agent.wait_for_log(r"DEBUG disconnect pid=\d+ before hello")
        return agent

    return start


@pytest.fixture
def world_dir():
    """A directory every uid can reach (pytest's tmp_path is private to root)."""
    directory = Path(tempfile.mkdtemp(prefix="nvshare-limits-"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def set_fd_limit(agent: AgentProcess, soft: int) -> None:
    _, hard = resource.prlimit(agent.process.pid, resource.RLIMIT_NOFILE)
    resource.prlimit(agent.process.pid, resource.RLIMIT_NOFILE, (soft, hard))


def greeted_socket(path) -> socket.socket:
    """A client that says HELLO and does not wait for the answer (fast, for crowds)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(TIMEOUT_S)
    sock.connect(str(path))
    sock.sendall(HELLO)
    return sock


def first_frame(sock: socket.socket):
    reader = protocol.FrameReader()
    while True:
        data = sock.recv(4096)
        assert data, "closed without a frame"
        frames = reader.feed(data)
        if frames:
            return frames[0]


def say_hello(client: ShimClient) -> None:
    """HELLO, as the shim says it right after connecting.  An agent over its limits refuses
    at once and may close before the HELLO arrives: the send then fails with EPIPE, and the
    ERROR frame sent before the close is still there to read (CI saw this on a busy host)."""
    try:
        client.send_raw(HELLO)
    except BrokenPipeError:
        pass


def refusal(path) -> protocol.Error:
    with ShimClient(path, hello=False) as client:
        say_hello(client)
        error = client.expect_closed()
    assert error is not None, "closed without an ERROR frame"
    return error


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.slow
def test_a_connection_that_says_no_hello_is_closed_after_the_timeout(start_agent):
    agent = start_agent()
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(str(agent.socket_path))
    partial = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    partial.connect(str(agent.socket_path))
    partial.sendall(HELLO[:40])  # a HELLO that never ends
    started = time.monotonic()
    with ShimClient(agent.socket_path) as greeted:
        for sock in (silent, partial):
            sock.settimeout(HELLO_TIMEOUT_S + TIMEOUT_S)
            error = first_frame(sock)
            assert isinstance(error, protocol.Error) and error.code == ErrorCode.PROTOCOL
            assert error.text == f"no HELLO within {HELLO_TIMEOUT_S:g} s of connecting"
            assert sock.recv(4096) == b""
            sock.close()
        assert time.monotonic() - started >= HELLO_TIMEOUT_S - 0.5
        # A client that said HELLO may stay idle as long as it likes.
        greeted.request()
        greeted.wait_grant()
    agent.wait_for_log(r"closing pid=\d+ code=PROTOCOL reason=no HELLO within", count=2)


@pytest.mark.slow  # several seconds: make check runs it, check-fast does not
def test_connections_past_the_per_uid_limit_are_refused_but_other_users_still_connect(
    start_settled_agent, many_fds, world_dir
):
    agent = start_settled_agent(socket_path=world_dir / "scheduler.sock")
    crowd = [greeted_socket(agent.socket_path) for _ in range(PER_UID_LIMIT)]
    try:
        for sock in crowd[:8]:
            assert isinstance(first_frame(sock), protocol.WireSettings)
        for _ in range(20):
            error = refusal(agent.socket_path)
            assert error.code == ErrorCode.FLOOD
            assert error.text == (
                f"too many connections from uid {os.getuid()} ({PER_UID_LIMIT} open, "
                f"the limit per uid is {PER_UID_LIMIT})"
            )
        if os.geteuid() == 0 and shutil.which("setpriv"):
            assert isinstance(connect_as_nobody(agent), protocol.WireSettings)
        # One line for the admin, not one per refused connection.
        line = agent.wait_for_log(r"WARNING refusing connection pid=\d+ uid=\d+ reason=.*\n").group(
            0
        )
        assert "too many connections from uid" in line
        assert agent.log().count("refusing connection") == 1
        # A place that frees up is a place for the next process.
        crowd.pop().close()
        wait_until(
            lambda: refusal_or_settings(agent.socket_path), what="a free place under the limit"
        )
    finally:
        for sock in crowd:
            sock.close()


def refusal_or_settings(path):
    """The SETTINGS answer for a new client, or None when it was refused."""
    with ShimClient(path, hello=False) as client:
        say_hello(client)
        message = client.recv()
    return message if isinstance(message, protocol.WireSettings) else None


def connect_as_nobody(agent: AgentProcess):
    """The first frame the agent sends a client of another uid (nobody)."""
    script = (
        "import socket, sys; s = socket.socket(socket.AF_UNIX); s.settimeout(15); "
        "s.connect(sys.argv[1]); s.sendall(bytes.fromhex(sys.argv[2])); "
        "sys.stdout.write(s.recv(4096).hex())"
    )
    result = subprocess.run(
        python_as(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"],
            "-c",
            script,
            str(agent.socket_path),
            HELLO.hex(),
        ),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=other_user_env(),
    )
    assert result.returncode == 0, result.stderr
    return protocol.FrameReader().feed(bytes.fromhex(result.stdout))[0]


def test_connections_past_the_fd_limit_less_a_reserve_are_refused(start_settled_agent):
    agent = start_settled_agent()
    total = 40
    set_fd_limit(agent, total + FD_RESERVE)
    crowd = [greeted_socket(agent.socket_path) for _ in range(total)]
    try:
        for sock in crowd:
            assert isinstance(first_frame(sock), protocol.WireSettings)
        error = refusal(agent.socket_path)
        assert error.code == ErrorCode.FLOOD
        assert (
            error.text == f"too many connections to the agent ({total} open, the limit is {total})"
        )
        agent.wait_for_log(r"WARNING refusing connection .*too many connections to the agent")
    finally:
        for sock in crowd:
            sock.close()
    wait_until(
        lambda: refusal_or_settings(agent.socket_path), what="the agent to take clients again"
    )


def test_out_of_fds_the_agent_neither_spins_nor_floods_its_log_and_recovers(start_agent):
    # The limits keep the agent below its fd limit; an admin lowering that limit
    # under the running agent (or fds used elsewhere) is what is left.
    agent = start_agent()
    set_fd_limit(agent, 256)
    held = [ShimClient(agent.socket_path, command=f"c{i}") for i in range(100)]
    set_fd_limit(agent, 64)  # fewer than the agent has open: every accept() fails with EMFILE
    # They wait in the backlog; the odd one that gets a free low fd number is
    # refused at once (the connection limit follows the fd limit).
    late = [greeted_socket(agent.socket_path) for _ in range(30)]
    try:
        time.sleep(0.5)  # the agent meets EMFILE
        cpu_before, log_before = cpu_seconds(agent.process.pid), len(agent.log())
        time.sleep(2)
        assert cpu_seconds(agent.process.pid) - cpu_before < 0.2, "the agent spins while out of fds"
        assert len(agent.log()) - log_before < 300, agent.log()[log_before:][:2000]
        assert agent.log().count("ERROR cannot accept connections: Too many open files") == 1
        set_fd_limit(agent, 256)
        for sock in late:  # none is left hanging
            answer = first_frame(sock)
            assert isinstance(answer, protocol.WireSettings) or answer.code == ErrorCode.FLOOD, (
                answer
            )
        with ShimClient(agent.socket_path) as newcomer:
            newcomer.request()
            newcomer.wait_grant()
    finally:
        for sock in late:
            sock.close()
        for client in held:
            client.close()


# ---------------------------------------------------------------- the bookkeeping alone (no I/O)


def test_the_total_limit_follows_the_fd_limit_within_bounds():
    assert total_limit(1024) == 1024 - FD_RESERVE
    assert total_limit(1 << 20) == TOTAL_LIMIT
    assert total_limit(resource.RLIM_INFINITY) == TOTAL_LIMIT
    assert total_limit(FD_RESERVE) == 1  # absurdly low: still serve someone


def test_counts_free_a_place_when_a_connection_goes():
    counts = ConnectionCounts(per_uid_limit=2)
    counts.add(1000)
    counts.add(1000)
    assert "from uid 1000" in counts.refusal(1000, 1 << 20)
    assert counts.refusal(1001, 1 << 20) is None
    counts.remove(1000)
    assert counts.refusal(1000, 1 << 20) is None
    assert "the limit is 1)" in counts.refusal(1001, FD_RESERVE + 1)
    counts.remove(1000)
    assert counts.by_uid == {} and counts.total == 0


def test_log_throttle_lets_one_line_a_minute_through_and_counts_the_rest():
    throttle = LogThrottle(60.0)
    assert throttle.allow(1000, 0.0) == 0
    assert [throttle.allow(1000, t) for t in (1.0, 30.0, 59.9)] == [None, None, None]
    assert throttle.allow(1001, 2.0) == 0  # each key on its own
    assert throttle.allow(1000, 60.0) == 3
    assert throttle.allow(1000, 200.0) == 0
