"""A client that hangs up is an event like any other (issue 36, point 3): what it
sent before it closed, read after the agent has already let it go, is dropped
quietly; nothing reaches the core for a client the core no longer knows."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from agent_harness import GPU0, ShimClient, wait_until

from nvshare_agent import protocol
from nvshare_agent.engine import Engine
from nvshare_agent.protocol import Features, MessageType
from nvshare_agent.settings import AntiThrash, Settings
from nvshare_agent.settings_files import SettingsStore

LONG_QUANTUM = "[scheduler]\ntime_quantum = 3600\nanti_thrash = on\ndrop_grace_ms = 300\n"


def assert_no_traceback(agent) -> None:
    log = agent.log()
    assert "Traceback" not in log and "Fatal error" not in log, log[-4000:]


@pytest.mark.parametrize(
    "last_frame",
    [
        pytest.param(lambda gpu: protocol.encode_lock(MessageType.LOCK_REQUEST, gpu), id="request"),
        pytest.param(lambda gpu: protocol.encode_memory_report(gpu, 1 << 20, 0), id="memory"),
        pytest.param(lambda gpu: protocol.encode_gpu_memory(gpu, 16 << 30), id="gpu_memory"),
        pytest.param(lambda gpu: protocol.encode_lock(MessageType.RELEASED, gpu, 1), id="released"),
    ],
)
def test_last_frames_of_a_waiter_that_hung_up_are_dropped_quietly(start_agent, last_frame):
    agent = start_agent(config=LONG_QUANTUM, debug=True)
    holder = ShimClient(agent.socket_path, command="holder")
    holder.request()
    grant = holder.wait_grant()
    waiter = ShimClient(agent.socket_path, command="waiter")
    waiter.request()
    agent.wait_for_log(r"queued gpu=")
    # While the agent is busy (stopped, here) the holder releases, then the waiter
    # sends one more frame and hangs up.  The agent reads the release first: the
    # GPU would go to the waiter, which is gone; the waiter's frame comes after.
    os.kill(agent.process.pid, signal.SIGSTOP)
    try:
        holder.release(grant)
        waiter.send_raw(last_frame(grant.gpu))
        waiter.close()
    finally:
        os.kill(agent.process.pid, signal.SIGCONT)
    agent.wait_for_log(r"INFO disconnect pid=")
    holder.request()  # the GPU is free again, and the agent serves on
    holder.wait_grant()
    holder.close()
    wait_until(lambda: agent.log().count("INFO disconnect pid=") >= 2, what="both disconnects")
    assert agent.alive()
    assert_no_traceback(agent)
    assert agent.log().count(" grant gpu=") == 2, agent.log()[-3000:]  # none to the waiter


def test_frames_after_a_request_granted_to_a_client_that_hung_up_are_not_read(start_agent):
    """The client's own batch grants it the free GPU, but it has hung up: the rest of
    that batch must not reach the core (which has let it go, or is about to)."""
    agent = start_agent(config=LONG_QUANTUM, debug=True)
    client = ShimClient(agent.socket_path, command="gone")
    os.kill(agent.process.pid, signal.SIGSTOP)
    try:
        client.send_raw(
            protocol.encode_lock(MessageType.LOCK_REQUEST, GPU0)
            + protocol.encode_memory_report(GPU0, 1 << 20, 0)
            + protocol.encode_lock(MessageType.RELEASED, GPU0, 1)
        )
        client.close()
    finally:
        os.kill(agent.process.pid, signal.SIGCONT)
    agent.wait_for_log(r"INFO disconnect pid=")
    with ShimClient(agent.socket_path, command="next") as after:
        after.request()
        after.wait_grant()
    assert agent.alive()
    assert_no_traceback(agent)


# ---------------------------------------------------------------- the engine, without sockets


class FakeLink:
    """A ClientLink that records frames; hang_up() is what the socket adapter reports."""

    def __init__(self, engine: Engine, pid: int):
        self.engine, self.pid, self.uid, self.gid = engine, pid, 1000, 1000
        self.greeted, self.features = False, int(Features.KEEPALIVE)
        self.sent: list = []
        self.peer_closed = False
        self.closed = False
        self.client = engine.client_connected(self)

    def send(self, frame: bytes) -> None:
        self.sent.extend(protocol.FrameReader().feed(frame))

    def hung_up(self) -> bool:
        return self.peer_closed

    def close(self, code: int, reason: str) -> None:
        self.close_hung_up()

    def close_hung_up(self) -> None:
        if not self.closed:
            self.closed = True
            self.engine.client_gone(self.client)

    def hello(self) -> None:
        self.engine.client_message(self.client, protocol.Hello((GPU0,), "fake"), 0.0)

    def frame(self, message) -> None:
        self.engine.client_message(self.client, message, self.engine.loop.time())
        self.engine.batch_done()

    def grants(self) -> list:
        return [m for m in self.sent if getattr(m, "type", None) == MessageType.LOCK_GRANT]


def lock(msg_type, lease: int = 0) -> protocol.LockMessage:
    return protocol.LockMessage(msg_type, GPU0, lease)


LATE_FRAMES = [
    lock(MessageType.LOCK_REQUEST),
    lock(MessageType.RELEASED, 1),
    protocol.MemoryReport(GPU0, 1 << 20, 0),
    protocol.GpuMemory(GPU0, 16 << 30),
    protocol.Hello((GPU0,), "again"),
]


@pytest.fixture
async def engine(tmp_path):
    engine = Engine(
        Settings(time_quantum_s=3600, anti_thrash=AntiThrash.ON),
        SettingsStore(tmp_path / "state"),
        loop=asyncio.get_running_loop(),
    )
    yield engine
    engine.cancel_timers()


@pytest.mark.parametrize(
    "late", LATE_FRAMES, ids=["request", "released", "memory_report", "gpu_memory", "hello"]
)
async def test_frames_for_a_client_gone_are_dropped_before_and_after_the_core_hears(engine, late):
    holder, waiter = FakeLink(engine, 1), FakeLink(engine, 2)
    holder.hello(), waiter.hello()
    holder.frame(lock(MessageType.LOCK_REQUEST))
    engine.client_gone(waiter.client)
    waiter.frame(late)  # the core still knows it: the engine does not pass it on
    await asyncio.sleep(0)  # the hang-up reaches the core
    assert waiter.client not in engine.core.clients
    waiter.frame(late)  # and now the core has forgotten it: no KeyError
    assert len(holder.grants()) == 1 and not waiter.grants()


async def test_a_grant_to_a_client_that_hung_up_frees_the_gpu_after_the_batch(engine):
    holder, waiter, third = FakeLink(engine, 1), FakeLink(engine, 2), FakeLink(engine, 3)
    for link in (holder, waiter, third):
        link.hello()
    holder.frame(lock(MessageType.LOCK_REQUEST))
    waiter.frame(lock(MessageType.LOCK_REQUEST))
    third.frame(lock(MessageType.LOCK_REQUEST))
    waiter.peer_closed = True
    await asyncio.sleep(0)  # the rules look once the loop's turn is done (batch_done)
    (grant,) = holder.grants()
    holder.frame(lock(MessageType.RELEASED, grant.lease))
    await asyncio.sleep(0)
    # Not granted, and not called back into the core while it was being carried out:
    # the core still lists the waiter until its hang-up, an event, reaches it.
    assert not waiter.grants() and waiter.closed
    assert waiter.client in engine.core.clients and not third.grants()
    waiter.frame(protocol.MemoryReport(GPU0, 1 << 20, 0))  # read after: dropped
    await asyncio.sleep(0)  # the hang-up reaches the core ...
    assert waiter.client not in engine.core.clients
    await asyncio.sleep(0)  # ... and the rules look
    assert len(third.grants()) == 1


async def test_keepalives_and_timers_skip_a_client_gone(engine):
    engine.core.hello_timeout_s = 0.0  # a client without HELLO is due to be refused at once
    holder, waiter, silent = FakeLink(engine, 1), FakeLink(engine, 2), FakeLink(engine, 3)
    holder.hello(), waiter.hello()
    holder.frame(lock(MessageType.LOCK_REQUEST))
    waiter.frame(lock(MessageType.LOCK_REQUEST))
    waiter.sent.clear()
    engine.client_gone(waiter.client)
    engine.client_gone(silent.client)
    # Before their hang-ups reach the core: it still queues the waiter and still has
    # the silent one's HELLO deadline.
    engine.keepalives.send()
    engine.timer.fire()
    assert not waiter.sent and not silent.sent
    await asyncio.sleep(0)
    assert set(engine.core.clients) == {holder.client}
