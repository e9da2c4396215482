"""nvsharectl share's figures (cli/render_shares.py): each GPU's groups' shares add up."""

from __future__ import annotations

import re

import pytest

from nvshare_cli.render_shares import shares_as_dict, shares_text


def group(gpu: str, name: str, share: float) -> dict:
    return {
        "gpu": gpu,
        "group": name,
        "share": share,
        "weight": 1,
        "memory_cap_bytes": 0,
        "use": share,
        "clients": 1,
    }


def test_each_gpus_groups_shares_add_up_to_all_of_the_gpu_time_they_used():
    # Issue 45: two groups side by side read 132 %: each group's GPU time over the minute,
    # where the GPU's time counts once for each group running at that moment.
    groups = [
        group("GPU-a", "user:alice", 0.80),
        group("GPU-a", "user:bob", 0.52),
        group("GPU-a", "user:carol", 0.0),
        group("GPU-b", "user:alice", 0.30),
    ]
    shown = shares_as_dict({"ShareBy": "user", "Shares": {}, "Groups": groups})
    parts: dict[str, list[float]] = {}
    for g in shown["groups"]:
        parts.setdefault(g["gpu"], []).append(g["part"])
    assert sum(parts["GPU-a"]) == pytest.approx(1.0)
    assert parts["GPU-b"] == [1.0]
    text = shares_text(shown, width=120)
    gpu_a = text.split("GPU GPU-a")[1].split("GPU GPU-b")[0]
    assert sorted(int(p) for p in re.findall(r"(\d+) %", gpu_a)) == [0, 39, 61]
    assert "adds to 100 %" in text
