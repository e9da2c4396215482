"""systemd integration (the real systemd-socket-activate, a real NOTIFY_SOCKET),
the config file, and settings that survive a restart."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from agent_harness import (
    FAST_CONFIG,
    GPU0,
    TIMEOUT_S,
    AgentProcess,
    ShimClient,
    fd_limit_at_least,
    wait_until,
)

from nvshare_agent import protocol
from nvshare_agent.bus_address import bus_address_problem
from nvshare_agent.engine import Engine
from nvshare_agent.settings import AntiThrash, Settings
from nvshare_agent.settings_files import SettingsStore
from nvshare_agent.systemd import (
    DEFAULT_SOCKET_PATH,
    LISTEN_BACKLOG,
    MIN_WATCHDOG_INTERVAL_S,
    STATUS_MAX_BYTES,
    watchdog_interval_s,
)


def agent_args(tmp_path):
    config = tmp_path / "nvshare.conf"
    config.write_text(FAST_CONFIG)
    return [
        sys.executable,
        "-m",
        "nvshare_agent",
        "--bus",
        "none",
        "--state-dir",
        str(tmp_path / "state"),
        "--config",
        str(config),
    ]


def connected_client(path) -> ShimClient | None:
    try:
        return ShimClient(path)
    except (FileNotFoundError, ConnectionRefusedError):
        return None


@pytest.mark.skipif(
    shutil.which("systemd-socket-activate") is None, reason="needs systemd-socket-activate"
)
def test_socket_activation_through_systemd_socket_activate(tmp_path):
    sock_path = tmp_path / "activated.sock"
    log_path = tmp_path / "agent.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            ["systemd-socket-activate", "-l", str(sock_path), *agent_args(tmp_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        # The first connection is what starts the agent (the activator execs it with fd 3).
        # The path appears at bind(), a moment before listen(): until then, refused.
        with wait_until(
            lambda: connected_client(sock_path), what="systemd-socket-activate to listen"
        ) as first:
            assert first.settings.time_quantum_ms == 1000
            first.request()
            grant = first.wait_grant()
            with ShimClient(sock_path) as second:
                second.request()
                first.release(grant)
                second.wait_grant()
        log_text = wait_until(
            lambda: "release gpu=" in log_path.read_text() and log_path.read_text(),
            what="the agent's log lines",
        )
        assert "listening on the socket systemd passed (fd 3)" in log_text
        assert "grant gpu=GPU-" in log_text
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT_S) == 0
    # The socket belongs to systemd: the agent must not have deleted it.
    assert sock_path.exists()


def test_sd_notify_ready_status_watchdog_and_stopping(tmp_path):
    notify_path = tmp_path / "notify.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(notify_path))
    listener.settimeout(TIMEOUT_S)
    agent = AgentProcess(
        tmp_path / "a", env={"NOTIFY_SOCKET": str(notify_path), "WATCHDOG_USEC": "200000"}
    )
    received: list[str] = []

    def wait_for(prefix: str) -> str:
        while True:
            for message in received:
                if message.startswith(prefix):
                    received.remove(message)
                    return message
            received.append(listener.recv(4096).decode())

    try:
        agent.start()
        assert wait_for("READY=1") == "READY=1"
        status = wait_for("STATUS=")
        assert "clients" in status and "\n" not in status
        wait_for("WATCHDOG=1")
        wait_for("WATCHDOG=1")  # repeated, at half of WATCHDOG_USEC
        with ShimClient(agent.socket_path) as c:
            c.request()
            c.wait_grant()
            wait_for("STATUS=1 clients; GPU-00000000 exclusive holder=")
        assert agent.stop() == 0
        wait_for("STOPPING=1")
    finally:
        agent.stop()
        listener.close()


def test_sd_notify_status_stays_short_when_clients_name_many_gpus(tmp_path):
    # systemd ignores a notify datagram over 4096 bytes; clients may name 16 GPUs
    # each, made up or not, and hold them by the hundred with anti-thrash off.
    notify_path = tmp_path / "notify.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(notify_path))
    listener.settimeout(TIMEOUT_S)
    long_quantum = FAST_CONFIG.replace("time_quantum = 1\n", "time_quantum = 3600\n")
    agent = AgentProcess(
        tmp_path / "a", config=long_quantum, env={"NOTIFY_SOCKET": str(notify_path)}
    )
    clients = []
    try:
        agent.start()
        clients = [
            # 4 x 15 made-up GPUs: under what one uid may make the agent track (64).
            ShimClient(agent.socket_path, gpus=[GPU0, *(os.urandom(16) for _ in range(15))])
            for _ in range(4)
        ]
        clients[0].request(GPU0)
        clients[0].wait_grant(GPU0)
        clients[1].request(GPU0)
        longest = 0
        while True:
            message = listener.recv(65536).decode()
            if message.startswith("STATUS="):
                longest = max(longest, len(message.encode()))
                if message == "STATUS=4 clients; 61 GPUs, 1 held, 1 waiting":
                    break
        assert longest <= len("STATUS=") + STATUS_MAX_BYTES
    finally:
        for c in clients:
            c.close()
        agent.stop()
        listener.close()


def serves(socket_path) -> bool:
    try:
        ShimClient(socket_path).close()
        return True
    except OSError:
        return False


def queued_connections(socket_path, at_most: int) -> int:
    """How many connect()s the socket's backlog takes while no one accepts."""
    sockets = []
    try:
        while len(sockets) < at_most:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            sockets.append(sock)
            try:
                sock.connect(str(socket_path))
            except BlockingIOError:  # the backlog is full
                return len(sockets) - 1
        return len(sockets)
    finally:
        for sock in sockets:
            sock.close()


