#!/usr/bin/env python3
"""Two GPUs of one host (issue 31): each GPU's lock is its own.

Phases, all under one agent per phase at the defaults (anti-thrash auto, TQ 30 s):
- solo_gpu0, solo_gpu1, solo_split: without nvshare, the reference trainer alone
  on each GPU, and the split trainer (its six layers pipelined over GPUs 0 and 1)
  alone on both: the rates the others are divided by.
- two_trainers: a trainer on each GPU under the shim, at the same time.  Neither
  may wait for the other (no drop, no revoke) and each keeps >= 0.99x its solo rate.
- split_beside: the split trainer beside a trainer on each GPU: its grants on both
  GPUs, the turns and drops on each, and every process's rate against its solo.

CUDA numbers GPUs fastest first unless told otherwise; CUDA_DEVICE_ORDER=PCI_BUS_ID
makes its indices nvidia-smi's, so each process's GPU is known by UUID.

    bench/gpu/run.sh --multi-gpu [RESULTS]
Prints a table; full numbers in RESULTS/multi_gpu.json.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import tempfile

from gpu_measures import drop_stats, percentile, steps_per_s
from gpu_state import environment, nvidia_smi_rows
from harness import Agent, finish_json, run_json, start_json, trainer, wait_for_file
from phase_runner import run_phases

PCI_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
# A reference trainer holds ~3.5 GiB of managed memory; the split one ~3.5 GiB over
# both GPUs.  On each GPU at most one trainer and half the split one: planned with room.
PLANNED_MANAGED_GIB_PER_GPU = 6
SOLO_S, PAIR_S, SPLIT_S = 16, 30, 40


def gpus() -> list[dict]:
    """Each GPU as nvidia-smi (PCI order) lists it: index, UUID, free memory."""
    return [
        {"index": int(index), "uuid": uuid, "free_mib": int(free)}
        for index, uuid, free in nvidia_smi_rows("--query-gpu=index,uuid,memory.free")
    ]


def check_gpus(found: list[dict]) -> None:
    if len(found) < 2:
        sys.exit(f"multi_gpu: needs two GPUs, nvidia-smi lists {len(found)}")
    for gpu in found[:2]:
        if gpu["free_mib"] / 2 < PLANNED_MANAGED_GIB_PER_GPU * 1024:
            sys.exit(
                f"multi_gpu: refusing to start: {PLANNED_MANAGED_GIB_PER_GPU} GiB of managed memory"
                f" is more than half of GPU {gpu['index']}'s free {gpu['free_mib']} MiB"
            )


def plain_env(**extra) -> dict:
    env = dict(os.environ, **PCI_ORDER, **{k: str(v) for k, v in extra.items()})
    env.pop("LD_PRELOAD", None)
    return env


def solo(seconds, env, *trainer_args) -> dict:
    result = run_json(trainer("--seconds", str(seconds), *trainer_args), env=env)
    return {"steps_per_s": steps_per_s(result["step_times"])}


def rate_between(step_times, start, end) -> float:
    """Steps finished in (start, end] over its whole length: a process that stopped
    for a while inside it (waiting for a GPU) counts that time too."""
    inside = sum(start < t <= end for t in step_times)
    return inside / (end - start) if end > start else float("nan")


def grant_summary(agent: Agent, pids: dict[str, int], uuids: list[str]) -> dict:
    """Per process (by role): the GPUs it was granted, by index, and its waits for them."""
    index_of = {uuid: index for index, uuid in enumerate(uuids)}
    summary = {}
    for role, pid in pids.items():
        grants = [e for e in agent.events("grant") if e.get("pid") == str(pid)]
        waits = [float(e["waited_ms"]) for e in grants]
        summary[role] = {
            "gpus": sorted({index_of.get(e["gpu"], e["gpu"]) for e in grants}, key=str),
            "grants_per_gpu": {
                str(index): sum(index_of.get(e["gpu"]) == index for e in grants)
                for index in range(len(uuids))
            },
            "wait_p50_ms": percentile(waits, 0.5),
            "wait_max_ms": max(waits, default=float("nan")),
        }
    return summary


def drops_per_gpu(agent: Agent, uuids: list[str]) -> dict:
    releases = agent.events("release")
    found = {}
    for index, uuid in enumerate(uuids):
        drops = [
            float(e["drop_to_release_ms"])
            for e in releases
            if e.get("gpu") == uuid and "drop_to_release_ms" in e
        ]
        found[str(index)] = {"drops": len(drops), **drop_stats(drops)}
    return found


def lock_figures(agent: Agent, pids: dict[str, int], uuids: list[str]) -> dict:
    """What the agent's log says of a phase: grants per process, drops per GPU, revokes."""
    return {
        "grants": grant_summary(agent, pids, uuids),
        "drops_per_gpu": drops_per_gpu(agent, uuids),
        "revokes": len(agent.events("revoke")),
    }


def two_trainers(workdir: pathlib.Path, uuids: list[str]) -> dict:
    agent = Agent(workdir, time_quantum_s=30, anti_thrash="auto")
    try:
        processes = [
            start_json(
                trainer("--seconds", str(PAIR_S)),
                env=agent.env(CUDA_VISIBLE_DEVICES=index, **PCI_ORDER),
            )
            for index in (0, 1)
        ]
        results = [finish_json(process) for process in processes]
        pids = {f"trainer_gpu{index}": p.pid for index, p in enumerate(processes)}
        figures = lock_figures(agent, pids, uuids)
    finally:
        agent.stop()
    # Both training: from the later one's fourth step to the earlier one's last.
    start = max(r["step_times"][3] for r in results)
    end = min(r["step_times"][-1] for r in results)
    return {
        "window_s": end - start,
        "steps_per_s": [rate_between(r["step_times"], start, end) for r in results],
        **figures,
    }


