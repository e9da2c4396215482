"""Two GPUs of one host: each GPU has a lock of its own, named by the UUID that NVML and
nvidia-smi print, whatever index CUDA_VISIBLE_DEVICES gives it inside the process.

Needs two GPUs or more (the device tool's nvidia-h200-x2); skipped with fewer.  CUDA numbers
GPUs fastest first unless told otherwise; CUDA_DEVICE_ORDER=PCI_BUS_ID makes its indices
nvidia-smi's, so the test knows which UUID each index is.
"""

import os
import pathlib
import shutil
import subprocess
import sys
import time

import harness as bench
import pytest
from json_program import run_json_program

HERE = pathlib.Path(__file__).parent
PCI_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def _gpu_uuids() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    listed = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True, text=True
    )
    return (
        [line.strip() for line in listed.stdout.splitlines() if line.strip()]
        if listed.returncode == 0
        else []
    )


UUIDS = _gpu_uuids()
pytestmark = pytest.mark.skipif(len(UUIDS) < 2, reason="needs two GPUs")


def training(*args) -> list[str]:
    return [sys.executable, str(HERE / "torch_train.py"), *args]


def grants_by_pid(agent) -> dict[str, list[str]]:
    """Each process's grants, as the GPUs' UUIDs in the order they came."""
    found = {}
    for event in agent.events("grant"):
        found.setdefault(event["pid"], []).append(event["gpu"])
    return found


def test_trainers_on_two_gpus_hold_their_locks_at_once(start_agent, shim_env):
    agent = start_agent(time_quantum_s=2, anti_thrash=True)
    # Each sees one GPU as its device 0: the shim must name the physical one.
    processes = [
        bench.start_json(
            training("--seconds", "8"),
            env=shim_env(agent, CUDA_VISIBLE_DEVICES=str(index), **PCI_ORDER),
        )
        for index in (0, 1)
    ]
    results = [bench.finish_json(process) for process in processes]
    assert all(result["managed"] for result in results)
    grants = grants_by_pid(agent)
    for index, process in enumerate(processes):
        assert set(grants[str(process.pid)]) == {UUIDS[index]}, agent.log()
    assert not agent.events("drop"), agent.log()  # neither waited for the other's GPU
    first, second = (sorted(result["step_times"]) for result in results)
    assert min(first[-1], second[-1]) - max(first[0], second[0]) > 5.0, (
        "they did not train at the same time"
    )


def test_one_process_over_two_gpus_takes_both_locks_and_trains_as_alone(start_agent, shim_env):
    split = ("--devices", "0,1", "--steps", "600")  # ~3 s of steps alone: several quanta
    plain, _ = run_json_program(training(*split), dict(os.environ, **PCI_ORDER))
    agent = start_agent(time_quantum_s=1, anti_thrash=True)
    beside = bench.start_json(
        training("--seconds", "20"), env=shim_env(agent, CUDA_VISIBLE_DEVICES="1", **PCI_ORDER)
    )
    deadline = time.monotonic() + 60
    while not agent.events("grant"):  # the trainer on GPU 1 holds it first
        assert beside.poll() is None and time.monotonic() < deadline, (
            "the trainer on GPU 1 got no grant"
        )
        time.sleep(0.2)
    shared, stderr = run_json_program(training(*split), shim_env(agent, **PCI_ORDER))
    beside_result = bench.finish_json(beside)
    assert shared["managed"] and beside_result["managed"], stderr[-2000:]
    assert (shared["losses"], shared["checksum"]) == (plain["losses"], plain["checksum"])
    grants = grants_by_pid(agent)
    beside_grants = grants.pop(str(beside.pid))
    (split_grants,) = grants.values()
    assert set(beside_grants) == {UUIDS[1]} and set(split_grants) == set(UUIDS[:2]), agent.log()
    # They took turns on GPU 1 (the split process lost it and came back), and only there.
    assert split_grants.count(UUIDS[1]) >= 2, agent.log()
    assert {event["gpu"] for event in agent.events("drop")} == {UUIDS[1]}, agent.log()


def test_pipelines_crossing_two_gpus_in_opposite_orders_both_finish_correctly(
    start_agent, shim_env
):
    # Each holds one GPU while it waits for the other: the time quantum must break the cycle.
    orders, steps = ("0,1", "1,0"), ("--steps", "300")  # ~1.5 s of steps alone each
    plain = [
        run_json_program(training("--devices", order, *steps), dict(os.environ, **PCI_ORDER))[0]
        for order in orders
    ]
    agent = start_agent(time_quantum_s=1, anti_thrash=True)
    processes = [
        bench.start_json(training("--devices", order, *steps), env=shim_env(agent, **PCI_ORDER))
        for order in orders
    ]
    results = [bench.finish_json(process, timeout=240) for process in processes]
    for result, alone in zip(results, plain):
        assert (result["losses"], result["checksum"]) == (alone["losses"], alone["checksum"])
    grants = grants_by_pid(agent)
    assert all(set(grants[str(process.pid)]) == set(UUIDS[:2]) for process in processes), (
        agent.log()
    )
    # The premise: they met on both GPUs, each asked to give a GPU up to the other.
    assert {event["gpu"] for event in agent.events("drop")} == set(UUIDS[:2]), agent.log()
