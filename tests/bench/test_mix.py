"""The node-mix benchmark (bench/gpu/mix.py) without a GPU: its schedules, figures, staged
memory limits, targets and table on made-up numbers, and its whole run against stand-in
clients (tests/bench/mix_standin.py), a stand-in nvidia-smi and the real agent."""

import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "gpu"))
import light
import mix
import mix_measures as measures

from nvshare_agent import memory_fit

HERE = pathlib.Path(__file__).resolve().parent
GIB, MIB = 1 << 30, 1 << 20


def test_poisson_arrivals_are_seeded_and_come_at_the_rate_with_exponential_gaps():
    arrivals = light.poisson_arrivals(20, 1000, seed=3)
    assert arrivals == light.poisson_arrivals(20, 1000, seed=3)
    assert arrivals != light.poisson_arrivals(20, 1000, seed=4)
    assert arrivals[0] > 0 and arrivals[-1] < 1000 and arrivals == sorted(arrivals)
    assert len(arrivals) == pytest.approx(20_000, rel=0.03)
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    # Exponential: the mean is 1/rate and the standard deviation equals the mean.
    assert statistics.fmean(gaps) == pytest.approx(0.05, rel=0.03)
    assert statistics.stdev(gaps) == pytest.approx(0.05, rel=0.05)


def test_a_loader_batch_lands_every_period_from_the_window_start():
    arrivals = light.periodic_arrivals(0.01, 1.0)
    assert len(arrivals) == 100 and arrivals[0] == 0 and arrivals[-1] == pytest.approx(0.99)


def test_notebook_cells_are_short_or_long_at_gaps_in_range_and_seeded():
    cells = light.notebook_cells(seed=7)
    drawn = [next(cells) for _ in range(200)]
    cells_again = light.notebook_cells(seed=7)
    assert drawn == [next(cells_again) for _ in range(200)]
    assert all(0.7 <= gap <= 2.3 for gap, _ in drawn)
    assert {ms for _, ms in drawn} == {15.0, 150.0}


class FakeClock:
    """time.monotonic and time.sleep for light.py: a loaded test box cannot move them."""

    def __init__(self):
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(light, "time", fake)
    return fake


def test_a_request_that_waits_behind_a_late_one_counts_its_wait(clock):
    slow_first = iter([0.06, 0.0, 0.0])
    latencies = light.serve(
        [0.0, 0.01, 0.2], clock.monotonic(), lambda: clock.sleep(next(slow_first))
    )
    assert latencies[0] == pytest.approx(60)
    # Arrived at 10 ms, answered once the first was (60 ms): 50 ms, though it took none.
    assert latencies[1] == pytest.approx(50)
    assert latencies[2] == pytest.approx(0)


def test_cells_run_after_their_gaps_until_the_window_is_over(clock):
    cells = iter([(0.02, 15.0), (0.02, 150.0), (0.02, 15.0), (1.0, 15.0)])
    ran = []
    latencies, sizes = light.run_cells(
        clock.monotonic(), 0.3, cells, lambda ms: (ran.append(ms), clock.sleep(ms / 3000))
    )
    assert sizes == ran == [15.0, 150.0, 15.0]  # the fourth would start after the window
    assert latencies == pytest.approx([5, 50, 5])


def test_a_client_waits_for_the_go_file_and_takes_its_time_as_the_window_start(tmp_path):
    go = tmp_path / "go"
    go_at = time.time() + 0.3
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import time,sys; time.sleep(0.1); open(sys.argv[1],'w').write('{go_at!r}')",
            str(go),
        ]
    )
    start = light.wait_for_go(str(tmp_path / "ready"), str(go))
    writer.wait()
    assert (tmp_path / "ready").exists()
    assert start - time.monotonic() == pytest.approx(go_at - time.time(), abs=0.02)


def test_latency_summary_takes_the_tail_asked_for():
    summary = light.latency_summary([float(ms) for ms in range(1, 101)], 0.95)
    assert summary == {"count": 100, "p50_ms": 51.0, "p95_ms": 95.0, "max_ms": 100.0}
    assert light.latency_summary([], 0.99)["count"] == 0


