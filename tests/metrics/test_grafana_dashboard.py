"""kubernetes/grafana-nvshare.json: a dashboard Grafana can import, whose
queries ask only for metrics the exporter writes, each panel and query as
docs/metrics.md lists them.  (No Grafana runs here: its JSON model is checked
for the fields an import needs.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

from nvshare_metrics.exposition import FAMILY_NAMES

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "kubernetes/grafana-nvshare.json"
METRIC = re.compile(r"\bnvshare_[a-z_]+")


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def queries(board: dict) -> list[tuple[str, str]]:
    return [(panel["title"], t["expr"]) for panel in board["panels"] for t in panel["targets"]]


def family(sample_name: str) -> str:
    return re.sub(r"_(total|bucket|count|sum)$", "", sample_name)


def test_the_dashboard_imports_with_a_data_source_of_the_users_choice():
    board = dashboard()
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))


def test_panels_do_not_overlap():
    taken: set[tuple[int, int]] = set()
    for panel in dashboard()["panels"]:
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(box["x"], box["x"] + box["w"])
            for y in range(box["y"], box["y"] + box["h"])
        }
        assert not cells & taken, panel["title"]
        taken |= cells


def test_every_query_asks_for_metrics_the_exporter_writes():
    written = set(FAMILY_NAMES)
    for title, expr in queries(dashboard()):
        asked = {family(name) for name in METRIC.findall(expr)}
        assert asked and asked <= written, (title, asked - written)


def test_the_panels_cover_gpu_time_waits_per_process_and_group_memory_and_health():
    asked = {family(name) for _, expr in queries(dashboard()) for name in METRIC.findall(expr)}
    for needed in (
        "nvshare_client_gpu_seconds",
        "nvshare_client_wait_seconds",
        "nvshare_share_gpu_seconds",
        "nvshare_share_wait_seconds",
        "nvshare_client_memory_bytes",
        "nvshare_gpu_memory_total_bytes",
        "nvshare_agent_up",
    ):
        assert needed in asked


def test_docs_list_each_panel_and_its_queries():
    docs = (REPO / "docs/metrics.md").read_text()
    section = docs.split("### Grafana dashboard", 1)[1].split("\n## ", 1)[0]
    for panel in dashboard()["panels"]:
        (row,) = [line for line in section.splitlines() if line.startswith(f"| {panel['title']} |")]
        for target in panel["targets"]:
            assert f"`{target['expr']}`" in row, (panel["title"], target["expr"])
