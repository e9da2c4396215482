#!/usr/bin/env python3
"""What sharing a GPU through nvshare costs, measured end to end on one GPU.

Runs the agent on a private socket (no systemd or D-Bus needed), the workloads
in this folder with and without the shim, and prints a table of ratios and
percentiles taken in this one run; full numbers go to RESULTS/gpu.json.

    bench/gpu/run.sh [RESULTS]            # RESULTS defaults to results/gpu

Safety: every process under the shim allocates managed memory.  All of it
together stays under half of the card's free memory (checked before start):
asking for more can hang a shared GPU.

The phases are in phases/ (one file each), their arithmetic in gpu_measures.py, the table
in report.py, the agent and the processes in harness.py; this file is the default run's plan.
"""

from __future__ import annotations

import pathlib
import sys
import tempfile

from gpu_state import check_memory, environment
from harness import HERE, REPO, build_cuda_program, build_launch_loop, run_json
from phase_runner import run_phases
from phases.notebook import notebook_beside_trainer
from phases.overhead import nvshare_overhead
from phases.trainers import PAUSING, pair_run, solo_run
from phases.warmup import warm_up
from report import print_table


def main() -> None:
    results_dir = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else REPO / "results" / "gpu")
    results_dir.mkdir(parents=True, exist_ok=True)
    free_mib = check_memory()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="nvshare-gpu-bench-"))
    launch_loop = build_launch_loop(workdir)
    hook_cost_program = build_cuda_program(workdir, "hook_cost")

    results = {"environment": environment(), "gpu_free_mib_at_start": free_mib}
    phases = [
        ("overhead", lambda: nvshare_overhead(workdir, launch_loop, hook_cost_program)),
        ("solo", lambda: solo_run(16)),
        ("pair_tq2", lambda: pair_run(workdir, 30, time_quantum_s=2)),
        ("pair_tq2_queued", lambda: pair_run(workdir, 20, queue_ahead=True, time_quantum_s=2)),
        ("pair_tq5_queued", lambda: pair_run(workdir, 30, queue_ahead=True, time_quantum_s=5)),
        ("pair_off", lambda: pair_run(workdir, 15, time_quantum_s=2, anti_thrash=False)),
        ("warmup", lambda: warm_up(workdir)),
        (
            "prefetch_probe",
            lambda: run_json([sys.executable, str(HERE / "prefetch_probe.py"), "--gib", "8"]),
        ),
        # At TQ 30 every wait is a whole quantum: 32 s give two of them (~65 s).
        ("notebook_tq30", lambda: notebook_beside_trainer(workdir, 30, 32)),
        ("notebook_tq2", lambda: notebook_beside_trainer(workdir, 2, 24)),
        # Anti-thrash auto (docs/scheduling.md), at the defaults (TQ 30 s): a notebook beside
        # the trainer while their memory fits the GPU, and with memory_limit set so that it
        # does not (the real card is never oversubscribed); two trainers, fitting and not, for
        # two quanta each.
        (
            "auto_notebook_fits",
            lambda: notebook_beside_trainer(workdir, 30, 30, trainer_extra_s=8, anti_thrash="auto"),
        ),
        (
            "auto_notebook_exclusive",
            lambda: notebook_beside_trainer(
                workdir, 30, 30, trainer_extra_s=8, anti_thrash="auto", memory_limit="1G"
            ),
        ),
        ("auto_pair_fits", lambda: pair_run(workdir, 64, time_quantum_s=30, anti_thrash="auto")),
        (
            "auto_pair_exclusive",
            lambda: pair_run(workdir, 64, time_quantum_s=30, anti_thrash="auto", memory_limit="1G"),
        ),
        ("solo_pausing", lambda: solo_run(24, None, *PAUSING)),
        (
            "pair_pausing_tq2",
            lambda: pair_run(workdir, 30, trainer_args=("--gpu-spans", *PAUSING), time_quantum_s=2),
        ),
        (
            "pair_pausing_off",
            lambda: pair_run(
                workdir,
                24,
                trainer_args=("--gpu-spans", *PAUSING),
                time_quantum_s=2,
                anti_thrash=False,
            ),
        ),
    ]
    extra = {"notebook_tq2", "solo_pausing", "pair_pausing_tq2", "pair_pausing_off"}
    # nvidia-smi's polling goes through the driver every 200 ms; the overhead phase resolves
    # tenths of a microsecond per launch, so nothing else queries the GPU while it runs.
    run_phases(
        phases, results, results_dir / "gpu.json", extra, unsampled={"overhead"}, workdir=workdir
    )
    print_table(results)


if __name__ == "__main__":
    main()
