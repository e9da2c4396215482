"""The whole suite: no process a test starts may reach the node's own agent.

On a node where nvshare runs, /etc/ld.so.preload loads the shim into every process, and a
shim with no NVSHARE_SOCKET asks the node's agent for the GPU: test processes once showed
up in the node's journal (`connect pid=… command=python`, `grant`), scheduled beside the
node's real work.  Every test that starts clients gives them a socket of its own; for
whatever it does not, the session points NVSHARE_SOCKET at a trap that records who
connects, and the run fails, naming them.  (A process that clears its environment is not
caught here: the README's test stage runs the suite beside an installed agent and reads
its journal for that.)"""

from __future__ import annotations

import os
import socket
import struct
import tempfile
import threading
from pathlib import Path

import pytest

_caught: list[str] = []


def _who(conn: socket.socket) -> str:
    pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        command = "?"
    return f"pid={pid} uid={uid} command={command.strip()[:200]}"


def _serve(listener: socket.socket) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return  # closed at the session's end
        with conn:
            _caught.append(_who(conn))


def pytest_configure(config: pytest.Config) -> None:
    folder = tempfile.mkdtemp(prefix="nvshare-trap-")
    os.chmod(folder, 0o755)  # shims of other uids (the cap tests' 4001) reach it too
    path = os.path.join(folder, "scheduler.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o777)
    listener.listen(64)
    threading.Thread(target=_serve, args=(listener,), daemon=True, name="agent-trap").start()
    config._nvshare_trap = (listener, folder)  # type: ignore[attr-defined]
    os.environ["NVSHARE_SOCKET"] = path


@pytest.fixture(autouse=True)
def no_process_reaches_the_node_agent():
    """Fails the test whose processes reached the trap, naming them."""
    before = len(_caught)
    yield _caught
    leaked = _caught[before:]
    del _caught[before:]
    assert not leaked, f"reached for the node's agent (no socket of their own): {leaked}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    listener, folder = session.config._nvshare_trap  # type: ignore[attr-defined]
    listener.close()
    for name in os.listdir(folder):
        os.unlink(os.path.join(folder, name))
    os.rmdir(folder)
    if _caught:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        for who in _caught:
            line = f"a test's process reached for the node's agent (no socket of its own): {who}"
            if reporter is not None:
                reporter.write_line(line, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
