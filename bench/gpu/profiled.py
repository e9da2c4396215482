"""Runs one of the workloads here (trainer.py, inference.py, notebook_cells.py) under
torch.profiler, CUDA activity only, from before its first CUDA call to its end, in this
same process (so the agent's figures for this pid are the workload's); then prints one
JSON line with what the profiler saw the GPU do: every kernel's, copy's and memset's
interval, summed (kernels_s), as their union (busy_s: time with at least one of them
running, what NVML's utilization measures), and as their bursts' spans (spans_s: each
burst from its first start to its last end, what the shim's meter can see).

    python3 profiled.py trainer.py --seconds 60

The workload's own JSON line comes first, this one last (meter_check.py reads both)."""

import json
import pathlib
import runpy
import sys
import tempfile

import torch
from meter_measures import burst_spans_seconds, union_seconds
from torch.profiler import ProfilerActivity, profile

GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")


def gpu_intervals(trace_path: pathlib.Path) -> list[tuple[float, float]]:
    """(start, end) in seconds of each kernel, copy and memset in a Chrome trace."""
    events = json.loads(trace_path.read_text()).get("traceEvents", [])
    return [
        (e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6)
        for e in events
        if e.get("cat") in GPU_WORK and "dur" in e
    ]


def main() -> None:
    script, *args = sys.argv[1:]
    here = pathlib.Path(__file__).resolve().parent
    sys.argv = [str(here / script), *args]
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        runpy.run_path(str(here / script), run_name="__main__")
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        trace = pathlib.Path(folder) / "trace.json"
        profiler.export_chrome_trace(str(trace))
        intervals = gpu_intervals(trace)
    print(
        json.dumps(
            {
                "kernels_s": sum(end - start for start, end in intervals),
                "busy_s": union_seconds(intervals),
                "spans_s": burst_spans_seconds(intervals),
                "activities": len(intervals),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
