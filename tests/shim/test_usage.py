"""Use is GPU time (issue 35): real shims on the stand-in driver measure how long
they keep the GPU busy (shim/usage_meter.c) and report it (GPU_USAGE); the agent
judges light and busy by that, not by how long a lease is held."""

import re

import pytest

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
    agent.wait_for_log(rf"grant gpu=\S+ pid={busy.pid} .*role=turn")
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


@pytest.mark.slow  # 4 s of work
def test_a_busy_client_beside_the_turn_is_dropped_whatever_it_holds(world):
    agent = world.start_agent(config=CONFIG)
    first = world.client("linked", "--launches", "10", "--loops", "25", kernel_us=20000)
    agent.wait_for_log(rf"grant gpu=\S+ pid={first.pid} .*role=turn")
    # A second trainer starts beside it (nothing known of it yet: light), keeps the GPU
    # busy and is asked to leave once its measured use passes twice the floor.
    second = world.client("linked", "--launches", "10", "--loops", "25", kernel_us=20000)
    found = agent.wait_for_log(
        rf"drop gpu=\S+ pid={second.pid} .*reason=no_longer_light use=(\S+)", timeout=10
    )
    assert float(found.group(1)) > 0.2
    first.finish_ok(timeout=60)
    second.finish_ok(timeout=60)
