"""The GPU benchmark's Agent wrapper around a real agent, with a fake shim as the client (no GPU needed)."""
import pathlib
import subprocess
import sys

import pytest

TESTS = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS.parent / "bench" / "gpu"))
import run  # noqa: E402

# A client that takes GPU0's lock and holds it, as a trainer would, or stops before asking.
CLIENT = f"""
import sys, time
sys.path.insert(0, {str(TESTS / "agent")!r})
from agent_harness import ShimClient
client = ShimClient(sys.argv[1])
if sys.argv[2] == "hold":
    client.request()
    client.wait_grant()
    time.sleep(60)
"""


def client(agent, mode):
    return subprocess.Popen([sys.executable, "-c", CLIENT, str(agent.socket), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def agent(tmp_path):
    started = run.Agent(tmp_path)
    yield started
    started.stop()


def test_wait_for_grant_returns_once_that_process_holds_the_gpu(agent):
    holder = client(agent, "hold")
    try:
        agent.wait_for_grant(holder, timeout=30)
        assert holder.poll() is None
        assert [event["pid"] for event in agent.events("grant")] == [str(holder.pid)]
    finally:
        run.stop_process(holder)


def test_wait_for_grant_fails_when_the_process_stops_first(agent):
    quitter = client(agent, "quit")
    with pytest.raises(RuntimeError, match="stopped before its first grant"):
        agent.wait_for_grant(quitter, timeout=30)


def test_wait_for_grant_gives_up_after_its_timeout(agent):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(RuntimeError, match="got no grant in 1 s"):
            agent.wait_for_grant(sleeper, timeout=1)
    finally:
        run.stop_process(sleeper)