def test_trainers_are_measured_over_the_window_only_with_their_shares():
    first = {"step_times": [0.5, *[1 + 0.25 * i for i in range(40)]]}  # 1.0 .. 10.75
    second = {"step_times": [5 + 0.5 * i for i in range(24)]}  # 5.0 .. 16.5
    figures = measures.trainer_figures([first, second], start=2.0, end=12.0)
    # In (2, 12]: 2.25 .. 10.75, and 5.0 .. 12.0.
    assert figures["trainer"]["steps"] == 35 and figures["trainer"]["steps_per_s"] == 3.5
    assert figures["trainer_2"]["steps"] == 15 and figures["trainer_2"]["steps_per_s"] == 1.5
    assert figures["trainers"]["steps_per_s"] == 5.0
    assert figures["trainers"]["shares"] == [0.7, 0.3]
    assert "trainers" not in measures.trainer_figures([first], 2.0, 12.0)


def test_light_figures_recompute_the_summary_and_keep_the_latencies():
    output = {"latencies_ms": [1.0, 2.0, 30.0], "p50_ms": 99, "count": 7, "passes": 9}
    figures = measures.light_figures("notebook", output)
    assert figures["p50_ms"] == 2.0 and figures["p95_ms"] == 30.0 and figures["count"] == 3
    assert figures["latencies_ms"] == [1.0, 2.0, 30.0] and figures["passes"] == 9


def test_a_notebooks_cells_are_summed_up_by_their_size_too():
    # Half short, half long: the p50 of them all is a long cell's, of neither kind's own.
    output = {"latencies_ms": [31.0, 300.0, 35.0, 340.0], "cell_ms": [15.0, 150.0, 15.0, 150.0]}
    figures = measures.light_figures("notebook", output)
    assert figures["by_cell_ms"][15.0]["p50_ms"] == 31.0
    assert figures["by_cell_ms"][150.0]["p95_ms"] == 340.0
    shown = measures.measured("notebook", figures)
    assert "; 15 ms cells p50 31.0 / p95 35.0; 150 ms cells p50 300 / p95 340" in shown


@pytest.mark.parametrize(
    "trainer_gib, light_mib", [(4, [700, 900, 600]), (3.5, [600] * 3), (10, [900] * 3)]
)
def test_two_trainers_apart_do_not_fit_together_and_either_fits_beside_the_light_clients(
    trainer_gib, light_mib
):
    trainer, lights = int(trainer_gib * GIB), [mib * MIB for mib in light_mib]
    limit = measures.apart_memory_limit(trainer, lights)
    assert limit % MIB == 0
    # Even from "does not fit" (the hysteresis band below the line), one trainer and the rest fit;
    # from "fits", two trainers alone do not: by the agent's own rule.
    assert memory_fit.fits(False, trainer + sum(lights), limit)
    assert not memory_fit.fits(True, 2 * trainer, limit)
    line = limit - memory_fit.reserve(limit)
    assert line - (trainer + sum(lights)) >= measures.STAGING_MARGIN_BYTES
    assert 2 * trainer - line >= measures.STAGING_MARGIN_BYTES


def test_apart_cannot_be_staged_when_a_trainer_is_no_bigger_than_the_light_clients():
    with pytest.raises(ValueError, match="cannot stage two trainers apart"):
        measures.apart_memory_limit(2 * GIB, [700 * MIB] * 3)


def test_nothing_fits_lets_the_light_clients_fit_together_but_no_trainer():
    limit = measures.nothing_fits_memory_limit(8 * GIB, [GIB, GIB, GIB])
    line = limit - memory_fit.reserve(limit)
    assert 3 * GIB + memory_fit.band(8 * GIB) <= line < 8 * GIB


def test_nothing_fits_is_one_gib_below_a_trainer():
    assert measures.nothing_fits_memory_limit(measures.DEFAULT_TRAINER_BYTES, [4 * GIB]) == GIB
    assert not memory_fit.fits(True, measures.DEFAULT_TRAINER_BYTES, GIB)
    with pytest.raises(ValueError, match="fits in 1024 MiB"):
        measures.nothing_fits_memory_limit(500 * MIB, [])


