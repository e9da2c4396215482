"""A real Prometheus (Debian's) scrapes the exporter, as nvshare-metrics.socket serves it
(a process per connection), beside an agent with clients: every query of the Grafana
dashboard (kubernetes/grafana-nvshare.json) returns series with the labels its legend and
grouping name, a wait appears, by its cause, at the first scrape after it began, and a
share group's counters see no reset when its processes go."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from agent_harness import GPU0, ShimClient
from dbus_harness import NOBODY, busctl_on_agent, wait_for
from metrics_harness import InetdListener
from other_users import other_user_env, python_as
from prometheus_harness import Prometheus

from nvshare_agent import protocol

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "kubernetes/grafana-nvshare.json"
# A scrape starts a Python process: on a loaded 2-core box that takes most of a second.
INTERVAL_S = 2.0
# Grafana's variables as a user who picks "All" would have them.
VARIABLES = {"$instance": ".*", "$gpu": ".*", "$__rate_interval": "10s"}
# NVML's figure: absent where NVML cannot be read, as here (the capacity line, from the
# shims' reports, stands in on such a node).
NVML_ONLY = "nvshare_gpu_memory_total_bytes"
# Labels a process may lack here (no systemd unit or pod for a test's process).
MAY_BE_EMPTY = {"unit", "pod"}


def dashboard_queries() -> list[tuple[str, str, str]]:
    board = json.loads(DASHBOARD.read_text())
    found = []
    for panel in board["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            found.append((panel["title"], expr, target.get("legendFormat", "")))
    return found


def labels_named(expr: str, legend: str) -> set[str]:
    """The labels a query's series must carry: those it groups by, and its legend's."""
    named = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))
    for grouping in re.findall(r"\bby \(([^)]*)\)", expr):
        named |= {label.strip() for label in grouping.split(",")} - {"le"}
    return named - MAY_BE_EMPTY


@pytest.fixture
def prometheus(world_dir, bus, fast_agent):
    # systemd-socket-activate passes its children no environment: env sets what they need.
    path = other_user_env()["PYTHONPATH"]
    exporter = InetdListener(
        ["env", f"PYTHONPATH={path}", "PYTHONDONTWRITEBYTECODE=1"]
        + python_as(NOBODY, "-m", "nvshare_metrics", "--bus", bus.address),
        world_dir / "exporter.log",
    ).start()
    server = Prometheus(world_dir, f"127.0.0.1:{exporter.port}", INTERVAL_S)
    try:
        yield server.start()
    finally:
        server.stop()
        exporter.stop()


@pytest.mark.slow  # a few scrapes' worth of seconds
def test_the_dashboards_queries_return_labelled_series_and_a_wait_shows_at_once(
    fast_agent, bus, prometheus
):
    uuid = protocol.format_uuid(GPU0)
    busctl_on_agent(bus.address, "set-property", "TimeQuantum", "u", "3600")  # a long turn
    trainer = ShimClient(fast_agent.socket_path, command="trainer")
    trainer.report_gpu_memory(GPU0, 16 << 30)
    trainer.report_memory(GPU0, 1 << 30)
    trainer.request()
    lease = trainer.wait_grant()
    wait_for(
        lambda: prometheus.query('nvshare_client_gpu_seconds_total{command="trainer"}'),
        "the trainer's GPU time scraped",
    )

    # A wait: the notebook asks while the trainer holds its turn (anti-thrash on).
    notebook = ShimClient(fast_agent.socket_path, command="notebook")
    waited_from = time.time()
    notebook.request()
    query = f'nvshare_client_wait_seconds_total{{cause="turn", gpu="{uuid}"}}'
    wait_for(lambda: prometheus.query(query), "the notebook's wait scraped")
    time.sleep(2 * INTERVAL_S)
    (series,) = prometheus.query(query + "[1m]")
    first_seen = float(series["values"][0][0])
    # The first scrape that began after the wait did (a scrape may take a few ms more).
    assert first_seen - waited_from <= INTERVAL_S + 0.5, (first_seen, waited_from)
    assert series["metric"]["user"] == "root"
    # Its wait, once: the trainer's connection is of the same process (this one), and a
    # process's figures were once added again for each of its connections.  (A sample is
    # stamped when its scrape starts; the exporter reads the agent up to a scrape later.)
    at, waited = (float(x) for x in series["values"][-1])
    assert 0 < waited <= at - waited_from + INTERVAL_S, (waited, at - waited_from)

    trainer.release(lease)
    notebook.release(notebook.wait_grant(timeout=10))
    time.sleep(3 * INTERVAL_S)  # two samples in every rate window (10 s)

    for title, expr, legend in dashboard_queries():
        result = prometheus.query(expr)
        if expr.startswith(NVML_ONLY):
            assert result == [], result
            continue
        assert result, f"{title}: no series for {expr}\n{prometheus.log()}"
        for found in result:
            labels = found["metric"]
            missing = labels_named(expr, legend) - set(labels)
            assert not missing, f"{title}: {expr} lacks {missing}: {labels}"
            assert labels.get("gpu", uuid) == uuid, (title, labels)
            assert labels.get("user", "root") == "root", (title, labels)
            assert labels.get("cause", "turn") == "turn", (title, labels)
            assert labels.get("group", "user:0") == "user:0", (title, labels)

    # The notebook goes: its group's counters go on from where they were (the trainer
    # stays, and the GPU with it).  Prometheus counts a counter that went down as a
    # reset: none.
    on = f'group="user:0", gpu="{uuid}"'
    turn = f'nvshare_share_wait_seconds_total{{{on}, cause="turn"}}'
    (group_waited,) = prometheus.query(turn)
    notebook.close()
    wait_for(
        lambda: [float(c["value"][1]) for c in prometheus.query("nvshare_clients")] == [1.0],
        "a scrape after the notebook left",
    )
    time.sleep(2 * INTERVAL_S)  # more scrapes after it left
    for name in ("nvshare_share_gpu_seconds_total", "nvshare_share_wait_seconds_total"):
        found = prometheus.query(f"resets({name}{{{on}}}[1m])")
        assert found and all(float(f["value"][1]) == 0 for f in found), (name, found)
    (after,) = prometheus.query(turn)
    assert float(after["value"][1]) >= float(group_waited["value"][1]) > 0
    trainer.close()
