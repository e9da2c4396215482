"""Without an agent the application runs unscheduled with one warning; it joins
the agent when one appears, and survives the agent's restart."""

import os
import signal

import pytest
from agent_harness import ShimClient, wait_until
from shim_harness import STANDIN_GPU

from nvshare_agent import protocol


def test_client_finishes_without_agent_with_one_warning(world):
    client = world.client("linked", "--loops", 3)
    result = client.finish_ok(timeout=30)
    assert result["managed"] == "1"
    assert len(client.warnings()) == 1, client.stderr
    assert client.stderr.count("\n") == 1, f"only the warning, nothing else:\n{client.stderr}"


@pytest.mark.slow
def test_client_joins_an_agent_started_later(world):
    client = world.client("dlsym", "--duration-ms", 8000, "--sleep-ms", 100, "--launches", 2)
    wait_until(
        lambda: [c for c in world.calls(client.pid) if c.gated],
        what="the client to run unscheduled",
    )
    agent = world.start_agent()
    agent.wait_for_log(rf"connect pid={client.pid}\b")
    agent.wait_for_log(rf"grant gpu={STANDIN_GPU} pid={client.pid}\b")
    client.finish_ok()
    assert len(client.warnings()) == 1, client.stderr


@pytest.mark.slow
def test_client_keeps_running_across_an_agent_restart(world):
    first = world.start_agent()
    client = world.client("procaddr", "--duration-ms", 8000, "--sleep-ms", 100, "--launches", 2)
    first.wait_for_log(rf"grant gpu={STANDIN_GPU} pid={client.pid}\b")
    assert first.stop() == 0
    launches_before = len([c for c in world.calls(client.pid) if c.gated])
    second = world.start_agent()
    second.wait_for_log(rf"connect pid={client.pid}\b")
    second.wait_for_log(rf"grant gpu={STANDIN_GPU} pid={client.pid}\b")
    client.finish_ok()
    assert len([c for c in world.calls(client.pid) if c.gated]) > launches_before
    assert len(client.warnings()) <= 1, client.stderr
    # The client has exited; the agent notices its closed socket a moment later.
    second.wait_for_log(rf"disconnect pid={client.pid}\b")


def test_client_waiting_for_a_grant_goes_on_when_the_agent_dies(world):
    agent = world.start_agent()
    gpu = protocol.parse_uuid(STANDIN_GPU)
    with ShimClient(world.socket_path, gpus=(gpu,), command="holder") as holder:
        holder.request(gpu)
        holder.wait_grant(gpu)
        client = world.client("procaddr", "--loops", 2)
        agent.wait_for_log(rf"request gpu={STANDIN_GPU} pid={client.pid}\b")
        assert not [c for c in world.calls(client.pid) if c.gated]
        os.kill(agent.process.pid, signal.SIGKILL)  # no goodbye: the socket just closes
        agent.process.wait()
        client.finish_ok(timeout=30)
    assert len(client.warnings()) == 1, client.stderr
