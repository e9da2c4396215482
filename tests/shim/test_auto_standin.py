"""Anti-thrash auto with real shims on the stand-in driver (docs/scheduling.md):
the shims tell the agent the GPU's size (GPU_MEMORY) and what they allocate; two
whose memory fits run together at once; a third whose allocation does not fit
beside them runs in a window between them; once it is gone they run together again."""

import re

import pytest
from agent_harness import wait_until

MIB = 1 << 20
# The stand-in GPU has 16 GiB (its shims say so); memory_limit makes auto assume
# 1600 MiB, so that a few hundred MiB decide (each client's context counts
# 512 MiB where there is no NVML): two small clients fit (~1026 MiB of 1344
# usable), a third with 256 MiB does not.
AUTO_CONFIG = """\
[scheduler]
anti_thrash = auto
time_quantum = 30
idle_release_ms = 200
drop_grace_ms = 2000
memory_limit = 1600M
"""


def grants(log: str, pid: int) -> list[dict]:
    found = []
    for line in log.splitlines():
        if " grant gpu=" in line and f" pid={pid} " in line:
            found.append(dict(re.findall(r"(\w+)=(\S+)", line.split(" grant ", 1)[1])))
    return found


def after(log: str, marker: str) -> str:
    """The part of the log after the first line matching marker."""
    match = re.search(marker, log)
    assert match, f"no /{marker}/ in the log"
    return log[match.end() :]


@pytest.mark.slow  # 15 s of bursts
def test_clients_that_fit_run_together_one_that_does_not_runs_in_a_window_then_they_do_again(
    world,
):
    agent = world.start_agent(config=AUTO_CONFIG)
    # Light work: a short burst every 400 ms, given back 200 ms after each.
    steady = ("--ints", "1024", "--duration-ms", "15000", "--sleep-ms", "400")
    a = world.client("linked", *steady)
    b = world.client("linked", *steady)
    # Both granted within 100 ms of asking, and running together: one beside the other.
    agent.wait_for_log(r"grant gpu=\S+ pid=\d+ lease=\d+ mode=shared waited_ms=\S+ role=beside")
    for client in (a, b):
        first = grants(agent.log(), client.pid)[0]
        assert float(first["waited_ms"]) <= 100, first

    # 256 MiB more, and its own context: no longer fits beside both.  It is light too
    # (new), so it runs in a window: the turn is cut short after its minimum slice,
    # the one beside gives the GPU back once idle, and the big one runs without them.
    big = world.client("linked", "--ints", str(64 * MIB), "--loops", "2", "--linger-ms", "2000")
    agent.wait_for_log(r"mode gpu=\S+ mode=exclusive demand_bytes=\d+ capacity_bytes=1677721600")
    agent.wait_for_log(rf"grant gpu=\S+ pid={big.pid} lease=\d+ mode=shared .*role=beside")

    # Once it has gone, everything fits again and the two run together again.
    assert big.wait() == 0, big.describe()
    agent.wait_for_log(rf"disconnect pid={big.pid}\b")
    agent.wait_for_log(r"mode gpu=\S+ mode=shared .*reason=client_gone")
    beside = r"grant gpu=\S+ pid=\d+ lease=\d+ mode=shared waited_ms=\S+ role=beside"
    wait_until(
        lambda: re.search(beside, after(agent.log(), r"mode=shared .*reason=client_gone")),
        what="a grant beside the turn once memory fits again",
    )
    for client in (a, b):
        assert client.wait() == 0, client.describe()
    log = world.settled(agent, a, b, big)
    assert " revoke " not in log, log[-3000:]
