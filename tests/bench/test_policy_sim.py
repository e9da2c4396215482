"""bench/policy_sim.py: the real scheduling core against played clients, no GPU."""

import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import policy_sim

from nvshare_agent.settings import Settings

SCRIPT = pathlib.Path(policy_sim.__file__)


def run(*clients, seconds=60.0, tq=5, gpu_gib=40.0, **kwargs):
    settings = Settings(time_quantum_s=tq)
    return policy_sim.simulate(list(clients), seconds, settings, gpu_gib, **kwargs)["clients"]


def test_two_trainers_that_do_not_fit_together_take_whole_turns_and_split_the_gpu():
    figures = run("trainer@30", "trainer@30")
    first, second = figures["1 trainer"], figures["2 trainer"]
    assert 0.45 <= first["share"] / (first["share"] + second["share"]) <= 0.55
    # Each turn is a quantum: the other's comes round every two.
    assert first["median_turn_gap_s"] == pytest.approx(10, abs=0.2)
    # A step that came as the turn ended waited the other's quantum.
    assert first["max_s"] == pytest.approx(5.1, abs=0.1)


def test_an_inference_server_that_fits_runs_beside_a_trainer_at_once():
    figures = run("trainer@30", "service:0.05:0.001@4")
    assert figures["2 service"]["done"] >= 1199  # a request every 50 ms, each answered
    assert figures["2 service"]["p99_s"] <= 0.002  # its own 1 ms, no wait
    assert figures["1 trainer"]["share"] >= 0.94


def test_one_that_does_not_fit_is_served_in_windows_within_the_light_wait():
    figures = run("trainer@30", "service:0.05:0.001@12")
    # light_wait_ms 100 less the drain, a 20 ms drain, the request's own 1 ms.
    assert figures["2 service"]["max_s"] <= 0.13
    assert figures["1 trainer"]["share"] >= 0.85


def test_a_displaced_turn_brings_its_memory_back_first():
    plain = run("trainer@30", "trainer@30")
    swapping = run("trainer@30", "trainer@30", swap_s=0.5)
    lost = plain["1 trainer"]["share"] - swapping["1 trainer"]["share"]
    # Half a second at each of its ~6 turns in 60 s: 5 % of the GPU.
    assert 0.03 <= lost <= 0.07


@pytest.mark.parametrize(
    "args, error",
    [
        (
            ["painter"],
            "policy_sim: 'painter': no kind 'painter' (kinds: trainer, service, notebook)",
        ),
        (
            ["service:0.05"],
            "policy_sim: 'service:0.05': give both of service's numbers, or neither",
        ),
        (["trainer:x:1"], "policy_sim: 'trainer:x:1': not a number"),
        (
            ["service:0.05:0"],
            "policy_sim: 'service:0.05:0': times must be positive, memory not negative",
        ),
        (
            ["trainer", "--seconds", "0"],
            "policy_sim: --seconds, --gpu-gib and --tq must be positive, --swap-s not negative",
        ),
    ],
)
def test_bad_clients_and_settings_get_one_line(args, error):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.strip() == error


def test_the_table_has_a_row_per_client_and_the_idle_gpu():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "trainer@30", "notebook@2", "--seconds", "20", "--tq", "5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[2].startswith("| 1 trainer | ") and lines[3].startswith("| 2 notebook | ")
    assert lines[-1].startswith("GPU idle while work waited: ")
