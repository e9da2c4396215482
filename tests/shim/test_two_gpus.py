"""One process, two GPUs: what one GPU's lock transition waits for must not hold up the other.

A grant's prefetch waits for the working set to arrive, a release's drain for the GPU to
finish what was queued: seconds with a large working set or a long kernel.  The shim waits
on a worker thread of that GPU, so the process's other GPU is still asked for, granted
and released meanwhile.  Before, the one client thread waited, and a thread starting work
on the other GPU waited with it (tests/standin/client_two_gpus.c).

And each GPU's lock goes by that GPU's settings: with a quantum of its own on one GPU,
a process holding both is asked to give back that one alone (issue 31)."""

import re
import sys
from pathlib import Path

import pytest
from shim_harness import STANDIN_GPU

# Long drop grace: the drained GPU's lock is released, not revoked, while its kernel runs.
PATIENT_CONFIG = """\
[scheduler]
time_quantum = 1
anti_thrash = on
idle_release_ms = 100
drop_grace_ms = 20000
"""


def times(client) -> dict[str, float]:
    result = client.finish_ok()
    return {key: float(result[key]) for key in ("a_launched", "a_done", "b_launched", "b_done")}


def test_a_long_prefetch_on_one_gpu_does_not_hold_up_the_other(world, agent):
    # GPU 0's grant prefetches for 3 s; thread B asks for GPU 1 0.5 s in and has nothing
    # to prefetch: it is granted, runs and finishes while GPU 0's prefetch goes on.
    client = world.client(
        "two_gpus",
        500,
        kernel_us=1000,
        STANDIN_DEVICE_COUNT=2,
        STANDIN_PREFETCH_US=3_000_000,
        NVSHARE_DEBUG=1,
    )
    seen = times(client)
    assert "prefetch gpu=0 allocations=1" in client.stderr, client.describe()
    assert seen["b_done"] < seen["a_launched"], (
        f"GPU 1's work waited for GPU 0's prefetch: {seen}\n{client.describe()}"
    )


@pytest.mark.slow
def test_a_long_drain_on_one_gpu_does_not_hold_up_the_other(world):
    world.start_agent(config=PATIENT_CONFIG)
    # Thread A's 4 s kernel holds GPU 0, and the shim drains GPU 0 until the kernel ends:
    # at the idle release (A's thread only waits), or, should that wait for the queue
    # bound's mark, at the drop request the agent sends after the 1 s quantum, as a second
    # process asks for GPU 0.  Thread B asks for GPU 1 2 s in, during that drain.
    client = world.client(
        "two_gpus", 2000, kernel_us=4_000_000, STANDIN_DEVICE_COUNT=2, NVSHARE_DEBUG=1
    )
    world.agent.wait_for_log(rf"grant gpu=\S+ pid={client.pid}\b")
    rival = world.client(
        "linked", "--loops", 1, "--launches", 1, kernel_us=1000, STANDIN_DEVICE_COUNT=2
    )
    seen = times(client)
    rival.finish_ok()
    log = world.settled(world.agent, client, rival)
    drains = [
        float(ms)
        for ms in re.findall(
            r"release gpu=0 lease=\d+ reason=\w+ held_ms=[\d.]+ drain_ms=([\d.]+)", client.stderr
        )
    ]
    assert drains and drains[0] > 2000, (
        f"GPU 0 was not drained while its kernel ran\n{client.describe()}"
    )
    assert "revoke" not in log, log
    assert seen["b_launched"] < seen["a_done"] - 1.0, (
        f"GPU 1's work waited for GPU 0's drain: {seen}\n{client.describe()}\n{log}"
    )


# The stand-in's GPU 1; with the fake NVML listing the stand-in's GPUs (FAKE_NVML=standin),
# the agent numbers them 0 and 1 as NVML would.
STANDIN_GPU1 = STANDIN_GPU[:-1] + "1"
FAKE_NVML = Path(__file__).resolve().parents[1] / "agent" / "fake_nvml"


def own_quanta_config(gpu0: str, gpu1: str) -> str:
    # Node-wide 30 s; GPU 0 has 1 s of its own and GPU 1 30 s.  A long drop grace:
    # the drained GPU is released, not revoked, while its kernel runs.
    return f"""\
[scheduler]
time_quantum = 30
anti_thrash = on
idle_release_ms = 100
drop_grace_ms = 20000

[gpu:{gpu0}]
time_quantum = 1

[gpu:{gpu1}]
time_quantum = 30
"""


@pytest.mark.slow  # a 3 s kernel each: the rival must wait past GPU 0's quantum
@pytest.mark.parametrize("named_by", ["uuid", "index"])
def test_a_process_on_two_gpus_is_asked_to_drop_each_by_that_gpus_quantum(world, named_by):
    if named_by == "uuid":
        world.start_agent(config=own_quanta_config(STANDIN_GPU, STANDIN_GPU1))
    else:
        world.start_agent(
            config=own_quanta_config("0", "1"),
            env={
                "FAKE_NVML": "standin",
                "PYTHONPATH": f"{FAKE_NVML}:{':'.join(p for p in sys.path if p)}",
            },
        )
        world.agent.wait_for_log(rf"gpu settings gpu={STANDIN_GPU} index=0 time_quantum_s=1 ")
    # Both threads start at once and keep their GPU busy for 3 s.
    holder = world.client("two_gpus", 0, kernel_us=3_000_000, STANDIN_DEVICE_COUNT=2)
    for gpu in (STANDIN_GPU, STANDIN_GPU1):
        world.agent.wait_for_log(rf"grant gpu={gpu} pid={holder.pid}\b")
    # Another process waits for both GPUs.
    rival = world.client("two_gpus", 0, kernel_us=1000, STANDIN_DEVICE_COUNT=2)
    holder.finish_ok()
    rival.finish_ok()
    log = world.settled(world.agent, holder, rival)
    drops = re.findall(
        rf"drop gpu=(\S+) pid={holder.pid} lease=\d+ held_ms=([\d.]+) reason=(\S+)", log
    )
    # GPU 0: asked to give the GPU back once its 1 s quantum was over (or as the rival
    # asked, if that came later), while its kernel still ran.  (How each lock then goes
    # back, a release or the process's exit, is the shim's race: not asserted.)
    assert [(gpu, reason) for gpu, _, reason in drops] == [(STANDIN_GPU, "quantum_over")], log
    assert 1000.0 <= float(drops[0][1]) < 3000.0, log
    # GPU 1: the rival waited there longer than GPU 0's quantum, and no drop came.
    waited = re.search(
        rf"grant gpu={STANDIN_GPU1} pid={rival.pid} lease=\d+ mode=exclusive waited_ms=([\d.]+)",
        log,
    )
    assert waited and float(waited[1]) > 1000.0, log
    assert "revoke" not in log, log