def made_up_results():
    def latency(p50, tail, tail_name="p99_ms", count=800):
        return {"p50_ms": p50, tail_name: tail, "max_ms": tail * 1.5, "count": count}

    return {
        "solo": {
            "clients": {
                "trainer": {"steps_per_s": 10.0},
                "inference": latency(0.8, 2.0),
                "notebook": latency(15.0, 145.0, "p95_ms", 20),
                "loader": latency(0.3, 0.5),
            }
        },
        "mix_plain": {
            "clients": {
                "trainer": {"steps_per_s": 9.7},
                "inference": latency(2.0, 5.0),
                "notebook": latency(16.0, 146.0, "p95_ms", 20),
                "loader": latency(0.6, 1.0),
            }
        },
        "mix_auto": {
            "clients": {
                "trainer": {"steps_per_s": 9.6},
                "inference": latency(2.1, 14_906.0),
                "notebook": latency(25.0, 9_341.0, "p95_ms", 20),
                "loader": latency(0.7, 1.1),
            }
        },
        "mix_two_trainers_apart": {
            "clients": {
                "trainer": {"steps_per_s": 4.9},
                "trainer_2": {"steps_per_s": 4.85},
                "trainers": {"steps_per_s": 9.75, "shares": [0.5026, 0.4974]},
                "inference": latency(3.0, 6.0),
            }
        },
        "mix_off_vs_plain": {
            "off": {
                "clients": {
                    "inference": latency(2.4, 7.7),
                    "notebook": latency(22.6, 153.0, "p95_ms"),
                }
            },
            "plain": {
                "clients": {
                    "inference": latency(1.7, 4.7),
                    "notebook": latency(13.3, 136.0, "p95_ms"),
                }
            },
        },
    }


def target(run, client, figure):
    (found,) = [t for t in measures.TARGETS if (t.run, t.client, t.figure) == (run, client, figure)]
    return found


@pytest.mark.parametrize(
    "run, client, figure, shown, verdict",
    [
        ("mix_auto", "inference", "p50_ms", "1.050x", "MET"),
        ("mix_auto", "inference", "p99_ms", "2981.200x", "MISSED"),
        ("mix_auto", "notebook", "p95_ms", "64.421x", "MISSED"),
        ("mix_auto", "trainer", "steps_per_s", "0.960x", "MET"),
        ("mix_two_trainers_apart", "trainers", "steps_per_s", "0.975x", "MET"),
        ("mix_two_trainers_apart", "trainers", "shares", "50.3 % / 49.7 %", "MET"),
        ("mix_two_trainers_apart", "inference", "p99_ms", "1.200x", "MET"),
        ("mix_nothing_fits", "inference", "p99_ms", "n/a", "NO DATA"),
        ("mix_off_vs_plain/off", "inference", "p50_ms", "1.412x", "MISSED"),
        ("mix_off_vs_plain/off", "notebook", "p95_ms", "1.125x", "MET"),
    ],
)
def test_each_target_is_judged_against_its_own_reference(run, client, figure, shown, verdict):
    assert measures.verdict(target(run, client, figure), made_up_results()) == (shown, verdict)


def test_absolute_and_solo_plus_targets():
    results = made_up_results()
    results["mix_nothing_fits"] = {
        "clients": {"inference": {"p99_ms": 151.0}, "notebook": {"p95_ms": 290.0}}
    }
    assert measures.verdict(target("mix_nothing_fits", "inference", "p99_ms"), results) == (
        "151.0 ms",
        "MISSED",
    )
    assert measures.verdict(target("mix_nothing_fits", "notebook", "p95_ms"), results) == (
        "+145.0 ms",
        "MET",
    )


def test_shares_outside_the_band_miss():
    results = made_up_results()
    results["mix_two_trainers_apart"]["clients"]["trainers"]["shares"] = [0.56, 0.44]
    assert (
        measures.verdict(target("mix_two_trainers_apart", "trainers", "shares"), results)[1]
        == "MISSED"
    )


