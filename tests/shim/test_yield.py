"""Giving the GPU up when idle, as the agent asks (tests/shim/fake_agent.py plays it):
a DROP_REQUEST with WHEN_IDLE is honoured once the holder has been idle that long,
not at once; a SHARED grant with RELEASE_WHEN_IDLE is released when idle as an
exclusive one is, a plain SHARED one is not; RELEASED says for how long the GPU
had been idle (0 for a busy one), so that the agent counts only busy time."""

from __future__ import annotations

import time

import pytest
from fake_agent import FakeAgent
from shim_harness import STANDIN_GPU

from nvshare_agent import protocol
from nvshare_agent.protocol import DropFlags, GrantFlags, MessageType

GPU = protocol.parse_uuid(STANDIN_GPU)
SHARED = int(GrantFlags.SHARED)
RELEASE_WHEN_IDLE = int(GrantFlags.RELEASE_WHEN_IDLE)
WHEN_IDLE = int(DropFlags.WHEN_IDLE)
# The shim's clock and the stand-in log's: a few ms of slack between them.
SLACK_S = 0.02


def gated_times(world, pid: int) -> list[float]:
    return [c.t for c in world.calls(pid) if c.gated]


def test_a_when_idle_drop_is_honoured_once_the_holder_has_been_idle_that_long(world):
    # Granted at the first burst, with a drop request "when idle for 300 ms" at once: the
    # holder keeps the GPU for its burst and gives it back 300 ms after it.  (It used to
    # drain at once, whatever the flag.)
    def drop_when_idle(connection, grant):
        connection.drop(grant, WHEN_IDLE, 300)

    with FakeAgent(world.socket_path, on_grant=drop_when_idle) as agent:
        client = world.client("linked", "--loops", 2, "--sleep-ms", 1500)
        released = agent.wait_for_connection().wait_for(MessageType.RELEASED)
        client.finish_ok()
    idle_for = released.t - max(t for t in gated_times(world, client.pid) if t < released.t)
    assert 0.3 - SLACK_S <= idle_for < 1.2, f"released {idle_for:.3f} s after the last call"
    assert 300 <= released.message.idle_ms < 1200, released.message


@pytest.mark.slow  # several seconds: make check runs it, check-fast does not
def test_a_busy_holder_keeps_the_gpu_after_a_when_idle_drop_until_it_is_idle(world):
    # Busy for 2 s (bursts back to back), then idle: the drop "when idle for 300 ms",
    # sent at the grant, is honoured 300 ms after the last call, not before.
    def drop_when_idle(connection, grant):
        connection.drop(grant, WHEN_IDLE, 300)

    with FakeAgent(world.socket_path, on_grant=drop_when_idle) as agent:
        client = world.client("linked", "--duration-ms", 2000, "--linger-ms", 1500)
        connection = agent.wait_for_connection()
        released = connection.wait_for(MessageType.RELEASED)
        client.finish_ok()
    calls = gated_times(world, client.pid)
    assert released.t > max(calls) + 0.3 - SLACK_S, (
        f"released {max(calls) - released.t:.3f} s before the last call"
    )
    assert len(connection.all(MessageType.LOCK_REQUEST)) == 1, "the GPU was never given up early"
    assert released.message.idle_ms >= 300, released.message


def test_a_plain_drop_of_a_busy_holder_says_it_was_not_idle(world):
    def drop(connection, grant):
        connection.drop(grant)

    with FakeAgent(world.socket_path, on_grant=drop) as agent:
        client = world.client("linked", "--duration-ms", 1000)
        released = agent.wait_for_connection().wait_for(MessageType.RELEASED)
        client.finish_ok()
    assert released.message.idle_ms == 0, released.message


def test_an_idle_release_says_how_long_the_gpu_was_idle(world):
    with FakeAgent(world.socket_path, settings=dict(idle_release_ms=200)) as agent:
        client = world.client("linked", "--loops", 2, "--sleep-ms", 1200)
        released = agent.wait_for_connection().wait_for(MessageType.RELEASED)
        client.finish_ok()
    assert 200 <= released.message.idle_ms < 1000, released.message


def test_a_shared_grant_with_release_when_idle_is_released_when_idle(world):
    with FakeAgent(
        world.socket_path,
        settings=dict(idle_release_ms=200),
        grant_flags=SHARED | RELEASE_WHEN_IDLE,
    ) as agent:
        client = world.client("linked", "--loops", 2, "--sleep-ms", 1200)
        connection = agent.wait_for_connection()
        released = connection.wait_for(MessageType.RELEASED)
        client.finish_ok()
    idle_for = released.t - max(t for t in gated_times(world, client.pid) if t < released.t)
    assert 0.2 - SLACK_S <= idle_for < 1.0, f"released {idle_for:.3f} s after the last call"
    assert 200 <= released.message.idle_ms < 1000, released.message
    assert len(connection.all(MessageType.LOCK_REQUEST)) == 2, "asked again for the second burst"


def test_a_plain_shared_grant_is_kept_while_idle(world):
    # Anti-thrash off: shared leases are not given up for being idle (and this passed
    # before the additions too: it guards the old behaviour).
    with FakeAgent(
        world.socket_path, settings=dict(idle_release_ms=200), grant_flags=SHARED
    ) as agent:
        client = world.client("linked", "--loops", 2, "--sleep-ms", 1200)
        connection = agent.wait_for_connection()
        client.finish_ok()
        time.sleep(0.2)
    assert connection.all(MessageType.RELEASED) == []
    assert len(connection.all(MessageType.LOCK_REQUEST)) == 1


def test_a_holder_waiting_for_its_own_long_kernel_is_not_idle(world):
    # One launch of a 600 ms kernel, then the thread waits for it: no passage and no
    # queue-bound mark (a mark needs 8 launches) for 600 ms, as PyTorch's loss.item()
    # waits at the end of a step.  A "when idle for 50 ms" drop must wait for the
    # kernel: the shim asks the GPU before it calls that idle.  (It gave the GPU away
    # 50 ms into the kernel, and asked again for the next one.)
    def drop_when_idle(connection, grant):
        connection.drop(grant, WHEN_IDLE, 50)

    with FakeAgent(world.socket_path, on_grant=drop_when_idle) as agent:
        client = world.client(
            "linked",
            "--loops",
            3,
            "--launches",
            1,
            "--launch",
            "kernel",
            "--linger-ms",
            1000,
            kernel_us=600_000,
        )
        connection = agent.wait_for_connection()
        connection.wait_for(MessageType.RELEASED)
        client.finish_ok()
    # Each loop launches its kernel as soon as the last one ends: on an idle machine one
    # release, after the last.  On a starved one the thread may stay off the CPU 50 ms
    # between two loops, which is idle indeed; a release inside a kernel never is.
    launches = world.calls(client.pid, "cuLaunchKernel")
    kernels = [(launch.t, launch.t + 0.6) for launch in launches]
    assert len(kernels) == 3
    for released in connection.all(MessageType.RELEASED):
        inside = [k for k in kernels if k[0] < released.t < k[1]]
        assert not inside, f"released at {released.t} while its kernel {inside} still ran"