@pytest.mark.parametrize("socket_from", ["bind", "systemd"])
def test_the_listen_backlog_is_listen_backlog_either_way(tmp_path, socket_from):
    expected = min(LISTEN_BACKLOG, int(open("/proc/sys/net/core/somaxconn").read()))
    with fd_limit_at_least(expected + 200):
        queued = queued_behind_a_stopped_agent(tmp_path, socket_from, expected + 100)
    assert queued in (expected, expected + 1)  # Linux queues backlog + 1


def queued_behind_a_stopped_agent(tmp_path, socket_from, at_most: int) -> int:
    """Starts the agent on a socket it binds or one "systemd" passes, stops it (SIGSTOP), and
    counts the connect()s its backlog takes."""
    sock_path = tmp_path / "scheduler.sock"
    args = agent_args(tmp_path)
    held_by_systemd = None
    if socket_from == "bind":
        proc = subprocess.Popen([*args, "--socket", str(sock_path)], stderr=subprocess.DEVNULL)
    else:
        # Like systemd with the unit's Backlog=: a small one, which the agent replaces.
        held_by_systemd = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        held_by_systemd.bind(str(sock_path))
        held_by_systemd.listen(16)
        script = f'exec 3<&{held_by_systemd.fileno()}; LISTEN_PID=$$ LISTEN_FDS=1 exec "$@"'
        proc = subprocess.Popen(
            ["bash", "-c", script, "bash", *args],
            pass_fds=(held_by_systemd.fileno(),),
            stderr=subprocess.DEVNULL,
        )
    try:
        wait_until(lambda: serves(sock_path), what="the agent to serve")
        proc.send_signal(signal.SIGSTOP)  # accepts nothing: connections queue in the backlog
        try:
            queued = queued_connections(sock_path, at_most)
        finally:
            proc.send_signal(signal.SIGCONT)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT_S) == 0
        if held_by_systemd is not None:
            held_by_systemd.close()
    return queued


@pytest.mark.parametrize(
    "bus, env, message",
    [
        (
            "sytem",
            {},
            "--bus 'sytem' is not a D-Bus address (no transport, such as unix:); use system, none",
        ),
        ("unix:path=/run/x\nsecond line", {}, "(control or non-ASCII characters)"),
        ("unix:", {}, "(unix: needs path= or abstract=)"),
        ("launchd:env=X", {}, "(transport 'launchd' is not unix: or tcp:)"),
        ("tcp:host=localhost,port=http", {}, "(port='http' is not a number)"),
        ("unix:path=/run/a b", {}, "(the value of path= holds characters that must be %-escaped)"),
        (
            "system",
            {"DBUS_SYSTEM_BUS_ADDRESS": "sytem"},
            "DBUS_SYSTEM_BUS_ADDRESS='sytem' is not a D-Bus address",
        ),
    ],
    ids=["no-transport", "newline", "no-path", "launchd", "port", "space", "environment"],
)
def test_unusable_bus_address_is_one_line_and_exit_code_2(tmp_path, bus, env, message):
    # A mistyped address used to be retried forever, at debug level after the
    # first warning; systemd's RestartPreventExitStatus=2 stops on this one.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "nvshare_agent",
            "--bus",
            bus,
            "--socket",
            str(tmp_path / "s.sock"),
            "--state-dir",
            str(tmp_path / "state"),
            "--config",
            str(tmp_path / "absent.conf"),
        ],
        capture_output=True,
        text=True,
        timeout=10,
        env={**os.environ, **env},
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nvshare-agent: error: "), result.stderr
    assert message in lines[0]
    assert not (tmp_path / "s.sock").exists()


@pytest.mark.parametrize(
    "address",
    [
        "unix:path=/run/dbus/system_bus_socket",
        "unix:abstract=/tmp/dbus-x",
        "unix:path=/tmp/a%20b,guid=0123",
        "tcp:host=localhost,port=4000",
        "unix:path=/nowhere;unix:path=/run/x",
    ],
)
def test_addresses_dbus_next_can_use_pass_the_check(address):
    assert bus_address_problem(address) is None