def test_the_table_shows_each_run_its_ratios_targets_and_a_tally():
    lines = measures.table(made_up_results())
    rows = {
        tuple(cell.strip() for cell in line.split("|")[1:3]): line
        for line in lines
        if line.startswith("| ")
    }
    auto_inference = rows[("mix_auto", "inference")]
    assert "p50 2.1 / p99 14,906 / max 22,359 ms (n=800)" in auto_inference
    assert "| 2.62x / 7453.00x | 1.05x / 2981.20x |" in auto_inference
    assert auto_inference.endswith("| MET; MISSED |")
    assert "a. p50 <= 1.1x mix_plain: 1.050x; a. p99 <= 1.1x mix_plain: 2981.200x" in auto_inference
    assert "9.75 steps/s; 50.3 / 49.7 %" in rows[("mix_two_trainers_apart", "trainers")]
    assert "| 0.48x | 0.50x |" in rows[("mix_two_trainers_apart", "trainer_2")]
    # The shim's own cost is divided by the plain run of its own phase.
    assert "| 1.41x / 1.64x |" in rows[("mix_off_vs_plain/off", "inference")]
    assert rows[("solo", "trainer")].startswith("| solo | trainer | 10.00 steps/s |  |  |")
    assert lines[-1] == "targets: 6 met, 5 missed, 3 without data"


def with_latencies(auto_ms, plain_ms, second_plain_ms=None):
    """Results whose inference servers kept every latency: the mix under auto, the plain mix and,
    if given, the second run without nvshare."""

    def client(latencies):
        return {"latencies_ms": latencies, **light.latency_summary(latencies, 0.99)}

    results = {
        "mix_plain": {"clients": {"inference": client(plain_ms)}},
        "mix_auto": {"clients": {"inference": client(auto_ms)}},
    }
    if second_plain_ms is not None:
        results["mix_off_vs_plain"] = {"plain": {"clients": {"inference": client(second_plain_ms)}}}
    return results


@pytest.mark.slow  # intervals from 2,000 resamples: ~1-2 s of CPU; make check runs it
def test_a_tail_ratio_comes_with_its_interval_which_narrows_with_more_requests():
    def interval(shown):
        low, high = shown.split("95 %: ")[1].rstrip(")").split("-")
        return float(low), float(high)

    p99 = target("mix_auto", "inference", "p99_ms")
    draw = random.Random(1)
    noisy = [1.0 + draw.expovariate(1.0) for _ in range(6600)]  # a long tail, as requests have
    shown, verdict = measures.verdict(
        p99, with_latencies([1.05 * ms for ms in noisy[:600]], noisy[:600])
    )
    assert shown.startswith("1.050x (95 %: ") and verdict == "MET"
    low, high = interval(shown)
    # The same schedule on both sides (paired): the interval holds the ratio, and no more.
    assert low <= 1.05 <= high
    # Independent samples (the counts differ: no pairs) of 600 and of 3000: the more
    # requests, the narrower.
    small = interval(measures.verdict(p99, with_latencies(noisy[:599], noisy[600:1200]))[0])
    large = interval(measures.verdict(p99, with_latencies(noisy[:2999], noisy[3000:6000]))[0])
    assert large[1] - large[0] < small[1] - small[0]


def test_a_notebooks_mix_of_short_and_long_cells_is_resampled_in_pairs():
    # Same seeded cells on both sides: a resample keeps as many long ones on each.
    cells = [15.0 if i % 3 else 150.0 for i in range(48)]
    results = {
        "mix_off_vs_plain": {
            "off": {"clients": {"notebook": {"latencies_ms": cells, "p50_ms": 15.0}}},
            "plain": {"clients": {"notebook": {"latencies_ms": cells, "p50_ms": 15.0}}},
        }
    }
    shown, _ = measures.verdict(target("mix_off_vs_plain/off", "notebook", "p50_ms"), results)
    assert shown == "1.000x (95 %: 1.00-1.00)"


def test_figures_without_latencies_have_no_interval():
    assert measures.verdict(target("mix_auto", "inference", "p99_ms"), made_up_results())[0] == (
        "2981.200x"
    )


@pytest.mark.slow  # intervals from 2,000 resamples: ~1-2 s of CPU; make check runs it
def test_the_noise_floor_divides_the_second_run_without_nvshare_by_the_first():
    plain = [1.0 + i / 600 for i in range(600)]
    lines = measures.table(with_latencies(plain, plain, [1.1 * ms for ms in plain]))
    (floor,) = [line for line in lines if line.startswith("no nvshare twice")]
    assert floor.startswith(
        "no nvshare twice (mix_off_vs_plain/plain ÷ mix_plain): inference p50 1.100x (95 %: "
    )
    assert ", p99 1.100x (95 %: " in floor


