"""Every CPU benchmark in bench/ for a second or two: a smoke run that fails on a crash.

The numbers are not judged (this box is shared and noisy); each script must exit 0 and
print its table or figure.  The shim's benches use the build that tests/shim uses
(`make shim standin`, which make check builds): a missing build fails, it is not skipped.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
sys.path.insert(0, str(REPO / "tests" / "shim"))
from shim_harness import SHIM, STANDIN_BUILD  # noqa: E402

NUMBER = r"[-+]?\d+(?:\.\d+)?"


def run_bench(script: str, *args: str) -> str:
    """stdout of bench/SCRIPT ARGS, which must exit 0 within a minute.  A hung run is
    killed with its whole session: agent_bench's agent and clients would outlive it."""
    command = f"{script} {' '.join(args)}"
    with subprocess.Popen(
        [sys.executable, str(BENCH / script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as bench:
        try:
            out, err = bench.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(bench.pid, signal.SIGKILL)
            out, err = bench.communicate()
            pytest.fail(f"{command} still running after 60 s:\n{out}{err}")
    assert bench.returncode == 0, f"{command} exited {bench.returncode}:\n{out}{err}"
    return out


def require_shim_build(*paths: Path) -> None:
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        pytest.fail(f"not built: {', '.join(missing)}; run `make shim standin` (make check does)")


def test_agent_bench_measures_handoffs_idle_clients_and_churn():
    out = run_bench(
        "agent_bench.py",
        "--clients",
        "2",
        "--seconds",
        "0.5",
        "--idle-clients",
        "20",
        "--churn",
        "20",
    )
    handoffs = re.search(
        rf"2 clients: handoff p50 +{NUMBER} us +p99 +{NUMBER} us .*\((\d+) handoffs", out
    )
    assert handoffs and int(handoffs[1]) > 0, out
    assert re.search(rf"20 clients connected: agent RSS {NUMBER} MB", out), out
    assert re.search(r"20 connections came and went .* second half [-+]\d+ KiB", out), out


def test_agent_bench_baseline_runs_the_clients_against_minimal_relay():
    out = run_bench(
        "agent_bench.py",
        "--baseline",
        "--clients",
        "2",
        "--seconds",
        "0.5",
        "--idle-clients",
        "0",
        "--churn",
        "0",
    )
    handoffs = re.search(rf"2 clients: handoff p50 +{NUMBER} us .*\((\d+) handoffs", out)
    assert handoffs and int(handoffs[1]) > 0, out


def test_policy_sim_plays_a_short_mix():
    out = run_bench("policy_sim.py", "trainer", "duty", "--seconds", "5")
    assert "| client | share | ideal |" in out, out
    assert re.search(r"^\| 1 trainer \|", out, re.MULTILINE), out
    assert re.search(r"^\| 2 duty \|", out, re.MULTILINE), out
    assert "GPU idle while work that fits waited" in out, out


def test_policy_sim_sweeps_two_mixes():
    out = run_bench("policy_sim.py", "--sweep", "2", "--seconds", "5")
    assert re.search(r"^2 mixes; ", out, re.MULTILINE), out
    assert "ten worst" in out, out


def test_shim_launch_cost_measures_the_hook_against_the_standin():
    require_shim_build(SHIM, STANDIN_BUILD / "client_launch_cost")
    out = run_bench("shim_launch_cost.py", "--blocks", "50")
    assert re.search(
        rf"driver {NUMBER} ns  hook {NUMBER} ns per launch .* hook - driver: median {NUMBER} ns",
        out,
    ), out


def test_shim_startup_times_programs_with_and_without_the_shim():
    require_shim_build(SHIM)
    out = run_bench("shim_startup.py", "--runs", "3", "--python-runs", "2")
    assert re.search(r"^program +runs +plain ms +preload ms +ratio$", out, re.MULTILINE), out
    assert re.search(rf"^/bin/true +3 +{NUMBER} +{NUMBER} +{NUMBER}$", out, re.MULTILINE), out
    assert re.search(rf"python3 -c pass +2 +{NUMBER} +{NUMBER} +{NUMBER}$", out, re.MULTILINE), out
