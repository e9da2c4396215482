#!/usr/bin/env python3
"""A node's real mix on one GPU (issue 35), in one run: the reference trainer, an inference
server (Poisson requests, inference.py), a notebook (cells of 15 or 150 ms, notebook_cells.py)
and a data loader (a batch every 10 ms, loader.py), each against its solo figures and against
the same mix without nvshare.

Phases (NVSHARE_BENCH_ONLY=phase,phase picks some; the order is fixed):
- solo: each client alone, no nvshare (windows of 8-25 s); also each one's footprint on
  the GPU (nvidia-smi's memory.used over its baseline) and the light clients' sizes, which
  every later phase reuses so that their work is the same in each.
- mix_plain: trainer and the three light clients, no nvshare (the driver's time-slicing).
- mix_auto: the same under the shim and an agent at its defaults (memory fits).
- mix_two_trainers_apart: two trainers and the light clients, memory_limit staged so that
  the two trainers do not fit together but either fits beside the light clients (by the
  agent's own memory_fit rule and the solo footprints); a window of four time quanta,
  120 s: turns end early (a yield once idle), and two of them split a 60 s window by chance.
- mix_nothing_fits: memory_limit = 1G, below one trainer.
- mix_off_vs_plain: the mix under the shim with anti_thrash = off, then without nvshare.

In each run the light clients start first and set up (nothing else on the GPU), then the
trainers; once a trainer has taken its first step mix.py writes the window's start to a go
file, and every client is measured over the same window (--window, 40 s by default).

    bench/gpu/run.sh --mix [RESULTS] [--window S]   # about 8.5 minutes at 40 s (NVSHARE_MIX_WINDOW_S)
Prints a table; full numbers in RESULTS/mix.json, agent logs in RESULTS/agent-logs/.
Safety: all the managed memory of the largest phase (two trainers and the light clients,
11 GiB planned) stays under half of the GPU's free memory, checked before start and again
with the footprints the solo phase measured.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

import mix_measures as measures
from gpu_state import check_memory, environment, nvidia_smi_rows
from harness import Agent, finish_json, start_json, stop_process, wait_for_file
from multi_gpu import gpus, lock_figures
from phase_runner import run_phases

from nvshare_agent.settings import DEFAULT_SETTINGS

HERE = pathlib.Path(__file__).resolve().parent
# Each client's command, before the window's arguments (tests put stand-ins here).
CLIENT_COMMANDS = {
    # Wider than run.py's reference (~2.8 GiB): a trainer must outweigh the three light
    # clients (~2.4 GiB with their contexts) to stage "apart" and "nothing fits".
    "trainer": [sys.executable, str(HERE / "trainer.py"), "--width", "8192"],
    "inference": [sys.executable, str(HERE / "inference.py")],
    "notebook": [sys.executable, str(HERE / "notebook_cells.py")],
    "loader": [sys.executable, str(HERE / "loader.py")],
}
LIGHT = ("inference", "notebook", "loader")
PHASES = (
    "solo",
    "mix_plain",
    "mix_auto",
    "mix_two_trainers_apart",
    "mix_nothing_fits",
    "mix_off_vs_plain",
)
# Solo windows: a trainer's rate settles in 12 s, 300 requests come in 15 s, 800 batches in
# 8 s; cells are fewer (about one in 1.6 s).
SOLO_WINDOWS_S = {"trainer": 12, "inference": 15, "notebook": 25, "loader": 8}
# Two trainers that do not fit together take turns of a time quantum (30 s at the defaults):
# a window of two quanta gives each one turn, so that their shares can be judged.
APART_MIN_WINDOW_S = 4 * DEFAULT_SETTINGS.time_quantum_s
# A trainer's --seconds counts from its loop's start, a little before the window's.
TRAINER_SLACK_S = 5.0
# A run's set-up and wind-down besides its window (torch's import, CUDA contexts), for the
# time budget; and the budget itself, under the device's 600 s per command.
RUN_OVERHEAD_S = 12
DEFAULT_BUDGET_S = 560
PLANNED_MANAGED_GIB = 11  # two trainers of ~4 GiB, three light clients under 1 GiB each
PCI_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}  # CUDA's GPU 0 is nvidia-smi's GPU 0


def plain_env() -> dict:
    env = dict(os.environ, **PCI_ORDER)
    env.pop("LD_PRELOAD", None)
    return env


def used_mib() -> int:
    return int(nvidia_smi_rows("--query-gpu=memory.used")[0][0])


def wait_for_any(paths: list[pathlib.Path], processes: list, timeout=180) -> None:
    """Returns once one of the processes made its file: under nvshare the others may be
    waiting for a turn, and that wait is part of what is measured."""
    deadline = time.monotonic() + timeout
    while not any(path.exists() for path in paths):
        for path, process in zip(paths, processes):
            if process.poll() is not None:
                wait_for_file(path, process, timeout=0)  # raises, with its output
        if time.monotonic() > deadline:
            raise RuntimeError(f"no trainer took a step in {timeout} s")
        time.sleep(0.05)


class Mix:
    def __init__(self, workdir: pathlib.Path, window_s: float, free_mib: int, budget_s: float):
        self.workdir, self.window_s, self.free_mib = workdir, window_s, free_mib
        self.deadline = time.monotonic() + budget_s
        self.sizes: dict[str, list[str]] = {}  # each light client's size, from its solo run
        self.footprints: dict[str, int] = {}  # bytes, from the solo runs
        self.refusal = ""  # why the mix phases must not start, once the solo phase says so
        self.uuid = gpus()[0]["uuid"]

    def client_command(self, name: str, window_s: float, ready: pathlib.Path, go) -> list[str]:
        command = [*CLIENT_COMMANDS[name], "--ready-file", str(ready)]
        if name == "trainer":
            return [*command, "--seconds", str(window_s + TRAINER_SLACK_S)]
        return [
            *command,
            "--seconds",
            str(window_s),
            "--go-file",
            str(go),
            *self.sizes.get(name, []),
        ]

    def in_budget(self, windows: list[float]) -> None:
        needed = sum(window + RUN_OVERHEAD_S for window in windows)
        if time.monotonic() + needed > self.deadline:
            raise RuntimeError(f"skipped: its ~{needed:.0f} s would pass the time budget")

    def run_clients(self, env, light, trainers=1, window_s=None, measure_footprint=False) -> dict:
        """One run: the light clients, then the trainers, measured over one window."""
        window_s = window_s or self.window_s
        rundir = pathlib.Path(tempfile.mkdtemp(dir=self.workdir, prefix="run-"))
        go_file = rundir / "go"
        trainer_names = ["trainer", *[f"trainer_{i + 2}" for i in range(trainers - 1)]][:trainers]
        names = [*light, *trainer_names]
        processes, ready = {}, {name: rundir / f"{name}-ready" for name in names}
        baseline = used_mib() if measure_footprint else 0
        try:
            # The light clients set up alone (the notebook times its products), then the trainers.
            for group in (light, trainer_names):
                for name in group:
                    command = self.client_command(
                        name.split("_")[0], window_s, ready[name], go_file
                    )
                    processes[name] = start_json(command, env=env)
                if group is light:
                    for name in light:
                        wait_for_file(ready[name], processes[name], timeout=180)
            if trainer_names:
                wait_for_any(
                    [ready[n] for n in trainer_names], [processes[n] for n in trainer_names]
                )
            go_at = time.time() + 0.1
            (rundir / "go.tmp").write_text(repr(go_at))
            (rundir / "go.tmp").rename(go_file)
            footprint = None
            if measure_footprint:
                time.sleep(max(0.0, go_at + window_s / 2 - time.time()))
                footprint = (used_mib() - baseline) << 20
            outputs = {name: finish_json(processes[name], timeout=window_s + 300) for name in names}
        finally:
            for process in processes.values():
                if process.poll() is None:
                    stop_process(process)
        clients = measures.trainer_figures(
            [outputs[n] for n in trainer_names], go_at, go_at + window_s
        )
        for name in light:
            clients[name] = measures.light_figures(name, outputs[name])
        cut_short = [n for n in trainer_names if clients[n]["last_step_at"] < go_at + window_s]
        return {
            "window_s": window_s,
            "clients": clients,
            "pids": {name: process.pid for name, process in processes.items()},
            **({"footprint_bytes": footprint} if measure_footprint else {}),
            **({"trainers_cut_short": cut_short} if cut_short else {}),
        }

    def under_agent(self, light=LIGHT, trainers=1, window_s=None, **settings) -> dict:
        """One run of the mix under the shim and an agent with these settings (else its defaults)."""
        settings = {
            "time_quantum_s": DEFAULT_SETTINGS.time_quantum_s,
            "anti_thrash": DEFAULT_SETTINGS.anti_thrash.value,
            "idle_release_ms": DEFAULT_SETTINGS.idle_release_ms,
            **settings,
        }
        agent = Agent(self.workdir, **settings)
        try:
            run = self.run_clients(agent.env(**PCI_ORDER), light, trainers, window_s)
            lock = lock_figures(agent, run["pids"], [self.uuid])
            drops = agent.events("drop")
            modes = [event.get("mode") for event in agent.events("mode")]
        finally:
            agent.stop()
        reasons: dict[str, int] = {}
        for event in drops:
            reasons[event.get("reason", "?")] = reasons.get(event.get("reason", "?"), 0) + 1
        return {
            "config": settings,
            **run,
            "lock": {**lock, "drop_reasons": reasons, "modes": modes},
        }

    def footprint_plan(self) -> tuple[int, list[int]]:
        """(one trainer, each light client) in bytes: the solo phase's, else the defaults."""
        trainer = self.footprints.get("trainer", measures.DEFAULT_TRAINER_BYTES)
        return trainer, [self.footprints.get(n, measures.DEFAULT_LIGHT_BYTES) for n in LIGHT]

    # ------------------------------------------------------------------ phases

    def solo(self) -> dict:
        windows = {name: min(seconds, self.window_s) for name, seconds in SOLO_WINDOWS_S.items()}
        self.in_budget(list(windows.values()))
        runs = {}
        for name, window_s in windows.items():
            light = [] if name == "trainer" else [name]
            runs[name] = self.run_clients(
                plain_env(), light, int(name == "trainer"), window_s, True
            )
            if runs[name]["footprint_bytes"] > 0:
                self.footprints[name] = runs[name]["footprint_bytes"]
        figures = {name: run["clients"][name] for name, run in runs.items()}
        if "passes" in figures["inference"]:
            self.sizes["inference"] = ["--passes", str(figures["inference"]["passes"])]
        if "ms_per_product" in figures["notebook"]:
            self.sizes["notebook"] = [
                "--ms-per-product",
                str(figures["notebook"]["ms_per_product"]),
            ]
        trainer, light = self.footprint_plan()
        largest = 2 * trainer + sum(light)
        if largest > self.free_mib / 2 * (1 << 20):
            self.refusal = (
                f"refused: two trainers and the light clients as measured alone take "
                f"{largest >> 20} MiB, over half the GPU's free {self.free_mib} MiB"
            )
        return {
            "clients": figures,
            "runs": runs,
            "sizes": self.sizes,
            "largest_phase_bytes": largest,
        }

    def checked(self, windows: list[float]) -> None:
        """Before a mix phase: the time left, and the memory the solo phase measured."""
        if self.refusal:
            raise RuntimeError(self.refusal)
        self.in_budget(windows)

    def mix_plain(self) -> dict:
        self.checked([self.window_s])
        return self.run_clients(plain_env(), LIGHT)

    def mix_auto(self) -> dict:
        self.checked([self.window_s])
        return self.under_agent()

    def mix_two_trainers_apart(self) -> dict:
        window_s = max(self.window_s, APART_MIN_WINDOW_S)
        self.checked([window_s])
        limit = measures.apart_memory_limit(*self.footprint_plan())
        return self.under_agent(trainers=2, window_s=window_s, memory_limit=f"{limit >> 20}M")

    def mix_nothing_fits(self) -> dict:
        self.checked([self.window_s])
        limit = measures.nothing_fits_memory_limit(*self.footprint_plan())
        return self.under_agent(memory_limit=f"{limit >> 20}M")

    def mix_off_vs_plain(self) -> dict:
        self.checked([self.window_s, self.window_s])
        return {
            "off": self.under_agent(anti_thrash="off"),
            "plain": self.run_clients(plain_env(), LIGHT),
        }