def test_pooled_runs_join_latencies_and_average_trainers():
    first, second = made_up_results(), made_up_results()
    for results, base in ((first, 1.0), (second, 3.0)):
        results["mix_auto"]["clients"]["inference"]["latencies_ms"] = [base] * 100
        results["mix_two_trainers_apart"]["clients"]["trainers"]["shares"] = [
            base / 4,
            1 - base / 4,
        ]
    second["mix_auto"]["clients"]["trainer"]["steps_per_s"] = 9.4
    pooled = measures.pooled([first, second])
    inference = pooled["mix_auto"]["clients"]["inference"]
    assert inference["count"] == 200 and inference["p50_ms"] in (1.0, 3.0)
    assert inference["p99_ms"] == 3.0
    assert pooled["mix_auto"]["clients"]["trainer"]["steps_per_s"] == pytest.approx(9.5)
    assert pooled["mix_two_trainers_apart"]["clients"]["trainers"]["shares"] == [0.5, 0.5]
    # Clients that kept no latencies (older results) are left out rather than made up.
    assert "inference" not in pooled["mix_plain"]["clients"]
    assert pooled["mix_off_vs_plain"]["plain"]["clients"] == {}


@pytest.mark.slow  # intervals from 2,000 resamples: ~1-2 s of CPU; make check runs it
def test_report_prints_the_table_again_from_stored_runs_pooled(tmp_path, capsys):
    paths = []
    for index, scale in enumerate((1.0, 1.2)):
        results = with_latencies(
            [scale * (1 + i / 600) for i in range(600)], [1 + i / 600 for i in range(600)]
        )
        results["environment"] = {"date": f"2026-11-2{index}", "gpu_and_driver": "stand-in"}
        paths.append(tmp_path / f"mix{index}.json")
        paths[-1].write_text(json.dumps(results))
    mix.main(["--report", *map(str, paths)])
    printed = capsys.readouterr().out
    assert f"{paths[0]}: 2026-11-20, stand-in" in printed
    (row,) = [line for line in printed.splitlines() if line.startswith("| mix_auto | inference |")]
    assert "(n=1200)" in row and "a. p99 <= 1.1x mix_plain: 1.194x (95 %: " in row


def test_report_refuses_an_unreadable_file_in_one_line(tmp_path):
    done = run_mix_script("--report", str(tmp_path / "missing.json"))
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.strip().startswith(f"mix: cannot read {tmp_path / 'missing.json'}: ")
    assert len(done.stderr.strip().splitlines()) == 1


FAKE_NVIDIA_SMI = """#!/bin/sh
# A stand-in for nvidia-smi: the queries mix.py and run.py make, one GPU.
case "$*" in
    *index,uuid,memory.free*) echo "0, GPU-6b3f6f1e-0000-0000-0000-000000000000, $FREE_MIB" ;;
    *memory.free*) echo "$FREE_MIB" ;;
    *memory.used*)
        # Successive answers from a list (the solo phase's baselines and footprints), then 100.
        n=$(cat "$USED_LIST.n" 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > "$USED_LIST.n"
        sed -n "${n}p" "$USED_LIST" | grep . || echo 100 ;;
    *name,driver_version*) echo "Stand-in GPU, 0.0" ;;
    *) echo "1980, 300.0, 40, 0x0000000000000000" ;;
esac
"""


@pytest.fixture
def fake_gpu(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI)
    smi.chmod(0o755)
    used = tmp_path / "used"
    # Solo order: trainer, inference, notebook, loader; a baseline then the reading mid-window.
    used.write_text("100\n4196\n100\n700\n100\n900\n100\n600\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FREE_MIB", "80000")
    monkeypatch.setenv("USED_LIST", str(used))
    monkeypatch.delenv("NVSHARE_BENCH_ONLY", raising=False)
    return tmp_path


