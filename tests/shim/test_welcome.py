"""What the shim announces in HELLO and what it does with the agent's WELCOME
(tests/shim/fake_agent.py plays the agent): it announces YIELD and KEEPALIVE; it
tells an agent that takes GPU_MEMORY each GPU's total memory, and sends no such
frame to one that did not announce it, or to an older agent that sends no WELCOME
(that one still schedules it)."""

from __future__ import annotations

import time

import pytest
from fake_agent import FakeAgent

from nvshare_agent import protocol
from nvshare_agent.protocol import Features, MessageType

GIB = 1 << 30
# The stand-in's GPUs, as NVML would print them ("Standin" + zeros + ordinal).
STANDIN_GPUS = [
    protocol.parse_uuid(f"GPU-5374616e-6469-6e00-0000-00000000000{ordinal}") for ordinal in (0, 1)
]


def test_hello_announces_yield_and_keepalive(world):
    with FakeAgent(world.socket_path) as agent:
        client = world.client("linked", "--loops", 1)
        hello = agent.wait_for_connection().wait_for(protocol.Hello)
        client.finish_ok()
    announced = (
        Features.YIELD | Features.KEEPALIVE | Features.USAGE | Features.MEMORY_CAP | Features.FAIR
    )
    assert hello.message.features == int(announced), hello.message


def test_each_gpus_memory_goes_to_an_agent_that_takes_it_after_its_welcome(world):
    with FakeAgent(world.socket_path) as agent:
        client = world.client(
            "linked", "--loops", 1, STANDIN_DEVICE_COUNT=2, STANDIN_TOTAL_MEM=24 * GIB
        )
        connection = agent.wait_for_connection()
        second = connection.wait_for(MessageType.GPU_MEMORY, count=2)
        client.finish_ok()
    welcome = connection.wait_for_sent(MessageType.WELCOME)
    memory = connection.all(MessageType.GPU_MEMORY)
    assert [(m.message.gpu, m.message.total_bytes) for m in memory] == [
        (gpu, 24 * GIB) for gpu in STANDIN_GPUS
    ]
    assert memory[0].t >= welcome.t and second.t >= welcome.t
    assert len(memory) == 2, "once per connection"


@pytest.mark.parametrize(
    "answer,features",
    [("settings", 0), ("welcome", int(Features.KEEPALIVE))],
    ids=["older-agent", "welcome-without-gpu-memory"],
)
def test_no_gpu_memory_to_an_agent_that_did_not_ask(world, answer, features):
    # This passed before the additions too (no shim sent GPU_MEMORY): it guards that the
    # shim still works with an older agent and sends nothing it did not announce.
    with FakeAgent(world.socket_path, answer=answer, features=features) as agent:
        client = world.client("linked", "--loops", 2)
        connection = agent.wait_for_connection()
        client.finish_ok()
        time.sleep(0.1)
    assert connection.all(MessageType.GPU_MEMORY) == []
    assert connection.all(MessageType.LOCK_REQUEST), "it was scheduled"


def test_a_frame_type_the_shim_does_not_know_is_ignored(world):
    """What a shim from before WELCOME saw of today's agent: SETTINGS, then an 8-byte
    frame of a type it did not know.  The agent sends WELCOME to every shim, whatever
    its HELLO announced, because every shim ignores such a frame (on_frame's default,
    there since the first shim); so will this one, the next addition's WELCOME."""
    unknown = protocol.encode_header(200, 8) + bytes(8)
    with FakeAgent(world.socket_path, answer="settings", after_answer=unknown) as agent:
        client = world.client("linked", "--loops", 2)
        connection = agent.wait_for_connection()
        client.finish_ok()
        time.sleep(0.1)
    assert len(agent.connections) == 1, "it kept the connection"
    assert not client.warnings(), client.describe()
    assert connection.all(MessageType.LOCK_REQUEST), "it was scheduled"
