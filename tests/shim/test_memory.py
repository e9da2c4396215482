"""Device memory becomes managed memory (and is prefetched on each grant); what cannot be managed is
passed through; cuMemGetInfo and the per-process limit behave as on a GPU of one's own."""

import re
import subprocess

import pytest
from shim_harness import CLIENTS, REPO, STANDIN_GPU, without_node_preload

GIB = 1 << 30


@pytest.mark.parametrize("name", CLIENTS)
def test_clients_work_against_the_standin_alone(world, name):
    # The fixture itself: no shim, no agent, device memory stays device memory.
    client = world.client(
        name,
        "--loops",
        2,
        "--fork",
        "--vmm",
        "--ipc",
        "--errno",
        env=world.env(preload=None),
        prefix=without_node_preload(),
    )
    result = client.finish_ok()
    assert result["managed"] == "0" and result["errno"] == "kept"
    assert result["fork_child"] == "ok" and result["vmm"] == "ok" and result["ipc"] == "ok"
    assert client.stderr == ""
    assert world.calls(client.pid, "cuMemAlloc_v2")


@pytest.mark.parametrize(
    "name,alloc",
    [(n, "plain") for n in CLIENTS]
    + [("linked", "pitch"), ("dlsym", "async"), ("procaddr", "pitch")],
)
def test_device_allocations_become_managed(world, agent, name, alloc):
    client = world.client(name, "--alloc", alloc, "--loops", 2)
    result = client.finish_ok()
    assert result["managed"] == "1", (
        "cuPointerGetAttribute(IS_MANAGED) says the buffer is not managed"
    )
    functions = [c.function for c in world.calls(client.pid)]
    assert "cuMemAllocManaged" in functions
    for device_alloc in (
        "cuMemAlloc_v2",
        "cuMemAllocPitch_v2",
        "cuMemAllocAsync",
        "cuMemAllocAsync_ptsz",
    ):
        assert device_alloc not in functions, f"{device_alloc} reached the driver"
    assert client.warnings() == []


def test_managed_allocation_reaches_the_driver_unchanged(world, agent):
    client = world.client("linked", "--alloc", "managed", "--loops", 1)
    assert client.finish_ok()["managed"] == "1"


@pytest.mark.parametrize("preload", [True, False], ids=["shim", "standin-alone"])
def test_mem_get_info_reports_the_whole_gpu_less_own_allocations(world, agent, preload):
    # Under the shim the buffer is managed (the driver's free memory does not
    # move), yet the process must see what it would see on a GPU of its own.
    total, buffer = 8 * GIB, 64 << 20
    env = (
        world.env(STANDIN_TOTAL_MEM=total)
        if preload
        else world.env(STANDIN_TOTAL_MEM=total, preload=None)
    )
    client = world.client(
        "procaddr",
        "--meminfo",
        "--loops",
        1,
        "--ints",
        buffer // 4,
        env=env,
        prefix=[] if preload else without_node_preload(),
    )
    result = client.finish_ok()
    assert result["managed"] == ("1" if preload else "0")
    assert int(result["mem_total"]) == total
    assert int(result["mem_free"]) == total
    assert int(result["mem_free_after_alloc"]) == total - buffer


