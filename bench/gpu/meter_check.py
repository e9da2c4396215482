#!/usr/bin/env python3
"""Issue 46: is the GPU time the agent counts per process (the shim's meter) true?

A trainer, an inference server and a notebook (trainer.py, inference.py, notebook_cells.py)
each run alone for --seconds under the shim, inside torch.profiler (profiled.py).  For each,
three figures of the same run: the meter's GPU seconds (the agent's `disconnect pid=N
gpu_s=S` line), the profiler's (the union of its kernels', copies' and memsets' intervals),
and NVML's per-process SM utilization sampled while it ran (nvmlDeviceGetProcessUtilization,
read through ctypes: no pynvml needed).  Target: the meter within 5 % of both.  Numbers go
to RESULTS/meter_check.json.

    bench/gpu/run.sh --meter-check [RESULTS] [--seconds 60] [--only trainer,inference,notebook]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import threading
import time

import meter_measures as measures
from harness import HERE, Agent

WORKLOADS = {
    "trainer": ["trainer.py"],
    "inference": ["inference.py"],
    "notebook": ["notebook_cells.py"],
}
NVML_NOT_FOUND, NVML_INSUFFICIENT_SIZE = 6, 7


class ProcessSample(ctypes.Structure):  # nvmlProcessUtilizationSample_t
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("timeStamp", ctypes.c_ulonglong),
        ("smUtil", ctypes.c_uint),
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
    ]


class NvmlSampler:
    """Polls NVML's per-process utilization of GPU 0 for one pid until stopped, every
    0.2 s, for the samples newer than the last (NVML gives a process's newest)."""

    def __init__(self, pid: int):
        self.pid, self.samples, self._stop = pid, [], threading.Event()
        self._nvml = ctypes.CDLL("libnvidia-ml.so.1")
        self._nvml.nvmlInit_v2()
        self._device = ctypes.c_void_p()
        self._nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self._device))
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _read(self, last_seen: int) -> list[ProcessSample]:
        count = ctypes.c_uint(0)
        get = self._nvml.nvmlDeviceGetProcessUtilization
        code = get(self._device, None, ctypes.byref(count), ctypes.c_ulonglong(last_seen))
        if code == NVML_NOT_FOUND or count.value == 0:
            return []
        if code not in (0, NVML_INSUFFICIENT_SIZE):
            raise RuntimeError(f"nvmlDeviceGetProcessUtilization: error {code}")
        buffer = (ProcessSample * count.value)()
        code = get(self._device, buffer, ctypes.byref(count), ctypes.c_ulonglong(last_seen))
        return [] if code == NVML_NOT_FOUND else list(buffer[: count.value])

    def _run(self) -> None:
        last_seen = 0
        while not self._stop.wait(0.2):
            for sample in self._read(last_seen):
                last_seen = max(last_seen, sample.timeStamp)
                if sample.pid == self.pid:
                    self.samples.append((sample.timeStamp, sample.smUtil))

    def stop(self) -> list[tuple[int, int]]:
        time.sleep(1.0)  # the last period's sample
        self._stop.set()
        self._thread.join()
        return sorted(set(self.samples))


def meter_seconds(agent: Agent, pid: int) -> float:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = re.search(rf"disconnect pid={pid} gpu_s=([0-9.]+)", agent.log())
        if found:
            return float(found.group(1))
        time.sleep(0.1)
    raise RuntimeError(f"the agent's log has no disconnect line for pid {pid}")


def run_one(agent: Agent, name: str, seconds: float) -> dict:
    command = [sys.executable, str(HERE / "profiled.py"), *WORKLOADS[name]]
    command += ["--seconds", str(seconds)]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=agent.env()
    )
    sampler = NvmlSampler(process.pid)
    out, err = process.communicate(timeout=seconds + 300)
    samples = sampler.stop()
    if process.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{err[-3000:]}")
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {
        "pid": process.pid,
        "workload": lines[0] if len(lines) > 1 else {},
        "profiler": lines[-1],
        "meter_s": meter_seconds(agent, process.pid),
        "nvml": measures.nvml_busy_seconds(samples),
        "nvml_samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("results", nargs="?", default="results/gpu")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--only", default=",".join(WORKLOADS))
    args = parser.parse_args()
    names = args.only.split(",")
    if unknown := set(names) - set(WORKLOADS):
        sys.exit(f"meter_check: no workload {sorted(unknown)}; there are {list(WORKLOADS)}")
    results_dir = pathlib.Path(args.results)
    results_dir.mkdir(parents=True, exist_ok=True)
    agent = Agent(pathlib.Path(tempfile.mkdtemp(prefix="nvshare-meter-")))
    results = {}
    try:
        for name in names:
            results[name] = run_one(agent, name, args.seconds)
            (results_dir / "meter_check.json").write_text(json.dumps(results, indent=1))
            print(name, {k: v for k, v in results[name].items() if k != "nvml_samples"})
    finally:
        agent.stop()
        (results_dir / "meter_check.log").write_text(agent.log())
    print(measures.table(results))


if __name__ == "__main__":
    main()
