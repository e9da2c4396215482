"""Stream-ordered frees (cuMemFreeAsync) of converted memory are parked, not freed: the next
stream-ordered allocation that fits takes the block back without a synchronous
cuMemAllocManaged, but only where stream order allows it (the same stream, or the free's
point on its stream is done).  Parked memory is given up for allocations that need room."""

MIB = 1 << 20
SPIN_US = 300_000


def real_frees(world, client):
    """The cuMemFree_v2 calls of client that freed something."""
    return [
        c for c in world.calls(client.pid, "cuMemFree_v2") if int(c.fields.get("result", 0)) == 0
    ]


def test_a_freed_block_comes_back_only_where_stream_order_allows(world, agent):
    client = world.client("stream_ordered", "reuse", kernel_us=SPIN_US)
    result = client.finish_ok()
    assert result["same_stream"] == "1", "the freeing stream could not reuse its block"
    assert result["other_pending"] == "0", (
        "another stream got a block its freeing stream still used"
    )
    assert result["other_done"] == "1", "a block whose stream was done did not come back"
    assert (result["bigger"], result["quarter"], result["smaller"]) == ("0", "0", "1")
    assert result["counted"] == "42"
    assert result["freed_twice"] == "1", (
        "freeing a parked block again must be CUDA_ERROR_INVALID_VALUE"
    )
    assert result["freed_twice_async"] == "1"
    # Fresh blocks only for a, c (other stream, pending), e (bigger) and f (quarter).
    fresh = world.calls(client.pid, "cuMemAllocManaged")
    assert len(fresh) == 4, [c.fields for c in fresh]
    # No free waited for its stream: the application thread's synchronisations are the
    # client's own four (the shim's client thread syncs its prefetch stream on grants).
    on_app_thread = [
        c for c in world.calls(client.pid, "cuStreamSynchronize") if c.tid == client.pid
    ]
    assert len(on_app_thread) == 4, [c.fields for c in on_app_thread]
    assert client.warnings() == []


def test_parked_memory_is_bounded_and_gives_way_to_allocations(world, agent):
    # A GPU of 64 MiB parks at most 8 MiB; 80 MiB cannot fit however many are freed, so none
    # is; a 60 MiB allocation then frees what it needs.
    client = world.client("stream_ordered", "cap", 12, kernel_us=10, STANDIN_TOTAL_MEM=64 * MIB)
    result = client.finish_ok()
    assert (result["huge_alloc"], result["big_alloc"]) == ("refused", "ok")
    freed = real_frees(world, client)
    # 4 over the cap as they are parked, 4 more for the big allocation, then the big one.
    assert len(freed) == 9, [c.fields for c in freed]
    stale = [
        line
        for line in world.standin_log.read_text().splitlines()
        if line.startswith(f"{client.pid} ") and "stale" in line
    ]
    assert not stale, stale[:5]


def test_a_context_parks_at_most_32_blocks(world, agent):
    # On a large GPU the byte cap is far: the 33rd to 40th frees each free the oldest block.
    client = world.client("stream_ordered", "cap", 40, kernel_us=10)
    assert client.finish_ok()["big_alloc"] == "ok"
    freed = real_frees(world, client)
    assert len(freed) == 8 + 2, [c.fields for c in freed]  # and the huge and big ones


def test_a_pool_trim_frees_parked_blocks_down_to_what_it_keeps(world, agent):
    # 12 parked MiB (far under the byte cap of a 16 GiB GPU), trimmed to keep 2 MiB.
    client = world.client("stream_ordered", "trim", 12, kernel_us=10)
    assert client.finish_ok()["big_alloc"] == "ok"
    assert len(world.calls(client.pid, "cuMemPoolTrimTo")) == 1
    freed = real_frees(world, client)
    assert len(freed) == 10 + 2, [c.fields for c in freed]  # and the huge and big ones