def lock_lines(results: dict) -> list[str]:
    """What each nvshare run's agent did: grants and waits per client, drops by reason."""
    lines = []
    for run in measures.RUNS:
        phase, _, part = run.partition("/")
        found = results.get(phase, {})
        lock = (found.get(part, {}) if part else found).get("lock")
        if not lock:
            continue
        grants = ", ".join(
            f"{role} {sum(g['grants_per_gpu'].values())} "
            f"(wait p50 {g['wait_p50_ms']:.1f} / max {g['wait_max_ms']:.1f} ms)"
            for role, g in lock["grants"].items()
        )
        lines.append(
            f"{run}: grants {grants}; drops {lock['drop_reasons']}; revokes {lock['revokes']}"
        )
    return lines


def report_again(paths: list[str]) -> None:
    """The table of earlier runs, from their mix.json; several are pooled (mix_measures.pooled)."""
    runs = []
    for path in paths:
        try:
            runs.append(json.loads(pathlib.Path(path).read_text()))
        except (OSError, ValueError) as error:
            sys.exit(f"mix: cannot read {path}: {error}")
        environment = runs[-1].get("environment", {})
        print(f"{path}: {environment.get('date', '?')}, {environment.get('gpu_and_driver', '?')}")
    print("\n".join(measures.table(runs[0] if len(runs) == 1 else measures.pooled(runs))))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="mix", description="issue 35's node mix on one GPU")
    parser.add_argument("results", nargs="?", default=str(HERE.parents[1] / "results" / "gpu"))
    parser.add_argument(
        "--window", type=float, default=float(os.environ.get("NVSHARE_MIX_WINDOW_S", 40))
    )
    parser.add_argument(
        "--report",
        nargs="+",
        metavar="MIX_JSON",
        help="print the table again from earlier runs' mix.json, several pooled, and run nothing",
    )
    args = parser.parse_args(argv)
    if args.report:
        report_again(args.report)
        return
    if not args.window > 0:
        sys.exit(f"mix: the window must be a positive number of seconds, not {args.window}")
    only = set(os.environ.get("NVSHARE_BENCH_ONLY", "").split(",")) - {""}
    if only - set(PHASES):
        sys.exit(
            f"mix: no phase {', '.join(sorted(only - set(PHASES)))} (phases: {', '.join(PHASES)})"
        )
    results_dir = pathlib.Path(args.results)
    results_dir.mkdir(parents=True, exist_ok=True)
    free_mib = check_memory(PLANNED_MANAGED_GIB, "mix")
    budget_s = float(os.environ.get("NVSHARE_MIX_BUDGET_S", DEFAULT_BUDGET_S))
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="nvshare-mix-"))
    mix = Mix(workdir, args.window, free_mib, budget_s)
    results = {
        "environment": environment(),
        "gpu_free_mib_at_start": free_mib,
        "window_s": args.window,
    }
    phases = [(name, getattr(mix, name)) for name in PHASES]
    run_phases(phases, results, results_dir / "mix.json", workdir=workdir)
    print()
    print("\n".join(measures.table(results)))
    print("\n".join(lock_lines(results)))
    for name, phase in results.items():
        if isinstance(phase, dict) and "error" in phase:
            print(f"{name} FAILED: {phase['error'].strip().splitlines()[-1][:200]}")
    print(json.dumps({"results": str(results_dir / "mix.json")}))


if __name__ == "__main__":
    main()
