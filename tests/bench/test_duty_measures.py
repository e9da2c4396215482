"""Issue 44's duty benchmark (bench/gpu/duty.py) without a GPU: its plan and time budget,
its arguments, the rates over a window, the fair shares (duty_measures.py), the targets
and the table (duty_table.py), on made-up numbers."""

import argparse
import math
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "gpu"))
import duty_measures as measures
import duty_table


def regular(period: float, first: float, until: float) -> list[float]:
    return [first + index * period for index in range(int((until - first) / period) + 1)]


# ---------------------------------------------------------------------------- rates


@pytest.mark.parametrize("phase", [0.0, 0.07, 0.13, 0.29])
def test_a_regular_process_rate_is_exact_whatever_its_phase_against_the_window(phase):
    done_at = regular(0.3, phase, 40.0)
    assert measures.rate_over(done_at, 10.0, 25.0) == pytest.approx(1 / 0.3)


def test_a_stall_at_the_window_end_counts_in_full():
    # Every 0.1 s until 19 s, then nothing until 23 s: a window 10-20 s counts to 23 s.
    done_at = regular(0.1, 0.0, 19.0) + [23.0]
    measured = measures.rate_over(done_at, 10.0, 20.0)
    assert measured == pytest.approx(91 / 13, rel=0.02)
    assert measured < 0.75 * 10


def test_without_a_completion_after_the_window_its_completions_inside_count():
    done_at = regular(0.5, 0.0, 12.0)
    assert measures.rate_over(done_at, 10.0, 20.0) == pytest.approx(4 / 10)
    assert measures.rate_over([], 10.0, 20.0) == 0
    assert math.isnan(measures.rate_over([1.0], 5.0, 5.0))


def test_figures_over_a_window_take_the_median_gpu_time_of_its_units():
    done_at = [1.0, 2.0, 3.0, 4.0, 5.0]
    output = {"done_at": done_at, "gpu_ms": [99.0, 30.0, 31.0, 29.0, 99.0]}
    figures = measures.figures_over(output, 1.5, 4.5)
    assert figures["units"] == 3 and figures["gpu_ms"] == 30.0
    assert figures["rate"] == pytest.approx(1.0)


def test_a_burst_gets_the_products_nearest_its_length_and_at_least_one():
    assert measures.products_for(30, 2.7) == 11
    assert measures.products_for(20, 2.7) == 7
    assert measures.products_for(30, 45) == 1


# ---------------------------------------------------------------------------- fair shares


def test_max_min_shares_serve_the_light_ones_in_full_and_split_the_rest():
    assert measures.max_min_shares([0.1, 0.3, 0.5, 0.7]) == pytest.approx([0.1, 0.3, 0.3, 0.3])
    assert measures.max_min_shares([0.7, 0.1]) == pytest.approx([0.7, 0.1])
    assert measures.max_min_shares([0.3] * 8) == pytest.approx([0.125] * 8)
    # Beside an always-busy trainer, the trainer gets what the others leave.
    assert measures.max_min_shares([0.4, 1.0]) == pytest.approx([0.4, 0.6])


def solo(rate, gpu_ms):
    return {"rate": rate, "gpu_ms": gpu_ms, "units": 10}


SOLO = {
    "d10": solo(1 / 0.3, 30.0),
    "d30": solo(1 / 0.1, 30.0),
    "d50": solo(1 / 0.06, 30.0),
    "d70": solo(1 / (0.03 / 0.7), 30.0),
    "trainer": solo(100.0, 10.0),
    "loader": solo(1 / 0.15, 60.0),
}


def test_fair_rates_scale_each_solo_rate_by_its_share_over_its_demand():
    fair = measures.fair_rates(["d10", "d30", "d50", "d70"], SOLO)
    assert fair["d10"] == pytest.approx(SOLO["d10"]["rate"])
    assert fair["d30"] == pytest.approx(SOLO["d30"]["rate"])
    assert fair["d50"] == pytest.approx(SOLO["d50"]["rate"] * 0.3 / 0.5)
    assert fair["d70"] == pytest.approx(SOLO["d70"]["rate"] * 0.3 / 0.7)
    eight = measures.fair_rates([f"d30_{i}" for i in range(1, 9)], SOLO)
    assert all(rate == pytest.approx(10 * 0.125 / 0.3) for rate in eight.values())


# ---------------------------------------------------------------------------- plan


def test_solo_runs_one_process_per_distinct_role_a_bursts_one_first():
    assert measures.solo_roles(["f4", "f8"]) == ["d10", "d30", "d50", "d70", "trainer"]
    assert measures.solo_roles(["g_loader"]) == ["loader", "trainer"]
    assert measures.solo_roles(["g_pipe"]) == ["d30"]  # sizing only
    assert measures.solo_roles(["f8", "g_loader"]) == ["d30", "trainer", "loader"]


