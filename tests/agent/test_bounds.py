"""What a client can make the agent track, and grants to clients already gone
(issue 27, points 4 and 5), over real sockets against the agent process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from agent_harness import TIMEOUT_S, ShimClient, wait_until

from nvshare_agent import protocol
from nvshare_agent.learned_gpus import MAX_LEARNED_GPUS_PER_UID
from nvshare_agent.protocol import ErrorCode

FAKE_NVML = Path(__file__).resolve().parent / "fake_nvml"
FAKE_GPU = protocol.parse_uuid("GPU-0d84ee44-b797-1c71-8ccd-cefec22161de")  # fake_nvml's first
FAKE_MIG = protocol.parse_uuid("5c3f2a11-0000-4000-8000-000000000001")  # fake_nvml's MIG instance
LONG_QUANTUM = "[scheduler]\ntime_quantum = 3600\nanti_thrash = on\ndrop_grace_ms = 300\n"


def nvml_env(**extra) -> dict:
    path = os.pathsep.join([str(FAKE_NVML), *(p for p in sys.path if p)])
    return {"PYTHONPATH": path, "FAKE_NVML": "two-gpus", **extra}


def test_with_an_inventory_a_made_up_gpu_is_refused_with_a_reason(start_agent):
    agent = start_agent(env=nvml_env())
    agent.wait_for_log(r"gpu uuid=GPU-0d84ee44")
    invented = os.urandom(16)
    with ShimClient(agent.socket_path, gpus=(FAKE_GPU, invented), hello=False) as client:
        client.send_raw(protocol.encode_hello((FAKE_GPU, invented), "inventor"))
        error = client.expect_closed()
    assert error is not None and error.code == ErrorCode.PROTOCOL
    assert error.text == f"GPU {protocol.format_uuid(invented)} is not on this node"
    # The node's own GPUs, and its MIG instances, are welcome.
    with ShimClient(agent.socket_path, gpus=(FAKE_GPU, FAKE_MIG)) as client:
        client.request(FAKE_GPU)
        client.wait_grant(FAKE_GPU)


def test_without_an_inventory_one_uid_may_make_the_agent_track_only_so_many_gpus(start_agent):
    agent = start_agent()  # no NVML here: GPUs are learnt from clients
    clients, refused = [], None
    try:
        while refused is None and len(clients) < 20:
            gpus = [os.urandom(16) for _ in range(protocol.MAX_GPUS)]
            client = ShimClient(agent.socket_path, gpus=gpus, hello=False)
            client.send_raw(protocol.encode_hello(gpus, "many"))
            answer = client.recv()
            if isinstance(answer, protocol.Error):
                refused = answer
            clients.append(client)
        assert refused is not None and refused.text == (
            f"uid {os.getuid()} already named {MAX_LEARNED_GPUS_PER_UID} GPUs the agent cannot see"
        )
    finally:
        for client in clients:
            client.close()


WAITERS = 40
# One waiter per process, as real shims are.
WAITER = textwrap.dedent(
    """
    import sys, time
    sys.path[:0] = sys.argv[2].split(":")
    from agent_harness import ShimClient
    waiter = ShimClient(sys.argv[1], command="crowd")
    waiter.request()
    print("ready", flush=True)
    time.sleep(3600)
    """
)


@pytest.mark.slow  # forty processes to start
def test_clients_that_die_together_are_not_granted_the_lock_in_turn(start_agent):
    agent = start_agent(config=LONG_QUANTUM)
    path = os.pathsep.join([str(Path(__file__).resolve().parent), *sys.path])
    holder = ShimClient(agent.socket_path, command="holder")
    holder.request()
    grant = holder.wait_grant()
    crowd = []
    try:
        for _ in range(WAITERS):  # queued one after the other, in a process group of their own
            crowd.append(
                subprocess.Popen(
                    [sys.executable, "-c", WAITER, str(agent.socket_path), path],
                    stdout=subprocess.PIPE,
                    text=True,
                    process_group=crowd[0].pid if crowd else 0,
                )
            )
            assert crowd[-1].stdout.readline().strip() == "ready"
        with ShimClient(agent.socket_path, command="survivor") as survivor:
            survivor.request()  # behind the whole crowd
            holder.release(grant)  # the first of the crowd gets the GPU and keeps it
            wait_until(lambda: agent.log().count(" grant gpu=") == 2, what="the crowd's grant")
            # The whole crowd dies while the agent is busy (stopped, here): when it looks
            # again, every one of their hang-ups is waiting for it.
            os.kill(agent.process.pid, signal.SIGSTOP)
            try:
                os.killpg(crowd[0].pid, signal.SIGKILL)
                for process in crowd:
                    process.wait()
            finally:
                os.kill(agent.process.pid, signal.SIGCONT)
            survivor.wait_grant(timeout=TIMEOUT_S)
            wait_until(
                lambda: agent.log().count(" disconnect pid=") >= WAITERS,
                what="every disconnect logged",
            )
        grants_to_the_dead = agent.log().count(" grant gpu=") - 3  # holder, crowd's first, survivor
        # Before, each disconnect granted the next waiter, itself gone but not yet seen.
        assert grants_to_the_dead == 0, agent.log()[-3000:]
    finally:
        holder.close()
        for process in crowd:
            process.kill()
            process.wait()


def test_memory_outside_nvshare_counts_towards_auto(start_agent, tmp_path):
    """NVML's per-process figures reach auto: a process outside nvshare holding most
    of the GPU turns it to exclusive turns."""
    table = tmp_path / "processes.json"
    table.write_text(json.dumps({"GPU-0d84ee44-b797-1c71-8ccd-cefec22161de": []}))
    agent = start_agent(
        config="[scheduler]\nanti_thrash = auto\n",
        env=nvml_env(FAKE_NVML_PROCESSES=str(table)),
    )
    agent.wait_for_log(r"gpu uuid=GPU-0d84ee44")
    with ShimClient(agent.socket_path, gpus=(FAKE_GPU,)) as client:
        client.request(FAKE_GPU)
        client.wait_grant(FAKE_GPU)
        table.write_text(
            json.dumps({"GPU-0d84ee44-b797-1c71-8ccd-cefec22161de": [[999999, 80 << 30]]})
        )
        agent.wait_for_log(r"mode gpu=GPU-0d84ee44\S* mode=exclusive .*reason=nvml_reading")


class CountingGpus(dict):
    """The core's GPU table, counting every walk over all of it."""

    walks = 0

    def _walked(self):
        CountingGpus.walks += 1

    def values(self):
        self._walked()
        return super().values()

    def items(self):
        self._walked()
        return super().items()

    def keys(self):
        self._walked()
        return super().keys()

    def __iter__(self):
        self._walked()
        return super().__iter__()


