#!/usr/bin/env python3
"""Issue 44's shapes f and g on one GPU, in one run.

f. Duty processes (duty_client.py): bursts of ~30 ms of GPU work, each process busy a set
   fraction of the time alone.  Sets: four at 10, 30, 50 and 70 % (f4), eight at 30 % (f8).
   Each set runs without nvshare, then under the shim and an agent at its defaults
   (anti-thrash auto); in each run the set is measured alone for one window, then an
   always-busy trainer joins it and all are measured for another.  The trainer is
   trainer.py's step at width 2048, batch 4096 (~0.7 GiB; the reference's 2.8 GiB would
   break the 1 GiB a process), its loss read every step.
g. A loader-bound trainer (~60 ms of GPU work, then ~90 ms waiting for its batch, per step)
   beside a busy trainer, in both arrival orders (the second released 3 s after the first
   took its first step), without and with nvshare (g_loader); a two-stage pipeline
   (duty_pipeline.py), its queue unbounded and bounded at 2, without and with nvshare
   (g_pipe).
First, every kind of process alone without nvshare (solo: one per distinct duty, the
trainer, the loader-bound trainer), the first of them sizing the bursts of all the others.

    bench/gpu/run.sh --duty [RESULTS] [--window S] [--only f4,f8,g_loader,g_pipe] [--budget S]
    bench/gpu/run.sh --duty --plan      # the runs and their estimated time; runs nothing

Every process of the whole run starts at once and imports torch before anything is
measured, then waits for its run (duty_client.py's --hold), so a run's processes arrive
on the GPU together, or 3 s apart, rather than when their imports happen to end.  A window
starts after each process of it has done a first unit and a warm-up (2 s).  A run that
would end past --budget (440 s from the start) is skipped and said so: the device allows
8 minutes a command.  The pipeline's windows are 2/3 of --window.

Targets (duty_table.py): each duty process >= 0.95x its rate without nvshare, or 0.95x its
max-min fair share of GPU time (from its solo rate and GPU time per burst) where the run
without nvshare gave it less than that; the duty processes' sum >= the sum without
nvshare; in g each process, and the pipeline's items out, >= 0.95x without nvshare.  A run
without nvshare is left out, with its twin under nvshare, when both would not fit.

Prints a markdown table (each process against its targets); every number, each process's
completions included, goes to RESULTS/duty.json, the agents' logs to RESULTS/agent-logs/.
Safety: a process stops itself past 1 GiB of GPU memory and at most nine run together, so
9 GiB of managed memory at most, checked against half of the GPU's free memory first.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from collections import Counter

import duty_measures as measures
import duty_table
from gpu_state import check_memory, nvidia_smi_rows
from harness import REPO, SHIM, Agent, finish_json, wait_for_file
from multi_gpu import gpus, lock_figures
from phase_runner import run_phases

from nvshare_agent.settings import DEFAULT_SETTINGS

HERE = pathlib.Path(__file__).resolve().parent
CLIENT = [sys.executable, str(HERE / "duty_client.py")]
PIPELINE = [sys.executable, str(HERE / "duty_pipeline.py")]
PCI_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}  # CUDA's GPU 0 is nvidia-smi's GPU 0
PROCESSES_TOGETHER = 9  # f8's eight beside the trainer; each under 1 GiB
IMPORT_TIMEOUT_S = 240.0
READY_TIMEOUT_S = 90.0
COLLECT_TIMEOUT_S = 60.0


def command(role: str, queue_size: int) -> list[str]:
    shape = measures.role_shape(role)
    if shape["kind"] == "trainer":
        return [*CLIENT, "trainer"]
    if shape["kind"] == "pipeline":
        return [*PIPELINE, "--stage-ms", str(shape["burst_ms"]), "--queue-size", str(queue_size)]
    pacing = (
        ["--duty", str(shape["duty"])] if "duty" in shape else ["--gap-ms", str(shape["gap_ms"])]
    )
    return [*CLIENT, "bursts", "--burst-ms", str(shape["burst_ms"]), *pacing]


def plain_env() -> dict:
    env = dict(os.environ, **PCI_ORDER)
    env.pop("LD_PRELOAD", None)
    return env


def nvshare_env(socket: pathlib.Path) -> dict:
    """The shim's environment for an agent not started yet: the shim reads it at the first
    CUDA call, which comes after the release (shim/README.md)."""
    return dict(os.environ, **PCI_ORDER, LD_PRELOAD=str(SHIM), NVSHARE_SOCKET=str(socket))


def agent_settings() -> dict:
    return {
        "time_quantum_s": DEFAULT_SETTINGS.time_quantum_s,
        "anti_thrash": DEFAULT_SETTINGS.anti_thrash.value,
        "idle_release_ms": DEFAULT_SETTINGS.idle_release_ms,
    }


def sleep_until(wall_time: float) -> None:
    time.sleep(max(0.0, wall_time - time.time()))


class Held:
    """A client started at the beginning, torch imported, waiting for its start file."""

    def __init__(self, folder: pathlib.Path, role: str, argv: list[str], env: dict):
        self.role = role
        self.start_file = folder / f"{role}.start"
        self.ready_file = folder / f"{role}.ready"
        self.process = subprocess.Popen(
            [*argv, "--hold", str(self.start_file), "--ready-file", str(self.ready_file)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def imported(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(
                f"{self.role} ended before its start:\n{self.process.stderr.read()[-2000:]}"
            )
        return pathlib.Path(f"{self.start_file}.held").exists()

    def release(self, options: dict) -> None:
        staged = self.start_file.with_suffix(".staged")
        staged.write_text(json.dumps(options))
        staged.rename(self.start_file)  # whole, or not there

    def wait_ready(self) -> None:
        wait_for_file(self.ready_file, self.process, timeout=READY_TIMEOUT_S, poll_s=0.02)

    def discard(self) -> None:
        """Ends it unmeasured (a held pipeline ignores SIGTERM until released: SIGKILL);
        nothing for one already collected."""
        if self.process.returncode is None:
            self.process.kill()
            self.process.communicate()


class Run:
    """One RunPlan's processes, started (and held) with every other run's."""

    def __init__(self, plan: measures.RunPlan, workdir: pathlib.Path):
        self.plan = plan
        self.folder = workdir / "runs" / plan.key.replace("/", "-")
        self.folder.mkdir(parents=True)
        self.socket = self.folder / "agent.sock"
        env = nvshare_env(self.socket) if plan.env == "nvshare" else plain_env()
        self.held = {
            role: Held(self.folder, role, command(role, plan.queue_size), env)
            for role in plan.roles
        }

    def discard(self) -> None:
        for held in self.held.values():
            held.discard()


class Bench:
    def __init__(self, workdir: pathlib.Path, runs: list[Run], window_s: float, deadline: float):
        self.workdir, self.runs, self.window_s = workdir, runs, window_s
        self.deadline = deadline  # time.monotonic()'s: no run may end past it
        self.uuid = gpus()[0]["uuid"]
        self.ms_per_product: float | None = None  # from the first solo run
        self.about: dict = {}  # torch and CUDA versions, from the first process's line
        self.skipped: set[str] = set()  # runs the budget left out

    def wait_for_imports(self) -> float:
        started = time.monotonic()
        waiting = [held for run in self.runs for held in run.held.values()]
        while waiting:
            if time.monotonic() - started > IMPORT_TIMEOUT_S:
                raise RuntimeError(
                    f"{len(waiting)} processes still importing after {IMPORT_TIMEOUT_S:.0f} s"
                )
            waiting = [held for held in waiting if not held.imported()]
            time.sleep(0.1)
        return time.monotonic() - started

    def options(self, role: str) -> dict:
        shape = measures.role_shape(role)
        if "burst_ms" not in shape or self.ms_per_product is None:
            return {}  # the first bursts process sizes itself
        return {"products": measures.products_for(shape["burst_ms"], self.ms_per_product)}

    def part(self, name: str) -> dict:
        found: dict = {}
        for run in (run for run in self.runs if run.plan.part == name):
            began = time.monotonic()
            try:
                found[run.plan.name] = self.measure(run)
            except Exception as error:  # one failed run must not lose the others' numbers
                run.discard()
                found[run.plan.name] = {"error": str(error)[-2000:]}
            shown = (
                "error"
                if "error" in found[run.plan.name]
                else "skipped"
                if "skipped" in found[run.plan.name]
                else "done"
            )
            print(f"duty: {run.plan.key} {shown} in {time.monotonic() - began:.1f} s", flush=True)
        if name == "solo":
            found["sizing"] = measures.sizing(self.ms_per_product)
        return found

    def planned_s(self, run: Run) -> float:
        """A run's planned time; a run without nvshare counts its nvshare twin's too, since
        either one alone has nothing to be compared with."""
        twins = [run.plan]
        if run.plan.env == "plain" and run.plan.part != "solo":
            twin_name = run.plan.name.replace("plain", "nvshare")
            twins += [r.plan for r in self.runs if r.plan.key == f"{run.plan.part}/{twin_name}"]
        return sum(measures.planned_run_s(plan, self.window_s) for plan in twins)

    def measure(self, run: Run) -> dict:
        planned = self.planned_s(run)
        twin = f"{run.plan.part}/{run.plan.name.replace('nvshare', 'plain')}"
        if run.plan.env == "nvshare" and twin in self.skipped:
            run.discard()
            return {"skipped": f"{twin} was"}
        if time.monotonic() + planned > self.deadline:
            run.discard()
            self.skipped.add(run.plan.key)
            return {"skipped": f"~{planned:.0f} s more would pass the budget"}
        bursts = [r for r in run.plan.roles if "burst_ms" in measures.role_shape(r)]
        if run.plan.part != "solo" and bursts and self.ms_per_product is None:
            run.discard()
            raise RuntimeError("no burst sizing: the first solo run failed")
        agent = (
            Agent(self.workdir, socket=run.socket, **agent_settings())
            if run.plan.env == "nvshare"
            else None
        )
        try:
            windows = self.released_and_measured(run)
            outputs = {
                role: finish_json(held.process, COLLECT_TIMEOUT_S)
                for role, held in run.held.items()
            }
            lock = self.lock_summary(agent, outputs) if agent else None
        finally:
            if agent:
                agent.stop()
        first = next(iter(outputs.values()))
        self.about = self.about or {"torch": first.get("torch"), "cuda": first.get("cuda")}
        if self.ms_per_product is None and "ms_per_product" in first:
            self.ms_per_product = first["ms_per_product"]
        figures = {
            window: {
                "start": start,
                "end": end,
                "clients": {
                    role: measures.figures_over(outputs[role], start, end) for role in roles
                },
            }
            for window, (start, end, roles) in windows.items()
        }
        return {"windows": figures, "outputs": outputs, **({"lock": lock} if agent else {})}

    def released_and_measured(self, run: Run) -> dict:
        """Releases each stage's processes, waits for their first unit, then measures its
        window (or waits the arrival gap); stops them all after the last window's tail.
        Returns each window as (start, end, its roles)."""
        window_s = measures.window_length_s(run.plan, self.window_s)
        warmup = measures.SOLO_WARMUP_S if run.plan.part == "solo" else measures.WARMUP_S
        windows, present = {}, []
        try:
            for window, roles in run.plan.stages:
                for role in roles:
                    run.held[role].release(self.options(role))
                for role in roles:
                    run.held[role].wait_ready()
                present += roles
                if window is None:
                    time.sleep(measures.ARRIVAL_GAP_S)
                    continue
                start = time.time() + warmup
                windows[window] = (start, start + window_s, list(present))
                sleep_until(start + window_s + measures.TAIL_S)
        finally:
            for held in run.held.values():
                if held.process.poll() is None:
                    held.process.terminate()  # a released client ends after its unit under way
        return windows

    def lock_summary(self, agent: Agent, outputs: dict) -> dict:
        """What the agent's log says: grants and waits per process, drops by reason."""
        pids = {role: output["pid"] for role, output in outputs.items()}
        pids.update(
            {
                f"{role}_stage_two": o["stage_two_pid"]
                for role, o in outputs.items()
                if "stage_two_pid" in o
            }
        )
        try:
            lock = lock_figures(agent, pids, [self.uuid])
            reasons = Counter(event.get("reason", "?") for event in agent.events("drop"))
            modes = [event.get("mode") for event in agent.events("mode")]
        except (KeyError, ValueError) as error:  # a log line of another shape
            return {"error": repr(error)}
        return {**lock, "drop_reasons": dict(reasons), "modes": modes}