def test_the_plan_has_every_run_of_the_issue():
    runs = measures.plan(list(measures.PARTS))
    keys = [run.key for run in runs]
    assert keys[:6] == [f"solo/{r}" for r in ("d10", "d30", "d50", "d70", "trainer", "loader")]
    assert keys[6:] == [
        "f4/plain",
        "f4/nvshare",
        "f8/plain",
        "f8/nvshare",
        "g_loader/busy_first/plain",
        "g_loader/busy_first/nvshare",
        "g_loader/loader_first/plain",
        "g_loader/loader_first/nvshare",
        "g_pipe/unbounded/plain",
        "g_pipe/unbounded/nvshare",
        "g_pipe/bounded/plain",
        "g_pipe/bounded/nvshare",
    ]
    f8 = runs[8]
    assert f8.stages[0] == ("alone", tuple(f"d30_{i}" for i in range(1, 9)))
    assert f8.stages[1] == ("beside_trainer", ("trainer",))
    loader_first = runs[12]
    assert loader_first.stages == ((None, ("loader",)), ("both", ("trainer",)))
    assert [run.queue_size for run in runs[14:]] == [0, 0, 2, 2]
    assert {run.env for run in runs if run.key.endswith("nvshare")} == {"nvshare"}


def test_the_default_run_is_planned_under_seven_minutes_and_its_budget():
    runs = measures.plan(list(measures.PARTS))
    planned = measures.planned_seconds(runs, measures.DEFAULT_WINDOW_S)
    assert planned["total"] < 7 * 60
    assert planned["total"] < measures.DEFAULT_BUDGET_S
    assert measures.process_count(runs) == 6 + 2 * 5 + 2 * 9 + 4 * 2 + 4 * 2
    assert set(planned) == {"imports", "solo", "f4", "f8", "g_loader", "g_pipe", "total"}


def test_a_run_is_planned_from_its_stages_windows_and_agent():
    runs = {run.key: run for run in measures.plan(list(measures.PARTS))}
    window = 15.0
    f4 = measures.planned_run_s(runs["f4/plain"], window)
    assert measures.planned_run_s(runs["f4/nvshare"], window) == f4 + measures.AGENT_S
    assert f4 > 2 * window
    # The arrival gap instead of a window before the second process of g.
    loader = measures.planned_run_s(runs["g_loader/busy_first/plain"], window)
    assert loader > window + measures.ARRIVAL_GAP_S
    assert measures.window_length_s(runs["solo/d10"], window) == measures.SOLO_WINDOW_S
    assert measures.window_length_s(runs["g_pipe/bounded/plain"], 15.0) == pytest.approx(10.0)


def test_roles_say_what_their_process_does():
    assert measures.role_shape("d70") == {"kind": "bursts", "burst_ms": 30.0, "duty": 0.7}
    assert measures.role_shape("d30_4")["duty"] == 0.3
    assert measures.role_shape("loader") == {"kind": "bursts", "burst_ms": 60.0, "gap_ms": 90.0}
    assert measures.role_shape("pipeline")["burst_ms"] == 20.0
    with pytest.raises(ValueError, match="no role"):
        measures.role_shape("inference")


# ---------------------------------------------------------------------------- arguments


def test_arguments_default_to_every_part_a_15_s_window_and_the_budget():
    args = measures.parse_args([], "results/gpu")
    assert args.only == list(measures.PARTS)
    assert args.window == 15.0 and args.budget == measures.DEFAULT_BUDGET_S
    assert args.results == "results/gpu" and not args.plan


def test_only_picks_parts_in_their_fixed_order():
    args = measures.parse_args(["/tmp/x", "--only", "g_pipe, f4", "--window", "8"], "r")
    assert args.only == ["f4", "g_pipe"] and args.window == 8.0 and args.results == "/tmp/x"
    assert measures.parse_args([], "r", default_only="f8").only == ["f8"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--only", "f4,f5"], "no part f5"),
        (["--only", ","], "name at least one part"),
        (["--window", "0"], "positive number of seconds"),
        (["--window", "soon"], "not a number of seconds"),
        (["--budget", "-1"], "positive number of seconds"),
    ],
)
def test_bad_arguments_end_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as ended:
        measures.parse_args(argv, "r")
    assert ended.value.code == 2
    assert message in capsys.readouterr().err


def test_parse_only_says_which_parts_exist():
    with pytest.raises(argparse.ArgumentTypeError, match="parts: f4, f8, g_loader, g_pipe"):
        measures.parse_only("g")


# ---------------------------------------------------------------------------- targets, table


def window(**rates):
    return {"clients": {role: {"rate": rate} for role, rate in rates.items()}}


def solo_results():
    return {
        role: {"windows": {"alone": {"clients": {role: figures}}}} for role, figures in SOLO.items()
    }


def f4_results(nvshare_scale=1.0):
    """No nvshare starves d10 (2.5/s, fair 3.33/s); nvshare gives it 3.3/s."""
    plain_alone = {"d10": 2.5, "d30": 8.0, "d50": 10.0, "d70": 10.0}
    nv_alone = {"d10": 3.3, "d30": 9.9, "d50": 9.8, "d70": 9.7}
    plain_beside = {**plain_alone, "trainer": 40.0}
    nv_beside = {role: rate * nvshare_scale for role, rate in {**nv_alone, "trainer": 45.0}.items()}
    return {
        "solo": {**solo_results(), "sizing": {"ms_per_product": 2.7}, "phase_seconds": 40.0},
        "f4": {
            "plain": {
                "windows": {
                    "alone": window(**plain_alone),
                    "beside_trainer": window(**plain_beside),
                }
            },
            "nvshare": {
                "windows": {"alone": window(**nv_alone), "beside_trainer": window(**nv_beside)}
            },
            "gpu_clocks": {},
        },
    }


