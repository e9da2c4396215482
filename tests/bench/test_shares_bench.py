"""The shares benchmark (bench/gpu/shares.py) without a GPU: its config, its figures and
verdicts on made-up numbers, and its users phase against stand-in trainers on the
stand-in driver under the real shim and agent, as two uids (root only)."""

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "gpu"))
import harness
import shares

from nvshare_agent.settings import ShareBy
from nvshare_agent.settings_files import parse_config

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "shim"))
from shim_harness import readable_build  # noqa: E402

STANDIN_BUILD = REPO / "tests" / "standin" / "build"


def test_the_config_it_writes_is_one_the_agent_reads():
    text = "[scheduler]\nanti_thrash = auto\n" + shares.shares_config(
        "user", {"user:4001": {"memory_cap": "4G", "weight": "2"}}
    )
    settings = parse_config(text, pathlib.Path("shares.conf"))
    assert settings.share_by is ShareBy.USER
    assert dict(settings.shares)["user:4001"].memory_cap_bytes == 4 << 30


def test_each_users_share_counts_the_steps_in_the_window_only():
    results = [
        (4001, {"step_times": [0.5, 1.5, 2.5, 3.5]}),  # 1.5 and 2.5 are in [1, 3)
        (4001, {"step_times": [1.0]}),
        (4002, {"step_times": [1.2, 1.4, 9.0]}),
    ]
    figures = shares.user_shares(results, start=1.0, seconds=2.0)
    assert figures == {
        "4001": {"steps": 3, "share": 0.6},
        "4002": {"steps": 2, "share": 0.4},
    }


def test_the_cap_verdict_names_each_thing_the_issue_asks():
    cap = 4 << 30
    good = {
        "total_bytes": cap,
        "free_bytes": cap - 1,
        "past_cap": "OutOfMemoryError",
        "went_on": True,
    }
    warning = [f"[nvshare] warning: ... may hold {cap} bytes there (its memory cap ...)"]
    assert all(shares.cap_verdict(good, 4, warning, 0).values())
    bad = shares.cap_verdict({**good, "total_bytes": 80 << 30, "past_cap": "allocated"}, 4, [], 0)
    assert not bad["mem_get_info_total_is_the_cap"]
    assert not bad["allocation_past_it_raised_out_of_memory"]
    assert not bad["one_warning_naming_the_cap"]


@pytest.mark.root
@pytest.mark.slow  # 20 s of turns
@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"),
    reason="runs its trainers as two uids with the system's Python: needs root",
)
def test_the_users_phase_runs_two_uids_and_shares_by_user(tmp_path, monkeypatch):
    """The whole users phase, its trainers stand-ins on the stand-in driver: the agent
    (TQ 1 s, nothing fits beside anything) gives each uid about half."""
    # The README's test runs the suite from a 0700 home, which other uids cannot enter:
    # the shim, the stand-in and the trainer stand-in run from copies every user reads.
    shim, standin = readable_build()
    script = shim.parent / "shares_standin.py"
    shutil.copy2(HERE / "shares_standin.py", script)
    script.chmod(0o755)
    monkeypatch.setattr(harness, "SHIM", shim)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="nvs-shares-bench-", dir="/tmp"))
    workdir.chmod(0o755)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(standin))
    monkeypatch.setenv("STANDIN_KERNEL_US", "1000")
    try:
        # The system's Python: the venv's may live where other uids cannot enter (/root).
        trainer = ["/usr/bin/python3", "-s", "-P", str(script)]
        found = shares.run_users(
            workdir, 20.0, trainer=trainer, time_quantum_s=1, memory_limit="64M"
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    users = found["users"]
    assert users["4002"]["share"] == pytest.approx(0.5, abs=0.1), found
    assert found["turns"] > 10


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="probes as another uid: needs root")
def test_preflight_says_when_the_other_uid_cannot_run_the_clients():
    # The system's Python can run as uid 4001, but has no torch on a machine without GPUs.

    python = "/usr/bin/python3"
    if not os.path.exists(python) or subprocess.run([python, "-c", "import torch"]).returncode == 0:
        pytest.skip("needs a system Python without torch")
    problem = shares.preflight(python)
    assert problem is not None and "uid 4001" in problem and "\n" not in problem
