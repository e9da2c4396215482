"""bench/shim_launch_cost.py end to end on the stand-in.  Its figures are the bench's
business (no timing is asserted here); this checks that it runs, that the two paths it
compares are really the hook and the driver, and that bad arguments get one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from shim_harness import SHIM, STANDIN_BUILD, without_node_preload

BENCH = Path(__file__).resolve().parents[2] / "bench" / "shim_launch_cost.py"


def test_the_bench_times_the_hook_against_the_driver_in_one_process():
    done = subprocess.run(
        [sys.executable, str(BENCH), "--blocks", "300"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    figures = re.search(
        r"driver ([\d.]+) ns  hook ([\d.]+) ns per launch \(medians\); "
        r"hook - driver: median ([+-][\d.]+) ns, mean ([+-][\d.]+) ",
        done.stdout,
    )
    assert figures, done.stdout
    driver, hook = float(figures[1]), float(figures[2])
    assert driver > 0 and hook > 0


def test_without_the_shim_the_client_refuses_to_compare_a_function_with_itself():
    env = dict(os.environ, LD_LIBRARY_PATH=str(STANDIN_BUILD), STANDIN_LAUNCH_NOOP="1")
    env.pop("LD_PRELOAD", None)
    done = subprocess.run(
        [*without_node_preload(), str(STANDIN_BUILD / "client_launch_cost"), "10"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "client_launch_cost: the hooked and the driver's cuLaunchKernel are one function:"
        " is the shim preloaded?"
    ]


def test_a_bad_block_count_is_one_line():
    done = subprocess.run(
        [sys.executable, str(BENCH), "--blocks", "0", "--shim", str(SHIM)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "shim_launch_cost: --blocks and --per-block must be at least 1"
    ]