def by_key(rows):
    return {(row.window, row.process): row for row in rows}


def test_a_process_the_plain_run_starves_is_held_to_its_fair_share():
    rows = by_key(duty_table.duty_rows(f4_results(), "f4"))
    d10 = rows[("alone", "d10")]
    assert d10.plain == 2.5 and d10.bar == pytest.approx(0.95 / 0.3)
    assert "fair 3.33" in d10.target and d10.verdict() == "MET"
    # d50 got more than its fair share without nvshare: its own rate there is the reference.
    d50 = rows[("alone", "d50")]
    assert d50.bar == pytest.approx(9.5) and d50.target == ">= 0.95x no nvshare"
    assert d50.verdict() == "MET"
    assert rows[("alone", "sum")].plain == pytest.approx(30.5)
    assert rows[("alone", "sum")].nvshare == pytest.approx(32.7)
    assert rows[("alone", "sum")].verdict() == "MET"


def test_beside_the_trainer_it_is_reported_and_the_duty_processes_judged():
    rows = by_key(duty_table.duty_rows(f4_results(nvshare_scale=0.8), "f4"))
    trainer = rows[("beside_trainer", "trainer")]
    assert trainer.solo == 100.0 and trainer.plain == 40.0 and trainer.nvshare == 36.0
    assert trainer.bar is None and trainer.verdict() == ""
    assert rows[("beside_trainer", "d50")].verdict() == "MISSED"
    assert rows[("beside_trainer", "sum")].verdict() == "MISSED"


def test_g_rows_hold_each_process_and_the_pipeline_to_095x_without_nvshare():
    results = {
        "solo": solo_results(),
        "g_loader": {
            "busy_first/plain": {"windows": {"both": window(trainer=60.0, loader=5.0)}},
            "busy_first/nvshare": {"windows": {"both": window(trainer=58.0, loader=4.0)}},
            "loader_first/plain": {"windows": {"both": window(trainer=60.0, loader=5.0)}},
            "loader_first/nvshare": {"error": "agent did not start"},
        },
        "g_pipe": {
            "unbounded/plain": {"windows": {"both": window(pipeline=24.0)}},
            "unbounded/nvshare": {"windows": {"both": window(pipeline=23.5)}},
            "bounded/plain": {"skipped": "its ~22 s would pass the budget"},
        },
    }
    rows = {(row.part, row.window, row.process): row for row in duty_table.rows(results)}
    assert rows[("g_loader", "busy_first", "trainer")].verdict() == "MET"
    assert rows[("g_loader", "busy_first", "loader")].verdict() == "MISSED"
    assert rows[("g_loader", "busy_first", "loader")].solo == pytest.approx(1 / 0.15)
    assert rows[("g_loader", "loader_first", "loader")].verdict() == "NO DATA"
    assert rows[("g_pipe", "unbounded", "pipeline")].verdict() == "MET"
    assert rows[("g_pipe", "bounded", "pipeline")].verdict() == "NO DATA"


def test_the_table_is_markdown_with_every_row_and_a_tally():
    lines = duty_table.table(f4_results(nvshare_scale=0.8))
    assert lines[0].startswith("| part | window | process |") and lines[1].startswith("|---|")
    assert len({line.count("|") for line in lines[:-2]}) == 1  # every row has every column
    body = [line for line in lines if line.startswith("| f4 |")]
    assert len(body) == 2 * 5 + 1  # four processes and the sum per window, and the trainer
    d10 = next(line for line in body if "| alone | d10 |" in line)
    assert "| 3.33 | 2.50 | 3.30 | 0.750x | 0.990x | 1.320x |" in d10 and d10.endswith("| MET |")
    assert lines[-1] == "targets: 6 met, 4 missed, 0 without data"


def test_lock_lines_show_grants_waits_and_drops_of_each_nvshare_run():
    results = f4_results()
    results["f4"]["nvshare"]["lock"] = {
        "grants": {"d10": {"grants_per_gpu": {"0": 3}, "wait_p50_ms": 1.25, "wait_max_ms": 40.0}},
        "drop_reasons": {"quantum": 2},
        "revokes": 0,
    }
    results["f8"] = {"nvshare": {"lock": {"error": "KeyError('pid')"}}}
    assert duty_table.lock_lines(results) == [
        "f4/nvshare: grants d10 3 (wait p50 1.25 / max 40.00 ms); drops {'quantum': 2}; revokes 0",
        "f8/nvshare: no lock figures (KeyError('pid'))",
    ]


def test_sizing_gives_each_kind_of_burst_its_products():
    assert measures.sizing(None) == {"ms_per_product": None}
    assert measures.sizing(2.5)["products"] == {"duty": 12, "loader": 24, "pipeline stage": 8}