def test_one_process_may_not_allocate_past_the_gpu(world, agent):
    client = world.client("linked", "--big-alloc", 2 * GIB, "--loops", 1, STANDIN_TOTAL_MEM=GIB)
    result = client.finish_ok()
    assert result["big_alloc"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert not [
        c for c in world.calls(client.pid, "cuMemAllocManaged") if int(c.fields["bytes"]) == 2 * GIB
    ]


def test_single_oversubscription_when_enabled(world, agent):
    client = world.client(
        "dlsym",
        "--big-alloc",
        2 * GIB,
        "--loops",
        1,
        STANDIN_TOTAL_MEM=GIB,
        NVSHARE_ENABLE_SINGLE_OVERSUB=1,
    )
    result = client.finish_ok()
    assert result["big_alloc"] == "ok"
    big = [
        c for c in world.calls(client.pid, "cuMemAllocManaged") if int(c.fields["bytes"]) == 2 * GIB
    ]
    assert big and big[0].fields["result"] == "0"


def test_a_handle_opened_twice_is_counted_once_and_uncounted_at_its_last_close(world, agent):
    # The driver maps an IPC handle opened again in the same context once, counting
    # references; so must the shim, or the mapping stays counted after its last close.
    total, buffer = 8 * GIB, 64 << 20
    client = world.client(
        "linked", "--ipc", "--meminfo", "--loops", 1, "--ints", buffer // 4, STANDIN_TOTAL_MEM=total
    )
    result = client.finish_ok()
    assert result["ipc_same_mapping"] == "1"
    assert (
        int(result["mem_free_after_ipc"]) == int(result["mem_free_after_alloc"]) == total - buffer
    )


@pytest.mark.parametrize("order", ["unmap-then-release", "release-then-unmap"])
def test_vmm_memory_counts_until_both_unmapped_and_released(world, agent, order):
    # The driver frees a cuMemCreate allocation once its handle's references are released
    # and its mappings are gone, in any order (the CUDA guide releases right after mapping;
    # the workload also releases a handle it retained from the mapped address, as NCCL does).
    total, buffer = 8 * GIB, 64 << 20
    vmm = "--vmm" if order == "unmap-then-release" else "--vmm-release-first"
    client = world.client(
        "linked", vmm, "--meminfo", "--loops", 1, "--ints", buffer // 4, STANDIN_TOTAL_MEM=total
    )
    result = client.finish_ok()
    assert int(result["mem_free_vmm_mapped"]) == total - buffer - int(result["vmm_bytes"])
    assert int(result["mem_free_after_vmm"]) == total - buffer


def test_vmm_and_ipc_pass_through_with_one_warning_each(world, agent):
    client = world.client("linked", "--vmm", "--ipc", "--loops", 3)
    result = client.finish_ok()
    assert result["vmm"] == "ok" and result["ipc"] == "ok"
    assert len(world.calls(client.pid, "cuMemCreate")) == 3, "VMM allocations must reach the driver"
    assert len(world.calls(client.pid, "cuIpcOpenMemHandle_v2")) == 2
    warnings = client.warnings()
    assert len(warnings) == len(set(warnings)), f"a warning repeated:\n{client.stderr}"
    vmm = [w for w in warnings if "cuMemCreate" in w or "VMM" in w or "virtual memory" in w]
    ipc = [w for w in warnings if "Ipc" in w or "IPC" in w]
    assert (len(vmm), len(ipc), len(warnings)) == (1, 1, 2), (
        f"one warning each for VMM and IPC:\n{client.stderr}"
    )


def test_agent_learns_the_gpu_from_the_client(world, agent):
    client = world.client("linked", "--loops", 1)
    client.finish_ok()
    agent.wait_for_log(rf"connect pid={client.pid} .*gpus={STANDIN_GPU}")


def prefetches(world, pid):
    return [c for c in world.calls(pid) if c.function.startswith("cuMemPrefetchAsync")]


def loops_over_one_buffer(world, after_ms: int, **env):
    """Three bursts over a 1 MiB managed buffer, 400 ms apart (a grant each)."""
    return world.client(
        "linked",
        "--loops",
        3,
        "--sleep-ms",
        400,
        "--ints",
        1 << 18,
        NVSHARE_PREFETCH_AFTER_MS=after_ms,
        **env,
    )


def test_each_grant_prefetches_the_managed_memory(world, agent):
    # Every grant, however short the absence before it (by default only after a second).
    client = loops_over_one_buffer(world, after_ms=0)
    client.finish_ok()
    grants = len(
        re.findall(rf"grant gpu={STANDIN_GPU} pid={client.pid}\b", world.settled(agent, client))
    )
    buffer = world.calls(client.pid, "cuMemAllocManaged")[0].fields["ptr"]
    mine = [c for c in prefetches(world, client.pid) if c.fields["ptr"] == buffer]
    assert len(mine) >= grants >= 3, f"{len(mine)} prefetches of the buffer for {grants} grants"
    assert all(c.fields["result"] == "0" and c.fields["bytes"] == str(1 << 20) for c in mine)


def test_a_grant_after_a_short_absence_does_not_prefetch(world, agent):
    # Back from a window of light work: what stayed resident would cost ~0.7 ms a GiB.
    client = loops_over_one_buffer(world, after_ms=60000)
    client.finish_ok()
    log = world.settled(agent, client)
    assert len(re.findall(rf"grant gpu={STANDIN_GPU} pid={client.pid}\b", log)) >= 3, log
    buffer = world.calls(client.pid, "cuMemAllocManaged")[0].fields["ptr"]
    mine = [c for c in prefetches(world, client.pid) if c.fields["ptr"] == buffer]
    assert len(mine) == 1, "the first grant only (no lease ended before it)"


TURNS_WHERE_NOTHING_FITS = """\
[scheduler]
time_quantum = 1
anti_thrash = on
idle_release_ms = 100
drop_grace_ms = 300
"""
# A GPU of 1 GiB: two contexts (counted 512 MiB each without NVML) do not fit in its own
# memory, so they page (memory_limit alone would keep them apart, but move nothing).
SMALL_GPU = {"STANDIN_TOTAL_MEM": 1 << 30}


def test_a_grant_after_another_turn_that_did_not_fit_prefetches_however_soon(world):
    # The agent says DISPLACED: the other's turn alone on the GPU may have pushed this
    # one's pages to the host, and faults would bring them back at a sixth of the speed.
    # Turns (anti-thrash on, 1 s) where nothing fits beside anything.
    agent = world.start_agent(config=TURNS_WHERE_NOTHING_FITS)
    other = world.client(
        "linked", "--ints", 1 << 18, "--duration-ms", 2500, "--sleep-ms", 20, **SMALL_GPU
    )
    agent.wait_for_log(rf"grant gpu={STANDIN_GPU} pid={other.pid}\b")
    client = loops_over_one_buffer(world, after_ms=60000, **SMALL_GPU)  # alone: never again
    client.finish_ok()
    other.finish_ok()
    log = world.settled(agent, client, other)
    grants = re.findall(rf"grant gpu={STANDIN_GPU} pid={client.pid}\b.*", log)
    displaced = [g for g in grants if "displaced=1" in g]
    assert displaced, grants  # the other held the GPU with its memory before each
    buffer = world.calls(client.pid, "cuMemAllocManaged")[0].fields["ptr"]
    mine = [c for c in prefetches(world, client.pid) if c.fields["ptr"] == buffer]
    # The buffer exists from the first grant on; every later grant that says so prefetches.
    later_displaced = [g for g in grants[1:] if "displaced=1" in g]
    assert len(mine) == 1 + len(later_displaced) >= 2, (len(mine), grants)


def test_prefetch_can_be_turned_off(world, agent):
    client = world.client("linked", "--loops", 2, "--sleep-ms", 400, NVSHARE_PREFETCH=0)
    client.finish_ok()
    assert prefetches(world, client.pid) == []


@pytest.mark.slow  # several seconds: make check runs it, check-fast does not
def test_a_shim_built_to_split_the_prefetch_covers_each_buffer_in_chunks_over_its_streams(
    world, agent, tmp_path
):
    """The build option bench/gpu/prefetch_split.py measures (the product's build makes one call)."""
    build = tmp_path / "split"
    subprocess.run(
        [
            "make",
            "-s",
            "-C",
            str(REPO / "shim"),
            f"BUILD={build}",
            "CPPFLAGS=-DNVSHARE_PREFETCH_STREAMS=4 -DNVSHARE_PREFETCH_CHUNK_BYTES=262144",
        ],
        check=True,
    )
    client = world.client(
        "linked",
        "--loops",
        2,
        "--sleep-ms",
        400,
        "--ints",
        1 << 18,
        env=world.env()
        | {"LD_PRELOAD": str(build / "libnvshare.so"), "NVSHARE_PREFETCH_AFTER_MS": "0"},
    )
    client.finish_ok()
    world.settled(agent, client)
    buffer = int(world.calls(client.pid, "cuMemAllocManaged")[0].fields["ptr"], 16)
    chunks = [
        c
        for c in prefetches(world, client.pid)
        if buffer <= int(c.fields["ptr"], 16) < buffer + (1 << 20)
    ]
    assert len(chunks) >= 8 and len(chunks) % 4 == 0, f"{len(chunks)} chunks for two grants or more"
    for grant in range(len(chunks) // 4):
        one_grant = chunks[4 * grant : 4 * grant + 4]
        assert [int(c.fields["ptr"], 16) - buffer for c in one_grant] == [
            0,
            1 << 18,
            2 << 18,
            3 << 18,
        ]
        assert all(
            c.fields["bytes"] == str(1 << 18) and c.fields["result"] == "0" for c in one_grant
        )
        assert len({c.fields["stream"] for c in one_grant}) == 4, "one chunk per stream"
