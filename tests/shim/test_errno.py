"""Hooks preserve errno: every successful driver call leaves the caller's errno
as it was, whether the call connected to the agent, waited for a grant, or
found no agent at all."""

from agent_harness import ShimClient
from shim_harness import STANDIN_GPU

from nvshare_agent import protocol

GPU = protocol.parse_uuid(STANDIN_GPU)
WORKLOAD = ("--errno", "--loops", 2, "--sleep-ms", 300, "--vmm", "--ipc", "--alloc", "pitch")


def test_errno_is_kept_while_waiting_for_a_grant(world, agent):
    with ShimClient(world.socket_path, gpus=(GPU,), command="holder") as holder:
        holder.request(GPU)
        grant = holder.wait_grant(GPU)
        client = world.client("linked", *WORKLOAD)
        agent.wait_for_log(rf"request gpu={STANDIN_GPU} pid={client.pid}\b")
        holder.release(grant)
        assert client.finish_ok()["errno"] == "kept"


def test_errno_is_kept_without_an_agent(world):
    assert world.client("procaddr", *WORKLOAD).finish_ok()["errno"] == "kept"
