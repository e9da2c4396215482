"""Use is GPU time (issue 35): real shims on the stand-in driver measure how long
they keep the GPU busy (shim/usage_meter.c) and report it (GPU_USAGE); the agent
judges light and busy by that, not by how long a lease is held."""

import pathlib
import re
import sys

import pytest
from fake_agent import FakeAgent

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "gpu"))
import meter_measures

from nvshare_agent import protocol
from nvshare_agent.policy import BESIDE_SATURATING_USE
from nvshare_agent.protocol import Features

CONFIG = """\
[scheduler]
anti_thrash = auto
time_quantum = 30
idle_release_ms = 1000
drop_grace_ms = 2000
"""


def grants_of(log: str, pid: int) -> list[dict]:
    return [
        dict(re.findall(r"(\w+)=(\S+)", line.split(" grant ", 1)[1]))
        for line in log.splitlines()
        if " grant gpu=" in line and f" pid={pid} " in line
    ]


def drops_of(log: str, pid: int) -> list[str]:
    return [line for line in log.splitlines() if " drop gpu=" in line and f" pid={pid} " in line]


@pytest.mark.slow  # 8 s of work
def test_a_steady_light_client_holds_its_lease_beside_a_busy_one_and_stays_light(world):
    agent = world.start_agent(config=CONFIG)
    # A trainer: 20 ms kernels back to back, 8 s.
    busy = world.client(
        "linked", "--launches", "10", "--loops", "40", "--ints", "1024", kernel_us=20000
    )
    agent.wait_for_log(rf"grant gpu=\S+ pid={busy.pid} ")
    # An inference server: one 1 ms kernel every ~50 ms, never idle for a second, so it
    # never gives its lease back; holding it is no use of the GPU.
    steady = world.client(
        "linked", "--launches", "1", "--sleep-ms", "50", "--duration-ms", "6000", kernel_us=1000
    )
    steady.finish_ok(timeout=30)
    busy.finish_ok(timeout=30)
    log = agent.log()
    first = grants_of(log, steady.pid)[0]
    assert first["role"] == "beside" and float(first["waited_ms"]) < 100, first
    assert drops_of(log, steady.pid) == [], "a steady light client is never dropped as busy"
    # The busy one's measured use, as the agent saw it when it asked again, is high.
    for grant in grants_of(log, busy.pid)[1:]:
        assert float(grant["use"]) > 0.3, grant


@pytest.mark.slow  # 10 s of work
def test_a_busy_client_beside_the_turn_is_dropped_whatever_it_holds(world):
    agent = world.start_agent(config=CONFIG)
    first = world.client("linked", "--launches", "10", "--loops", "50", kernel_us=20000)
    agent.wait_for_log(rf"grant gpu=\S+ pid={first.pid} ")
    # A second trainer starts beside it (their memory fits), keeps the GPU busy and is
    # asked to leave once both read as saturating: two such take turns.  Whichever is
    # dropped read at least the line of one with no stretch alone told (the second's).
    second = world.client("linked", "--launches", "10", "--loops", "50", kernel_us=20000)
    found = agent.wait_for_log(
        rf"drop gpu=\S+ pid=({first.pid}|{second.pid}) .*reason=both_keep_it_busy use=(\S+)",
        timeout=20,
    )
    assert float(found.group(2)) >= BESIDE_SATURATING_USE
    first.finish_ok(timeout=60)
    second.finish_ok(timeout=60)


# ---- the measure itself, against the stand-in's own record of its kernels

USAGE_FEATURES = int(Features.GPU_MEMORY | Features.KEEPALIVE | Features.USAGE)


