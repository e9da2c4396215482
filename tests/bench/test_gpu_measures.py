"""The GPU benchmark's measures, on made-up step times and log lines (no GPU needed)."""

import datetime
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "gpu"))
import busy_turns
import gpu_measures
import gpu_state
import harness
import hook_cost
import launch_pairs
import launch_spread
import original
import phase_runner
import startup


def alternating(turn_s=1.0, step_s=0.1, turns=10):
    """Two trainers taking exclusive turns of turn_s, a step every step_s."""
    per_turn = round(turn_s / step_s)
    times = [[], []]
    for i in range(turns * per_turn):
        times[(i // per_turn) % 2].append((i + 1) * step_s)
    return [{"step_times": t, "gpu_spans_s": [step_s * 0.9] * len(t)} for t in times]


def test_turns_of_exclusive_alternation_are_measured_from_the_other_process_last_step():
    lengths = gpu_measures.turn_lengths(alternating(turn_s=1.0, turns=10))
    assert len(lengths) == 7  # 10 turns, 9 boundaries, first and last cut
    assert lengths == pytest.approx([1.0] * 7)


def test_interleaved_steps_show_as_many_short_turns():
    together = [
        {"step_times": [i * 0.2 for i in range(50)]},
        {"step_times": [i * 0.2 + 0.1 for i in range(50)]},
    ]
    lengths = gpu_measures.turn_lengths(together)
    assert len(lengths) > 90
    assert max(lengths) == pytest.approx(0.1)


def test_pair_measures_count_only_the_window_both_ran():
    results = alternating(turn_s=1.0, turns=10)
    results[1]["step_times"] += [11.0, 12.0]  # ran on alone after the other stopped
    measures = gpu_measures.pair_measures(results)
    assert measures["window_s"] == pytest.approx(
        results[0]["step_times"][-1] - results[1]["step_times"][3]
    )
    assert sum(measures["shares"]) == pytest.approx(1.0)
    assert 0.45 < measures["shares"][0] < 0.55
    assert measures["aggregate_steps_per_s"] == pytest.approx(10, rel=0.05)
    assert measures["gpu_busy_fraction"] == pytest.approx(0.9, rel=0.05)


def test_pair_shares_count_from_when_both_loops_began_not_from_the_later_fourth_step():
    # Turns of 30 s, 64 s each (auto_pair_fits): 1 runs 0-30 and 60-64, 2 runs 30-60.
    # From 2's 4th step (30.3 s) the window held 2's turn and 4 s of 1's: 12 / 88 %.
    results = alternating(turn_s=30.0, turns=3)
    results[0]["step_times"] = [t for t in results[0]["step_times"] if t <= 64.0]
    results[1]["step_times"] += [64.5, 64.6]
    for r in results:
        r["started_at"] = 0.0
    measures = gpu_measures.pair_measures(results)
    assert measures["shares_window_s"] == pytest.approx(64.0)
    assert measures["shares"][0] == pytest.approx(34 / 64, abs=0.01)


def test_drop_stats_percentiles():
    stats = gpu_measures.drop_stats([float(ms) for ms in range(1, 101)])
    assert stats["drop_to_release_p50_ms"] == pytest.approx(50, abs=1)
    assert stats["drop_to_release_p99_ms"] == pytest.approx(99, abs=1)
    assert (
        gpu_measures.drop_stats([])["drop_to_release_p50_ms"]
        != gpu_measures.drop_stats([])["drop_to_release_p50_ms"]
    )  # nan


def test_original_scheduler_drop_to_release_pairs_each_client_drop_with_its_release():
    scheduler = original.OriginalScheduler.__new__(original.OriginalScheduler)
    scheduler.lines = [
        (1.000, "[NVSHARE][INFO]: Sent DROP_LOCK to client aa\n"),
        (1.050, "[NVSHARE][INFO]: Received REQ_LOCK from bb\n"),
        (1.600, "[NVSHARE][INFO]: Received LOCK_RELEASED from aa\n"),
        (
            2.000,
            "[NVSHARE][INFO]: Received LOCK_RELEASED from bb\n",
        ),  # an early release: no drop before it
        (3.000, "[NVSHARE][INFO]: Sent DROP_LOCK to client bb\n"),
        (3.070, "[NVSHARE][INFO]: Received LOCK_RELEASED from bb\n"),
    ]
    assert scheduler.drop_to_release_ms() == pytest.approx([600.0, 70.0])


def test_launch_delta_interval_holds_the_true_shift_and_excludes_zero_only_when_clear():
    plain = [3.5 + 0.05 * (i % 10) for i in range(30)]  # 3.50 .. 3.95, median 3.725
    low, high = launch_pairs.bootstrap_delta(plain, [us + 0.2 for us in plain])
    assert low <= 0.2 <= high and low > 0
    low, high = launch_pairs.bootstrap_delta(plain, list(reversed(plain)))
    assert low < 0 < high


@pytest.mark.parametrize(
    "script, count, error",
    [
        (launch_pairs, "x", "launch_pairs: PAIRS must be a whole number, not 'x'"),
        (launch_pairs, "1", "launch_pairs: PAIRS must be at least 2"),
        (hook_cost, "x", "hook_cost: PROCESSES must be a whole number, not 'x'"),
        (hook_cost, "0", "hook_cost: PROCESSES must be at least 1"),
        (startup, "five", "startup: PAIRS must be a whole number, not 'five'"),
        (startup, "0", "startup: PAIRS must be at least 1"),
        (launch_spread, "1", "launch_spread: PROCESSES must be at least 2"),
    ],
)
def test_side_scripts_refuse_a_bad_count_in_one_line(script, count, error):
    done = subprocess.run([sys.executable, script.__file__, count], capture_output=True, text=True)
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [error]


def test_the_old_launch_figure_is_the_fastest_run_of_ten_consecutive_short_rounds():
    rounds = [5.0] * 10 + [4.0] * 9 + [9.0] + [4.5] * 10
    # Ten rounds in a row make one 100,000-launch round: blocks average 5.0, 4.5 and 4.5.
    assert gpu_measures.fastest_old_round_us(rounds) == pytest.approx(4.5)
    assert min(rounds) == 4.0  # what the new figure takes instead


def test_launch_spread_separates_the_spread_between_processes_from_the_spread_inside_one():
    processes = [
        {"rounds_us": [9.0, 4.0, 4.5, 4.2], "enqueue_us": [8.9, 4.0, 4.5, 4.2]},
        {"rounds_us": [5.0, 3.6, 3.7, 3.5], "enqueue_us": [5.0, 3.5, 3.7, 3.5]},
        {"rounds_us": [4.4, 4.3, 4.4, 4.6], "enqueue_us": [2.2, 2.15, 2.2, 2.3]},
    ]
    measures = launch_spread.spread_measures(processes)
    assert measures["fastest_median"] == 4.0 and measures["fastest_range"] == [3.5, 4.3]
    # The first round (9.0, warming up) is left out: rounds 2-4 spread by 0.5, 0.2 and 0.3.
    assert measures["within_process_spread_median"] == pytest.approx(0.3)
    assert measures["enqueue_share_median"] == pytest.approx(1.0)


def test_hook_cost_pairs_each_block_with_its_neighbour_through_the_driver():
    # Blocks drift from 3000 to 3400 ns; the hook adds 20 ns, and 400 more every 4th block (a mark).
    driver = [3000 + 0.1 * i for i in range(4000)]
    hook = [ns + 20 + (400 if i % 4 == 0 else 0) for i, ns in enumerate(driver)]
    locked = [ns + 150 for ns in driver]  # a locked add after each launch, 150 ns dearer
    measures = gpu_measures.hook_cost_measures(
        {
            "driver_ns": driver,
            "hook_ns": hook,
            "driver_then_locked_ns": locked,
            "ctx_get_current_ns": 5.0,
        }
    )
    assert measures["delta_ns_median"] == pytest.approx(20)
    assert measures["delta_ns_mean"] == pytest.approx(120)
    low, high = measures["delta_ns_mean_95"]
    assert 100 < low <= 120 <= high < 140
    assert measures["ctx_get_current_ns"] == 5.0
    assert measures["locked_add_ns_median"] == pytest.approx(150)


def test_gpu_clock_summary_takes_medians_and_every_clock_event_reason_seen():
    lines = [
        "1980, 650.5, 40, 0x0000000000000000",
        "1755, 699.0, 55, 0x0000000000000004",  # power cap
        "1830, 690.0, 58, 0x0000000000000020",  # thermal slowdown
        "[N/A], [N/A], 58, [N/A]",
        "1980, 6",
    ]  # cut off when the sampler stopped
    summary = gpu_state.gpu_clock_summary(lines)
    assert summary == {
        "samples": 3,
        "sm_mhz_median": 1830,
        "sm_mhz_min": 1755,
        "power_w_median": 690.0,
        "temperature_c_max": 58,
        "clock_event_reasons": "0x24",
    }
    assert gpu_state.gpu_clock_summary(["[N/A], [N/A], [N/A], [N/A]"]) == {}


def test_unsampled_phases_run_without_querying_the_gpu(tmp_path, monkeypatch):
    # No nvidia-smi (nor stdbuf) on PATH: starting the sampler would raise.
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("NVSHARE_BENCH_ONLY", raising=False)
    results = {}
    phase_runner.run_phases(
        [("overhead", lambda: {"launch_us_delta": 0.01}), ("pausing", lambda: {})],
        results,
        tmp_path / "gpu.json",
        extra={"pausing"},
        unsampled={"overhead"},
    )
    assert set(results) == {"overhead"}
    assert results["overhead"]["launch_us_delta"] == 0.01
    assert "gpu_clocks" not in results["overhead"] and "error" not in results["overhead"]
    with pytest.raises(FileNotFoundError):
        phase_runner.run_phases([("solo", dict)], results, tmp_path / "gpu.json")


def test_each_phase_keeps_the_logs_of_the_agents_it_started(tmp_path, monkeypatch):
    monkeypatch.delenv("NVSHARE_BENCH_ONLY", raising=False)
    # The agents' sockets live in workdir, and a UNIX socket path has at most 107 bytes:
    # tmp_path is too long for them under pytest -n (.../popen-gw1/test_each_phase_...).
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="nvs-", dir="/tmp"))
    results_dir = tmp_path / "results"
    results_dir.mkdir()
    logs = {}

    def phase_starting(name, agents):
        def phase():
            for number in range(agents):
                agent = harness.Agent(workdir, time_quantum_s=number + 1)
                agent.stop()
                logs[f"{name}{f'-{number + 1}' if number else ''}.log"] = agent.log()
            return {}

        return name, phase

    results = {}
    try:
        phase_runner.run_phases(
            [phase_starting("first", 1), phase_starting("none", 0), phase_starting("second", 2)],
            results,
            results_dir / "gpu.json",
            unsampled={"first", "none", "second"},
            workdir=workdir,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    assert not [phase for phase in results.values() if "error" in phase], results
    kept = {path.name: path.read_text() for path in (results_dir / "agent-logs").iterdir()}
    assert set(kept) == {"first.log", "second.log", "second-2.log"}
    assert kept == logs
    # In the order they started: the second agent of a phase had TQ 2 s.
    assert "time_quantum_s=1 " in kept["second.log"] and "time_quantum_s=2 " in kept["second-2.log"]


@pytest.mark.parametrize(
    "script, error",
    [
        (
            "import pathlib, sys, time; time.sleep(0.3); pathlib.Path(sys.argv[1]).touch(); time.sleep(30)",
            None,
        ),
        ("import sys; sys.exit('no GPU here')", "stopped before creating .*\n.*no GPU here"),
        ("import time; time.sleep(30)", "did not create .* in 1 s"),
    ],
)
def test_wait_for_file_returns_once_the_process_made_it_or_says_why_not(tmp_path, script, error):
    ready = tmp_path / "trainer-ready"
    process = harness.start_json([sys.executable, "-c", script, str(ready)])
    try:
        if error is None:
            harness.wait_for_file(ready, process, timeout=30)
            assert ready.exists() and process.poll() is None
        else:
            with pytest.raises(RuntimeError, match=error):
                harness.wait_for_file(ready, process, timeout=1)
    finally:
        harness.stop_process(process)


def test_startup_measures_compare_medians_and_pair_each_start():
    measures = startup.startup_measures([11.0, 13.0, 12.0], [11.5, 12.0, 12.6], [2, 2, 3])
    assert measures["plain_median_s"] == 12.0 and measures["shim_median_s"] == 12.0
    assert measures["shim_over_plain"] == 1.0
    assert measures["paired_delta_s"] == pytest.approx([0.5, -1.0, 0.6])
    assert measures["mean_paired_delta_s"] == pytest.approx(0.1 / 3)
    low, high = measures["mean_paired_delta_95_s"]
    assert -1.0 <= low < 0 < high <= 0.6
    assert measures["grants_per_start"] == [2, 2, 3]


def test_an_agent_that_cannot_start_says_so_with_its_log(tmp_path):
    # An nvshare_agent ahead of the real one on the path, which exits before making its socket.
    broken = tmp_path / "path" / "nvshare_agent"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("")
    (broken / "__main__.py").write_text("raise SystemExit('broken agent')\n")
    with pytest.raises(RuntimeError, match="agent did not start:\nbroken agent"):
        harness.Agent(tmp_path, base_env=dict(os.environ, PYTHONPATH=str(tmp_path / "path")))


def test_busy_turns_judges_a_pair_from_the_agents_first_turn_on():
    """The first turn's grant in the agent's log (its local clock, as the trainers'
    time.time()) starts the window a long run is judged by."""
    log = "\n".join(
        [
            "2026-11-29 21:30:10.000 INFO grant gpu=G pid=1 lease=1 mode=shared role=beside use=0",
            "2026-11-29 21:30:24.539 INFO grant gpu=G pid=2 lease=3 mode=shared role=turn use=0.9",
        ]
    )
    start = busy_turns.first_turn(log)
    assert start == pytest.approx(datetime.datetime(2026, 11, 29, 21, 30, 24, 539000).timestamp())
    assert busy_turns.first_turn(log.splitlines()[0]) is None
    steps = [[start + 0.1 * i for i in range(-50, 51)], [start + 0.2 * i for i in range(-25, 26)]]
    judged = busy_turns.window(steps, start)
    assert judged["rates"] == pytest.approx([10.0, 5.0])
    assert judged["window_s"] == pytest.approx(5.0)
