#!/usr/bin/env python3
"""What the shim's launch hook costs, from inside one process (hook_cost.cu).

launch_pairs.py compares processes with and without the shim, and single processes differ by
up to ~1 µs per launch.  Here one process under the shim launches an empty kernel through the
hook and through the driver's own cuLaunchKernel, alternating block by block, so that spread
cancels out.  The median paired delta is the hook and the gate (most blocks hold none of the
queue bound's marks, an event record every 8-256 launches); the mean adds the marks, and runs
with the bound off (NVSHARE_MAX_QUEUED_MS=0) show what they cost.  Full numbers go to
RESULTS/hook_cost.json.

    bench/gpu/run.sh --hook-cost [PROCESSES] [RESULTS]
"""

from __future__ import annotations

import json
import pathlib
import tempfile

from harness import Agent, build_cuda_program, count_and_results_dir
from phases.overhead import hook_cost

SETTINGS = {"bound on (default)": {}, "bound off": {"NVSHARE_MAX_QUEUED_MS": "0"}}


def main() -> None:
    processes, results_dir = count_and_results_dir("hook_cost", "PROCESSES", default=3, minimum=1)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="nvshare-hook-"))
    program = build_cuda_program(workdir, "hook_cost")
    agent = Agent(workdir)
    runs = {name: [] for name in SETTINGS}
    try:
        for _ in range(processes):  # settings interleaved, so drift favours neither
            for name, extra in SETTINGS.items():
                runs[name].append(hook_cost(program, agent.env(**extra)))
    finally:
        agent.stop()
    (results_dir / "hook_cost.json").write_text(json.dumps(runs))
    for name, results in runs.items():
        for result in results:
            m = result["measures"]
            low, high = m["delta_ns_mean_95"]
            print(
                f"{name:19} driver {m['driver_ns_median']:7.1f} ns  hook {m['hook_ns_median']:7.1f} ns  "
                f"delta median {m['delta_ns_median']:+6.1f}  mean {m['delta_ns_mean']:+6.1f} "
                f"({low:+.1f} .. {high:+.1f})  cuCtxGetCurrent {m['ctx_get_current_ns']:.1f} ns  "
                f"a locked add after the launch {m['locked_add_ns_median']:+.1f} ns"
            )
    print(
        f"({result['blocks']} blocks of {result['launches_per_block']} launches per path per process; "
        f"hook in {result['hooked_in']})"
    )


if __name__ == "__main__":
    main()