def run_mix_script(*args, **env):
    return subprocess.run(
        [sys.executable, str(pathlib.Path(mix.__file__)), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
    )


def test_mix_refuses_in_one_line_when_its_memory_is_over_half_the_free(fake_gpu):
    done = run_mix_script(str(fake_gpu / "out"), FREE_MIB="20000")
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "mix: refusing to start: 11 GiB of managed memory is more than half of the GPU's free 20000 MiB"
    ]


def test_mix_refuses_an_unknown_phase_in_one_line(fake_gpu):
    done = run_mix_script(str(fake_gpu / "out"), NVSHARE_BENCH_ONLY="solo,mix_fast")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].startswith("mix: no phase mix_fast (phases: solo, ")


@pytest.mark.slow
def test_a_whole_mix_run_against_stand_in_clients(fake_gpu, monkeypatch, capsys):
    standin = [sys.executable, str(HERE / "mix_standin.py")]
    monkeypatch.setattr(
        mix, "CLIENT_COMMANDS", {kind: [*standin, kind] for kind in mix.CLIENT_COMMANDS}
    )
    monkeypatch.setattr(mix, "TRAINER_SLACK_S", 0.5)
    monkeypatch.setattr(mix, "APART_MIN_WINDOW_S", 1.5)
    monkeypatch.setattr(mix, "environment", lambda: {"gpu_and_driver": "stand-in"})
    # The agents' sockets live in the work folder: keep its path short (a UNIX socket's is 107 bytes).
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    results_dir = fake_gpu / "out"
    mix.main([str(results_dir), "--window", "1"])

    results = json.loads((results_dir / "mix.json").read_text())
    assert [phase for phase in mix.PHASES if "error" in results[phase]] == []
    solo = results["solo"]
    assert solo["clients"]["trainer"]["steps_per_s"] == pytest.approx(45, rel=0.3)
    assert solo["clients"]["inference"]["count"] > 5 and solo["clients"]["loader"]["count"] == 100
    assert solo["clients"]["notebook"]["count"] >= 3
    # The sizes found alone are what the later runs are given.
    assert solo["sizes"] == {
        "inference": ["--passes", "7"],
        "notebook": ["--ms-per-product", "0.35"],
    }
    assert {name: run["footprint_bytes"] >> 20 for name, run in solo["runs"].items()} == {
        "trainer": 4096,
        "inference": 600,
        "notebook": 800,
        "loader": 500,
    }
    for run in (
        "mix_plain",
        "mix_auto",
        "mix_nothing_fits",
        "mix_off_vs_plain/off",
        "mix_off_vs_plain/plain",
    ):
        clients = measures.clients_of(results, run)
        assert set(clients) == {"trainer", "inference", "notebook", "loader"}, run
        assert clients["trainer"]["steps"] > 30 and clients["loader"]["count"] == 100, run
    apart = results["mix_two_trainers_apart"]
    assert apart["window_s"] == 1.5  # two time quanta, at least
    assert set(apart["clients"]) == {
        "trainer",
        "trainer_2",
        "trainers",
        "inference",
        "notebook",
        "loader",
    }
    staged = measures.apart_memory_limit(4096 * MIB, [600 * MIB, 800 * MIB, 500 * MIB])
    assert apart["config"]["memory_limit"] == f"{staged >> 20}M"
    lights = [600 * MIB, 800 * MIB, 500 * MIB]
    nothing = measures.nothing_fits_memory_limit(4096 * MIB, lights)
    assert results["mix_nothing_fits"]["config"]["memory_limit"] == f"{nothing >> 20}M"
    assert results["mix_auto"]["config"]["anti_thrash"] == "auto"
    assert results["mix_off_vs_plain"]["off"]["config"]["anti_thrash"] == "off"
    assert "lock" in results["mix_auto"] and "lock" not in results["mix_plain"]
    logs = sorted(path.name for path in (results_dir / "agent-logs").iterdir())
    assert logs == [
        "mix_auto.log",
        "mix_nothing_fits.log",
        "mix_off_vs_plain.log",
        "mix_two_trainers_apart.log",
    ]
    assert (
        f"memory_limit_bytes={nothing}"
        in (results_dir / "agent-logs" / "mix_nothing_fits.log").read_text()
    )
    printed = capsys.readouterr().out
    assert "| mix_auto | inference | p50 " in printed and "targets: " in printed
    assert "FAILED" not in printed