def environment(about: dict) -> dict:
    name, driver = nvidia_smi_rows("--query-gpu=name,driver_version")[0][:2]
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "gpu_and_driver": f"{name}, {driver}",
        "python": sys.version.split()[0],
        **about,
    }


def print_plan(runs: list[measures.RunPlan], window_s: float, budget_s: float) -> None:
    for run in runs:
        print(
            f"  {run.key}: {', '.join(run.roles)}, ~{measures.planned_run_s(run, window_s):.0f} s"
        )
    planned = measures.planned_seconds(runs, window_s)
    parts = ", ".join(
        f"{name} {seconds:.0f} s" for name, seconds in planned.items() if name != "total"
    )
    print(f"duty: planned {parts}; ~{planned['total']:.0f} s in all (budget {budget_s:.0f} s)")


def main(argv=None) -> None:
    deadline = time.monotonic()
    default_only = os.environ.pop("NVSHARE_BENCH_ONLY", "")  # run_phases would read it too
    args = measures.parse_args(argv, str(REPO / "results" / "gpu"), default_only)
    deadline += args.budget
    plans = measures.plan(args.only)
    print_plan(plans, args.window, args.budget)
    if args.plan:
        return
    if not SHIM.exists():
        sys.exit(f"duty: no shim at {SHIM} (make -C shim)")
    results_dir = pathlib.Path(args.results)
    results_dir.mkdir(parents=True, exist_ok=True)
    free_mib = check_memory(PROCESSES_TOGETHER, "duty")
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="nvshare-duty-"))
    runs: list[Run] = []
    try:
        runs = [Run(plan, workdir) for plan in plans]
        bench = Bench(workdir, runs, args.window, deadline)
        results: dict = {
            "gpu_free_mib_at_start": free_mib,
            "window_s": args.window,
            "parts": args.only,
            "planned_s": measures.planned_seconds(plans, args.window),
            "imports_s": round(bench.wait_for_imports(), 1),
        }
        print(
            f"duty: {measures.process_count(plans)} processes imported torch in {results['imports_s']} s",
            flush=True,
        )
        phases = [(part, lambda part=part: bench.part(part)) for part in ("solo", *args.only)]
        results_file = results_dir / "duty.json"
        run_phases(phases, results, results_file, workdir=workdir)
        results["environment"] = environment(bench.about)
        results["rows"] = [
            row.__dict__ | {"verdict": row.verdict()} for row in duty_table.rows(results)
        ]
        results_file.write_text(json.dumps(results, indent=2))
    finally:
        for run in runs:
            run.discard()
    print()
    print("\n".join(duty_table.table(results)))
    print("\n".join(duty_table.lock_lines(results)))
    for part, found in results.items():
        for name, run in found.items() if isinstance(found, dict) else ():
            if isinstance(run, dict) and ("error" in run or "skipped" in run):
                why = run.get("skipped") or run["error"].strip().splitlines()[-1][:200]
                print(f"{part}/{name}: {'SKIPPED' if 'skipped' in run else 'FAILED'}: {why}")
    print(json.dumps({"results": str(results_file)}))


if __name__ == "__main__":
    main()
