"""A process with several CUDA contexts on one GPU, or one that destroys a context or
resets its primary context (cudaDeviceReset) and goes on.

A release must wait for the work of every context, not only the one used last, or
the next holder's work runs beside it; and after the driver frees a context the shim
must not hand the driver anything of it again (events, streams, the context itself):
the stand-in keeps freed handles and logs any later use as "stale"."""

import re

SPIN_US = 1_500_000


def releases(client) -> list[tuple[float, float]]:
    """(held_ms, drain_ms) of each release in the shim's debug lines."""
    return [
        (float(held), float(drain))
        for held, drain in re.findall(
            r"release gpu=0 lease=\d+ reason=\w+ held_ms=([\d.]+) drain_ms=([\d.]+)", client.stderr
        )
    ]


def test_release_waits_for_the_work_of_every_context(world, agent):
    # Context A queues a 1.5 s kernel, context B then makes a memset and the process idles:
    # the idle release (after 100 ms without a call) must wait for A's kernel although B
    # was used last: it finds the GPU busy (it asks every context) and goes on holding,
    # or drains it; either way the GPU is let go only once A's kernel is done.
    client = world.client("contexts", "two", 2500, kernel_us=SPIN_US, NVSHARE_DEBUG=1)
    client.finish_ok()
    seen = releases(client)
    assert seen, client.describe()
    held_ms, drain_ms = seen[0]
    assert held_ms >= SPIN_US / 1000 - 100, (
        f"released after {held_ms} ms (drain {drain_ms} ms), while context A still ran\n"
        f"{client.describe()}"
    )
    pushed = {c.fields["ctx"] for c in world.calls(client.pid, "cuCtxPushCurrent_v2")}
    assert len(pushed) >= 2, pushed


def test_destroyed_and_reset_contexts_are_never_used_again(world, agent):
    # 300 launches per context: the queue bound records events in each context.
    client = world.client("contexts", "lifecycle", 300, kernel_us=20, NVSHARE_DEBUG=1)
    result = client.finish_ok()
    assert result["launches"] == "300"
    stale = [
        line
        for line in world.standin_log.read_text().splitlines()
        if line.startswith(f"{client.pid} ") and "stale" in line
    ]
    assert not stale, "\n".join(stale[:10])
    assert len(world.calls(client.pid, "cuEventRecord")) >= 3, "the queue bound recorded no events"
    assert client.stderr.count("context gone") >= 2, client.describe()
    # The 1 MiB and the array left in the destroyed context no longer count against this process.
    assert "forgot 2 allocations of a destroyed context on GPU 0" in client.stderr, (
        client.describe()
    )
    assert not client.warnings(), client.describe()