def measured_s(world, *workload: str, kernel_us: int = 1000, spans_gap_s: float = 0.0):
    """A client alone, granted at once by an agent that takes GPU_USAGE: the GPU time
    its shim reported, the stand-in's kernel time (or, given spans_gap_s, its bursts'
    spans: what timestamps around a burst can see, the stand-in's own time between
    kernels included), and its bursts."""
    with FakeAgent(world.socket_path, features=USAGE_FEATURES) as fake:
        # It lingers: its last report (every 100 ms while the total grows) comes in.
        client = world.client(
            "linked", "--ints", "1024", "--linger-ms", "300", *workload, kernel_us=kernel_us
        )
        connection = fake.wait_for_connection()
        result = client.finish_ok(timeout=60)
        reports = connection.all(protocol.GpuUsage)
    assert reports, "no GPU_USAGE"
    # The stand-in's kernels, as the GPU bench reads the profiler's (meter_measures.py).
    runs = world.kernel_runs(client.pid)
    truth = (
        meter_measures.burst_spans_seconds(runs, spans_gap_s)
        if spans_gap_s
        else meter_measures.union_seconds(runs)
    )
    return reports[-1].message.busy_us / 1e6, truth, int(result["loops"])


@pytest.mark.parametrize("launches", [4, 9, 30])
def test_bursts_that_end_in_a_synchronize_count_whole(world, launches):
    # Each burst queues its launches (1 ms kernels, and an empty graph), then waits in
    # cuEventSynchronize, which the shim does not see.  Marks come every few launches
    # (an eighth of the 50 ms bound); the launches after the last one must count too:
    # 4 and 9 read 32 % and 65 % of their kernel time before, and a weight of 2 gave
    # 60 % instead of 67 % (test_shares).  30 is the case that was already right.
    measured, kernels, bursts = measured_s(
        world, "--launches", str(launches), "--duration-ms", "2000"
    )
    assert kernels > 1.0, kernels
    # Over: a look (1 ms, up to 5 ms when the client thread is late) per burst, and the
    # empty graph's launch at the average.  Under: looks later than 5 ms count 5 ms.
    assert kernels * 0.8 <= measured <= kernels * 1.1 + bursts * 0.005, (measured, kernels)


@pytest.mark.parametrize("launches", [4, 9])
def test_bursts_with_gaps_count_only_their_work(world, launches):
    # Requests with 30 ms between them: the launches after each burst's last mark
    # count, and their estimate does not carry the count into the gap.
    measured, kernels, bursts = measured_s(
        world, "--launches", str(launches), "--sleep-ms", "30", "--duration-ms", "2000"
    )
    assert bursts >= 20, bursts
    assert kernels * 0.8 <= measured <= kernels * 1.1 + bursts * 0.005, (measured, kernels, bursts)


def test_requests_shorter_than_a_look_count_their_bursts_not_the_looks(world):
    # An inference server: 4 kernels of 200 us (~1.4 ms here) every ~20 ms.  Counted by
    # whole looks of 1 ms, a request read 2-4 ms (3.4 ms for 0.9 ms on an H200); by its
    # marks' timestamps it reads its bursts' spans (what the H200's profiler showed
    # too: 0.83x of them), whatever the load: on a loaded box the stand-in's own time
    # between kernels grows, and the spans with it.
    measured, spans, bursts = measured_s(
        world,
        "--launches", "4", "--sleep-ms", "20", "--duration-ms", "2000",
        kernel_us=200, spans_gap_s=0.005,
    )  # fmt: skip
    assert bursts >= 50, bursts
    # By whole looks: 2.3x the spans.  By timestamps 1.07-1.15x, idle or loaded: the start
    # event and the marks are the worker's operations too (0.2 ms a burst idle, 0.5 loaded);
    # 1.32x once, in CI's container stage beside the others on 2 cores.  1.6 still tells
    # the two apart.
    assert spans * 0.9 <= measured <= spans * 1.6, (measured, spans, bursts)


def test_bursts_on_several_streams_at_once_count_while_any_stream_runs(world):
    # Three threads (the main one and two more), each on its own stream, bursts of 9
    # kernels: a mark done on one stream says nothing of the others' (a burst is timed only
    # once every mark of the queue is done).  Measured 1.009x of the kernels' union.
    measured, kernels, bursts = measured_s(
        world, "--threads", "2", "--launches", "9", "--duration-ms", "2000"
    )
    assert kernels > 1.0, kernels
    assert kernels * 0.9 <= measured <= kernels * 1.1 + bursts * 0.005, (measured, kernels)