async def test_a_request_costs_the_same_however_many_gpus_others_named(start_inproc_agent):
    # Point 4: with a thousand GPUs tracked, a request, a queued one, a release and the grant
    # that follows touch the requester's GPU alone: nothing walks every GPU per frame.
    from agent_harness import GPU0, AsyncShimClient

    from nvshare_agent.nvml import GpuInfo
    from nvshare_agent.settings import AntiThrash, Settings

    agent, path = await start_inproc_agent(
        Settings(time_quantum_s=3600, anti_thrash=AntiThrash.ON, drop_grace_ms=300)
    )
    others = [GpuInfo(os.urandom(16), "other", 80 << 30, index) for index in range(1, 1000)]
    agent.add_gpus([GpuInfo(GPU0, "mine", 80 << 30, 0), *others])
    holder = await AsyncShimClient.connect(path, (GPU0,), command="holder")
    waiter = await AsyncShimClient.connect(path, (GPU0,), command="waiter")
    agent.core.gpus = CountingGpus(agent.core.gpus)
    CountingGpus.walks = 0
    holder.request()
    grant = await holder.wait_grant()
    waiter.request()
    while not agent.core.gpus[GPU0].waiters:
        await asyncio.sleep(0.005)
    holder.release(grant)
    await waiter.wait_grant()
    assert CountingGpus.walks == 0
    await holder.close()
    await waiter.close()
