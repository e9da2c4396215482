"""fork(): the child never inherits the connection or the lock; its CUDA use
works and it connects on its own."""

from shim_harness import STANDIN_GPU


def test_forked_child_uses_cuda_over_its_own_connection(world, agent):
    client = world.client("linked", "--fork", "--loops", 3, "--sleep-ms", 200)
    result = client.finish_ok()
    child = int(result["child_pid"])
    assert result["fork_child"] == "ok"
    agent.wait_for_log(rf"connect pid={child}\b")
    agent.wait_for_log(rf"grant gpu={STANDIN_GPU} pid={child}\b")
    agent.wait_for_log(rf"disconnect pid={child}\b")
    assert [c for c in world.calls(child) if c.gated], "the child ran no GPU work"
    assert client.warnings() == [], client.stderr


def test_fork_without_agent_still_works(world):
    client = world.client("procaddr", "--fork", "--loops", 2)
    assert client.finish_ok()["fork_child"] == "ok"
