"""After the agent comes back the shim reconnects within milliseconds (issue 27,
point 2), with no busy polling while it is away.

It used to retry every second: 0.6 s after a new agent listened on average, and up
to a second.  Now it tries again at once after losing an agent (under systemd the
socket outlives the agent, and the connect waits in the backlog for the new one),
backs off from 50 ms to 1 s, and watches the socket's directory, so a socket the
agent re-creates (--socket) is tried as it appears.  The figures are printed
(pytest -s); the bound is loose, this machine is shared and loaded."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from fake_agent import FakeAgent

from nvshare_agent.protocol import MessageType

# Each waits out the shim's 3 s liveness bound or a reconnect series: seconds each.
pytestmark = pytest.mark.slow

TRIALS = 12
BOUND_S = 0.3


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def report(what: str, latencies: list[float]) -> str:
    ms = [1000 * x for x in latencies]
    return (
        f"{what}: {len(ms)} reconnects, median {percentile(ms, 0.5):.1f} ms, "
        f"p99 {percentile(ms, 0.99):.1f} ms, max {max(ms):.1f} ms"
    )


def test_reconnects_within_milliseconds_of_a_recreated_socket(world):
    # The agent goes away, its socket removed, for 0.1 to 1.5 s (the backoff has grown
    # to 0.8 s by then), and listens on a new one.
    rounds = random.Random(27)
    with FakeAgent(world.socket_path) as agent:
        world.client("linked", "--duration-ms", 60_000, "--sleep-ms", 50)
        latencies = []
        for trial in range(1, TRIALS + 1):
            # Its memory report comes once the agent has answered: the shim is scheduled.
            agent.wait_for_connection(trial).wait_for(MessageType.MEMORY_REPORT)
            agent.go_away(remove=True)
            time.sleep(rounds.uniform(0.1, 1.5))
            agent.listen()
            latencies.append(
                agent.wait_for_connection(trial + 1).accepted_at - agent.listening_since
            )
    print(report("socket re-created", latencies))
    assert percentile(latencies, 0.99) < BOUND_S, report("socket re-created", latencies)


def test_reconnects_at_once_when_the_socket_outlives_the_agent(world):
    # As under systemd: the listening socket stays, the agent's connection closes.
    with FakeAgent(world.socket_path) as agent:
        world.client("linked", "--duration-ms", 60_000, "--sleep-ms", 50)
        latencies = []
        for trial in range(1, TRIALS + 1):
            connection = agent.wait_for_connection(trial)
            connection.wait_for(MessageType.MEMORY_REPORT)
            closed_at = time.time()
            connection.close()
            latencies.append(agent.wait_for_connection(trial + 1).accepted_at - closed_at)
    print(report("socket kept", latencies))
    assert percentile(latencies, 0.99) < BOUND_S, report("socket kept", latencies)


def client_thread_cpu_s(pid: int) -> float:
    """User and system time of the process's nvshare-client thread."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        if (task / "comm").read_text().strip() == "nvshare-client":
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / 100  # utime, stime in ticks
    raise AssertionError("no nvshare-client thread")


def test_no_busy_polling_while_the_agent_is_away(world):
    # 4 s with no socket at all, then 4 s of a socket nobody answers: the client thread
    # sleeps in poll between its tries.  (This held before the change too: it guards it.)
    client = world.client("linked", "--duration-ms", 12_000, "--sleep-ms", 100)
    time.sleep(1.0)
    before = client_thread_cpu_s(client.pid)
    time.sleep(4.0)
    with FakeAgent(world.socket_path, answer="none"):
        time.sleep(4.0)
    used = client_thread_cpu_s(client.pid) - before
    assert used < 0.1, f"the client thread used {used:.2f} s of CPU in 8 s"
