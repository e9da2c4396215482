"""Two copies of the shim in one process: LD_PRELOAD naming one (a habit from the
original nvshare, or a build tree) on a node whose /etc/ld.so.preload names the
installed one, or the portable build beside the host's.  The first copy hooks
the process; the other stays out of the way.  Before, every CUDA program
recursed in cuInit until its stack ran out."""

import shutil

import pytest
from shim_harness import PORTABLE_SHIM, SHIM, STANDIN_GPU, without_node_preload


@pytest.fixture
def second_copy(tmp_path):
    # A copy under another name is another object to the dynamic linker.
    copy = tmp_path / "libnvshare-copy.so"
    shutil.copy(SHIM, copy)
    return copy


@pytest.mark.parametrize("name", ["linked", "dlsym", "procaddr"])
def test_a_second_copy_leaves_the_process_to_the_first(world, agent, second_copy, name):
    client = world.client(
        name,
        "--loops",
        2,
        "--stream",
        env=world.env(NVSHARE_DEBUG=1, preload=f"{SHIM} {second_copy}"),
        # Two copies exactly: on a node with nvshare installed, its copy would be a third.
        prefix=without_node_preload(),
    )
    result = client.finish_ok()
    assert result["managed"] == "1", client.describe()
    assert client.stderr.count("another copy of libnvshare.so came first") == 1, client.describe()
    log = world.settled(agent, client)
    # One client of the agent, and all the work gated through it.
    assert log.count(f"INFO connect pid={client.pid} ") == 1, log
    assert f"grant gpu={STANDIN_GPU} pid={client.pid} " in log, log
    assert [c for c in world.calls(client.pid) if c.function.startswith("cuLaunch")], (
        "no launch reached the driver"
    )


def test_the_portable_build_beside_the_hosts_in_either_order(world, agent):
    for preload in (f"{SHIM} {PORTABLE_SHIM}", f"{PORTABLE_SHIM} {SHIM}"):
        client = world.client("linked", "--loops", 1, env=world.env(preload=preload))
        assert client.finish_ok()["managed"] == "1", client.describe()
        log = world.settled(agent, client)
        assert log.count(f"INFO connect pid={client.pid} ") == 1, log