def split_beside(workdir: pathlib.Path, uuids: list[str]) -> dict:
    agent = Agent(workdir, time_quantum_s=30, anti_thrash="auto")
    try:
        # The trainers outlive the split one, so it competes on both GPUs all along.
        trainers, ready = [], []
        for index in (0, 1):
            ready.append(agent.dir / f"trainer{index}-ready")
            trainers.append(
                start_json(
                    trainer("--seconds", str(SPLIT_S + 30), "--ready-file", str(ready[-1])),
                    env=agent.env(CUDA_VISIBLE_DEVICES=index, **PCI_ORDER),
                )
            )
        for path, process in zip(ready, trainers):
            wait_for_file(path, process)
        split_process = start_json(
            trainer("--seconds", str(SPLIT_S), "--devices", "0,1"),
            env=agent.env(**PCI_ORDER),
        )
        split = finish_json(split_process, timeout=SPLIT_S + 180)
        for process in trainers:
            if process.poll() is not None:
                raise RuntimeError(f"a trainer stopped before the split one:\n{process.args}")
        results = [finish_json(process, timeout=120) for process in trainers]
        pids = {f"trainer_gpu{i}": p.pid for i, p in enumerate(trainers)}
        pids["split"] = split_process.pid
        figures = lock_figures(agent, pids, uuids)
        modes = [e.get("mode") for e in agent.events("mode")]
    finally:
        agent.stop()
    # While the split one trained: from its fourth step to its last.
    start, end = split["step_times"][3], split["step_times"][-1]
    return {
        "window_s": end - start,
        "split_steps_per_s": rate_between(split["step_times"], start, end),
        "trainer_steps_per_s": [rate_between(r["step_times"], start, end) for r in results],
        **figures,
        "auto_modes": modes,
    }


def print_table(results: dict) -> None:
    def rate(phase, key="steps_per_s"):
        return results.get(phase, {}).get(key)

    def ratio(value, alone):
        return "n/a" if value is None or not alone else f"{value / alone:.3f}x"

    solos = [rate("solo_gpu0"), rate("solo_gpu1")]
    print()
    print("| figure | measured | target |")
    print("|---|---|---|")
    for name in ("solo_gpu0", "solo_gpu1", "solo_split"):
        value = rate(name)
        shown = "n/a" if value is None else f"{value:.3f} steps/s"
        print(f"| {name} (no nvshare) | {shown} | |")
    pair = results.get("two_trainers", {})
    for index, value in enumerate(pair.get("steps_per_s", [])):
        print(
            f"| two GPUs: trainer on GPU {index} / its solo | {ratio(value, solos[index])} | ≥ 0.99x |"
        )
    if pair.get("grants"):
        drops = sum(d["drops"] for d in pair["drops_per_gpu"].values())
        waits = ", ".join(f"{g['wait_max_ms']:.1f}" for g in pair["grants"].values())
        gpus_held = "; ".join(f"{role}: {g['gpus']}" for role, g in pair["grants"].items())
        print(
            f"| two GPUs: drops, revokes; longest grant wait per trainer (ms) | "
            f"{drops}, {pair['revokes']}; {waits} | 0, 0 |"
        )
        print(f"| two GPUs: GPUs each was granted | {gpus_held} | its own only |")
    beside = results.get("split_beside", {})
    if "split_steps_per_s" in beside:
        print(
            f"| split beside a trainer on each: split / its solo | "
            f"{ratio(beside['split_steps_per_s'], rate('solo_split'))} | (report) |"
        )
        for index, value in enumerate(beside["trainer_steps_per_s"]):
            print(
                f"| split beside: trainer on GPU {index} / its solo | "
                f"{ratio(value, solos[index])} | (report) |"
            )
        for index, drops in beside["drops_per_gpu"].items():
            print(
                f"| split beside: GPU {index} drops, drop → release p50 / p99 (ms) | "
                f"{drops['drops']}, {drops['drop_to_release_p50_ms']:.1f} / "
                f"{drops['drop_to_release_p99_ms']:.1f} | |"
            )
        split_grants = beside["grants"]["split"]["grants_per_gpu"]
        print(
            f"| split beside: the split one's grants per GPU; revokes | {split_grants}; "
            f"{beside['revokes']} | |"
        )
    for name, phase in results.items():
        if isinstance(phase, dict) and "error" in phase:
            print(f"| {name} FAILED | {phase['error'].splitlines()[-1][:100]} | |")


def main() -> None:
    results_dir = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "results/gpu")
    results_dir.mkdir(parents=True, exist_ok=True)
    found = gpus()
    check_gpus(found)
    uuids = [gpu["uuid"] for gpu in found]
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="nvshare-multi-gpu-"))
    results = {"environment": environment(), "gpus": found}
    phases = [
        ("solo_gpu0", lambda: solo(SOLO_S, plain_env(CUDA_VISIBLE_DEVICES=0))),
        ("solo_gpu1", lambda: solo(SOLO_S, plain_env(CUDA_VISIBLE_DEVICES=1))),
        ("solo_split", lambda: solo(SOLO_S, plain_env(), "--devices", "0,1")),
        ("two_trainers", lambda: two_trainers(workdir, uuids)),
        ("split_beside", lambda: split_beside(workdir, uuids)),
    ]
    # nvidia-smi's clock sampler reads every GPU into one series: left out here.
    run_phases(
        phases,
        results,
        results_dir / "multi_gpu.json",
        unsampled={name for name, _ in phases},
        workdir=workdir,
    )
    print_table(results)
    print(json.dumps({k: v for k, v in results.items() if k != "environment"})[:4000])


if __name__ == "__main__":
    main()
