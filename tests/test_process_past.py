"""A process's GPU seconds and waits are the sum of its connections' (agent/process_past.py):
one connection leaving must not take its part away while another stays."""

from __future__ import annotations

import pytest

from nvshare_agent import dbus_names as names
from nvshare_agent.core_state import FEATURE_USAGE
from nvshare_agent.dbus_properties import client_details_to_dbus
from nvshare_agent.scheduler import Scheduler
from nvshare_agent.settings import AntiThrash, Settings

G0, G1 = b"\x00" * 15 + b"\x01", b"\x00" * 15 + b"\x02"
PID = 4242


def gpu_seconds(s: Scheduler, now: float) -> dict[str, float]:
    """ClientDetails' GPU seconds of PID, per GPU, as D-Bus (and so the metrics) show them."""
    per_gpu = client_details_to_dbus(s.snapshot(now))[PID][names.CLIENT_PER_GPU_KEY].value
    return {uuid: round(figures["gpu_seconds"].value, 6) for uuid, figures in per_gpu.items()}


@pytest.fixture
def s() -> Scheduler:
    s = Scheduler(Settings(anti_thrash=AntiThrash.OFF))
    for client, gpus in ((1, (G0,)), (2, (G0, G1))):  # two connections of one process
        s.connect(client, pid=PID, uid=1000, gid=1000)
        s.hello(client, gpus, "python", now=0.0, features=FEATURE_USAGE)
    s.gpu_usage(1, G0, 3_000_000, 1.0)
    s.gpu_usage(2, G0, 2_000_000, 1.0)
    s.gpu_usage(2, G1, 4_000_000, 1.0)
    return s


def test_a_connection_leaving_leaves_its_gpu_seconds_with_its_process(s):
    before = gpu_seconds(s, 1.0)
    assert sorted(before.values()) == [4.0, 5.0]
    s.disconnect(2, 1.5)
    # The process's figures never go back: G1, which only the gone connection used, stays
    # too (idle, nothing allocated).
    assert gpu_seconds(s, 1.5) == before
    s.gpu_usage(1, G0, 3_500_000, 2.0)
    assert sorted(gpu_seconds(s, 2.0).values()) == [4.0, 5.5]


def test_a_process_gone_whole_leaves_nothing_for_a_pid_used_again(s):
    s.disconnect_many((1, 2), 2.0)
    s.connect(3, pid=PID, uid=1000, gid=1000)
    s.hello(3, (G0,), "python", now=3.0, features=FEATURE_USAGE)
    assert list(gpu_seconds(s, 3.0).values()) == [0.0]
