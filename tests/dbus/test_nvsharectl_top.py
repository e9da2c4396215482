"""`nvsharectl top` and `nvsharectl explain` end to end: the real CLI against
the real agent on a private bus, fake shims holding and waiting."""

import json
import os
import pty
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dbus_harness import TIMEOUT_S, busctl_on_agent, nvsharectl, property_data, wait_for

from nvshare_agent import protocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_harness import GPU0

AGENT_TESTS = Path(__file__).resolve().parents[1] / "agent"

GiB = 1 << 30
UUID = protocol.format_uuid(GPU0)
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


# A fake shim in a process of its own: HELLO as argv[2] with argv[3] bytes
# allocated, a lock request; prints "granted" when granted, keeps its
# connection until its stdin closes.
SHIM_PROCESS = """
import sys
sys.path.insert(0, sys.argv[4])
from agent_harness import GPU0, ShimClient
client = ShimClient(sys.argv[1], command=sys.argv[2])
client.report_memory(GPU0, int(sys.argv[3]))
client.request()
if sys.argv[5] == "hold":
    client.wait_grant()
    print("granted", flush=True)
sys.stdin.read()
"""


class ShimProcess:
    def __init__(self, agent, command: str, memory: int, hold: bool):
        self.process = subprocess.Popen(
            [sys.executable, "-c", SHIM_PROCESS, str(agent.socket_path), command, str(memory)]
            + [str(AGENT_TESTS), "hold" if hold else "wait"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = self.process.pid
        if hold:
            assert self.process.stdout.readline() == "granted\n"

    def stop(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=TIMEOUT_S)


def _holder_and_waiter(agent, bus, waiter_command="waiter"):
    # On: both busy, so the waiter waits its turn; a long quantum, so it stays so.
    busctl_on_agent(bus.address, "set-property", "AntiThrashMode", "s", "on")
    busctl_on_agent(bus.address, "set-property", "TimeQuantum", "u", "3600")
    holder = ShimProcess(agent, "holder", 3 * GiB, hold=True)
    waiter = ShimProcess(agent, waiter_command, GiB, hold=False)
    wait_for(
        lambda: any(gpu[4] == [waiter.pid] for gpu in property_data(bus.address, "Gpus")),
        "the waiter queued",
    )
    return holder, waiter


def on_a_terminal(address: str, columns: int, *args: str) -> str:
    """nvsharectl's output on a pseudo-terminal `columns` wide ($COLUMNS, as ls reads it)."""
    main, child = pty.openpty()
    env = {**os.environ, "COLUMNS": str(columns), "PYTHONDONTWRITEBYTECODE": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "nvshare_cli", "--bus", address, *args],
        stdout=child,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(child)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the child's end closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    assert process.wait(timeout=TIMEOUT_S) == 0, process.stderr.read()
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_top_once_shows_each_client_by_gpu_time_in_80_columns(agent, bus):
    holder, waiter = _holder_and_waiter(agent, bus, waiter_command="waiter " + "x" * 200)
    try:
        started = time.monotonic()
        result = nvsharectl(bus.address, "top", "--once")
        assert result.returncode == 0, result.stderr
        assert time.monotonic() - started >= 1.0  # it samples ~1 s for the rate
        lines = result.stdout.splitlines()
        assert not ANSI.search(result.stdout)  # not a terminal: plain text
        assert all(len(line) <= 80 for line in lines), lines
        assert lines[0].startswith("nvshare top") and "2 clients, 1 waiting" in lines[0]
        assert lines[1].startswith("GPU 0") and "1 holding, 1 waiting" in lines[1]
        header = next(i for i, line in enumerate(lines) if line.startswith("    PID USER"))
        holder_row, waiter_row = lines[header + 1].split(), lines[header + 2].split()
        # Sorted by GPU time: the holder kept the GPU busy the whole second.
        assert holder_row[0] == str(holder.pid) and holder_row[6] == "holding"
        # Busy all along: near 100 %, less what a loaded machine's delays take
        # between the agent's reading and nvsharectl's clock.
        assert 50 <= float(holder_row[3]) <= 100 and holder_row[4:6] == ["3.0", "GiB"]
        assert "waiting" in lines[header + 2] and "turn" in lines[header + 2]
        assert float(waiter_row[3]) == 0
        assert lines[header + 2].endswith("…")  # the long command cut to the width
    finally:
        holder.stop()
        waiter.stop()


def test_top_once_on_a_wide_terminal_gives_unit_and_pod_a_column(agent, bus):
    holder, waiter = _holder_and_waiter(agent, bus)
    try:
        text = on_a_terminal(bus.address, 200, "top", "--once")
        assert not ANSI.search(text)  # --once: one plain frame, no redraw codes
        lines = text.splitlines()
        assert all(len(line) <= 200 for line in lines)
        assert "UNIT/POD" in lines[3] and lines[3].rstrip().endswith("COMMAND")
        assert any(line.endswith(" holder") for line in lines)
        narrow = on_a_terminal(bus.address, 80, "top", "--once")
        assert "UNIT/POD" not in narrow and max(map(len, narrow.splitlines())) <= 80
    finally:
        holder.stop()
        waiter.stop()


@pytest.mark.parametrize("sigint", ["default", "ignored by its parent"])
def test_top_live_on_a_terminal_redraws_in_place(agent, bus, sigint):
    """Ctrl-C leaves it, also when it inherits SIGINT ignored: a background job of a
    script does (the README's test stage once left top running after its Ctrl-C)."""
    main, child = pty.openpty()
    env = {**os.environ, "COLUMNS": "100", "PYTHONDONTWRITEBYTECODE": "1"}
    ignore = sigint != "default"
    process = subprocess.Popen(
        [sys.executable, "-m", "nvshare_cli", "--bus", bus.address, "top", "--interval", "0.2"],
        stdout=child,
        env=env,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore else None,
    )
    os.close(child)
    seen = b""
    try:
        while seen.count(b"\x1b[H") < 3:
            seen += os.read(main, 65536)
    finally:
        process.send_signal(signal.SIGINT)  # Ctrl-C: how top is left
        try:
            assert process.wait(timeout=TIMEOUT_S) == 0
        finally:
            process.kill()  # never left running past the test
            process.wait()
            os.close(main)
    frames = seen.split(b"\x1b[H")[1:]
    assert seen.startswith(b"\x1b[2J\x1b[H") and seen.count(b"\x1b[2J") == 1  # cleared once
    for frame in frames[:2]:  # each line cleared to its end, then the rest of the screen
        assert frame.endswith(b"\x1b[J") and b"no clients\x1b[K" in frame


def test_top_json_for_scripts(agent, bus):
    holder, waiter = _holder_and_waiter(agent, bus)
    try:
        result = nvsharectl(bus.address, "top", "--once", "--json")
        assert result.returncode == 0, result.stderr
        frame = json.loads(result.stdout)
        assert 0.9 <= frame["interval_s"] <= 10
        (gpu,) = frame["gpus"]
        assert gpu["uuid"] == UUID and gpu["holding"] == 1 and gpu["waiting"] == 1
        assert gpu["memory_allocated_bytes"] == 4 * GiB
        first, second = frame["clients"]
        assert first["state"] == "holding" and first["gpu_percent"] >= 50
        assert first["gpu_seconds"] >= 1.0 and first["memory_bytes"] == 3 * GiB
        assert second["state"] == "waiting" and second["wait_cause"] == "turn"
        assert second["waited_s"]["turn"] >= 1.0 and second["gpu_percent"] == 0
        assert {"user", "unit", "pod", "command", "pid", "gpu"} <= set(second)
        # Live, each frame is a line of JSON.
        streamed = nvsharectl(bus.address, "top", "--json", "--interval", "0.1", "--once")
        assert len(streamed.stdout.splitlines()) == 1
    finally:
        holder.stop()
        waiter.stop()


def test_top_refuses_an_interval_out_of_range_as_bad_usage(agent, bus):
    result = nvsharectl(bus.address, "top", "--interval", "0")
    assert result.returncode == 2
    assert result.stderr == "nvsharectl: --interval must be 0.1..3600 seconds, got 0\n"


def test_explain_says_why_a_process_waits_and_what_changes_it(agent, bus):
    holder, waiter = _holder_and_waiter(agent, bus)
    try:
        result = nvsharectl(bus.address, "explain", str(waiter.pid))
        assert result.returncode == 0, result.stderr
        (line,) = result.stdout.splitlines()
        assert line.startswith(f"PID {waiter.pid} (waiter) waits for GPU 0 for its turn")
        assert f"PID {holder.pid} (holder)" in line and "(3600 s)" in line
        assert "it has waited" in line and "(turn " in line

        result = nvsharectl(bus.address, "explain", str(holder.pid))
        (line,) = result.stdout.splitlines()
        assert line.startswith(f"PID {holder.pid} (holder) runs on GPU 0: it holds the GPU")
        assert "1 process waits behind it" in line and "(3600 s)" in line

        answer = json.loads(nvsharectl(bus.address, "explain", str(waiter.pid), "--json").stdout)
        assert answer["pid"] == waiter.pid
        (gpu,) = answer["gpus"]
        assert gpu["gpu"] == UUID and gpu["state"] == "waiting" and gpu["wait_cause"] == "turn"
    finally:
        holder.stop()
        waiter.stop()


def test_explain_of_a_process_not_connected_fails_with_one_line(agent, bus):
    result = nvsharectl(bus.address, "explain", "999999")
    assert result.returncode == 1
    assert result.stderr == (
        "nvsharectl: no process 999999 is connected to the nvshare agent now "
        "(nvsharectl clients lists those that are)\n"
    )
    bad = nvsharectl(bus.address, "explain", "abc")
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1