def test_socket_is_world_connectable_and_removed_on_stop(start_agent):
    agent = start_agent()
    assert oct(agent.socket_path.stat().st_mode & 0o777) == oct(0o666)
    assert agent.stop() == 0
    assert not agent.socket_path.exists()
    assert "INFO stopping" in agent.log()


@pytest.mark.parametrize("attempt", range(5))
def test_sigterm_while_starting_is_a_clean_stop(tmp_path, attempt):
    # systemd (or a test) may stop the agent the moment its socket exists, before
    # the event loop serves: that must be the same clean stop as any other.
    agent = AgentProcess(tmp_path / "agent").start(wait=False)
    try:
        wait_until(
            lambda: agent.socket_path.exists() or not agent.alive(),
            what="the socket to be bound",
            interval=0.0005,
        )
        assert agent.stop() == 0, agent.log()
        assert not agent.socket_path.exists()
    finally:
        agent.stop()


async def test_settings_changed_at_run_time_survive_a_restart(tmp_path):
    state_dir = tmp_path / "state"
    agent = Engine(Settings(), SettingsStore(state_dir))
    await agent.change_settings(time_quantum_s=42, anti_thrash=AntiThrash.OFF)
    assert json.loads((state_dir / "settings.json").read_text()) == {
        "anti_thrash": "off",
        "time_quantum_s": 42,
    }
    assert not [p for p in os.listdir(state_dir) if p.endswith(".tmp")]
    # A fresh agent process with the same state dir starts with them (over the config file's values).
    restarted = AgentProcess(tmp_path / "restart", state_dir=state_dir).start()
    try:
        with ShimClient(restarted.socket_path) as c:
            assert c.settings.time_quantum_ms == 42_000
            assert c.settings.anti_thrash == 0
            assert c.settings.drop_grace_ms == 300  # not persisted: still from the config file
            c.request(GPU0)
            assert c.wait_grant().flags == 2  # shared
    finally:
        assert restarted.stop() == 0


def test_broken_state_file_is_a_warning_not_a_failure(tmp_path):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "settings.json").write_text("{not json")
    agent = AgentProcess(tmp_path / "a", state_dir=state_dir).start()
    try:
        with ShimClient(agent.socket_path) as c:
            assert c.settings.time_quantum_ms == 1000
        agent.wait_for_log("WARNING ignoring saved settings .*settings.json")
    finally:
        agent.stop()


@pytest.mark.parametrize(
    "fd_3, socket_arg, message",
    [
        ("3>&-", None, "fd 3 from systemd is not a socket (Bad file descriptor)"),
        ("3</dev/null", None, "fd 3 from systemd is not a socket (Socket operation on non-socket)"),
        ("", "d" * 120 + "/s.sock", "a UNIX socket path has at most 107 bytes"),
        ("", "file/s.sock", "cannot check"),
    ],
    ids=["fd-3-closed", "fd-3-not-a-socket", "path-too-long", "parent-is-a-file"],
)
def test_unusable_socket_setup_is_one_line_and_exit_code_1(tmp_path, fd_3, socket_arg, message):
    (tmp_path / "file").write_text("")
    args = agent_args(tmp_path)
    if socket_arg is not None:
        args += ["--socket", str(tmp_path / socket_arg)]
    # LISTEN_PID must be the agent's own pid: the shell sets it, then becomes the agent.
    script = f'exec {fd_3}; LISTEN_PID=$$ LISTEN_FDS=1 exec "$@"'
    result = subprocess.run(
        ["sh", "-c", script, "sh", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nvshare-agent: error: "), result.stderr
    assert message in lines[0] and "None" not in lines[0]


@pytest.mark.parametrize(
    "usec, interval_s",
    [
        ("1", MIN_WATCHDOG_INTERVAL_S),
        ("0", None),
        ("junk", None),
        ("200000", 0.1),
        ("30000000", 15.0),
    ],
)
def test_watchdog_interval_is_half_of_watchdog_usec_but_never_a_busy_loop(
    monkeypatch, usec, interval_s
):
    monkeypatch.setenv("WATCHDOG_USEC", usec)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert watchdog_interval_s() == interval_s


def test_the_socket_unit_listens_where_shims_and_the_agent_look():
    # One definition (shim/nvshare_protocol.h); the unit file cannot include it.
    unit = (Path(__file__).resolve().parents[2] / "systemd" / "nvshare.socket").read_text()
    listen = [
        line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("ListenStream=")
    ]
    assert listen == [protocol.DEFAULT_SOCKET_PATH]
    assert str(DEFAULT_SOCKET_PATH) == protocol.DEFAULT_SOCKET_PATH
