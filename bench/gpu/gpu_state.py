"""What nvidia-smi says of the GPU: its free memory before a run starts, the environment a
run records, and its clocks, power and temperature while a phase runs."""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time

from harness import stop_process

PLANNED_MANAGED_GIB = 12  # run.py's largest phase: the 8 GiB warm-up, or two trainers of ~3.5 GiB


def nvidia_smi_rows(query: str) -> list[list[str]]:
    """nvidia-smi's answer to one --query-... option (CSV, no header, no units): a row of
    stripped fields per GPU or process."""
    out = subprocess.run(
        ["nvidia-smi", query, "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [[field.strip() for field in line.split(",")] for line in out.splitlines() if line]


def check_memory(planned_gib=PLANNED_MANAGED_GIB, script="bench") -> int:
    """The first GPU's free MiB; ends the script with one line when planned_gib of managed
    memory would be more than half of it (mix.py plans its own)."""
    free_mib = int(
        subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[0]
    )
    if free_mib / 2 < planned_gib * 1024:
        sys.exit(
            f"{script}: refusing to start: {planned_gib} GiB of managed memory is more than half of "
            f"the GPU's free {free_mib} MiB"
        )
    return free_mib


def environment() -> dict:
    import torch

    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {
        "date": time.strftime("%Y-%m-%d"),
        "gpu_and_driver": smi,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }


class GpuClockSampler:
    """nvidia-smi's SM clock, power, temperature and clock-event reasons every 200 ms while a phase
    runs: whether the GPU itself slowed down (power or heat) explains a step that took longer."""

    FIELDS = "clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"

    def __init__(self):
        # A file, not a pipe, so a long phase cannot fill it; stdbuf so every line reaches it.
        self.output = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(
            [
                "stdbuf",
                "-oL",
                "nvidia-smi",
                f"--query-gpu={self.FIELDS}",
                "--format=csv,noheader,nounits",
                "-lms",
                "200",
            ],
            stdout=self.output,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> dict:
        stop_process(self.process)
        self.output.seek(0)
        lines = self.output.read().splitlines()
        self.output.close()
        return gpu_clock_summary(lines)


def gpu_clock_summary(lines) -> dict:
    """GpuClockSampler's lines (clock MHz, power W, temperature C, reasons bitmask in hex)."""
    rows = []
    for line in lines:
        fields = [field.strip() for field in line.split(",")]
        try:
            rows.append((float(fields[0]), float(fields[1]), float(fields[2]), int(fields[3], 16)))
        except (ValueError, IndexError):
            continue  # a "[N/A]", a cut-off last line
    if not rows:
        return {}
    reasons = 0
    for row in rows:
        reasons |= row[3]
    return {
        "samples": len(rows),
        "sm_mhz_median": statistics.median(r[0] for r in rows),
        "sm_mhz_min": min(r[0] for r in rows),
        "power_w_median": statistics.median(r[1] for r in rows),
        "temperature_c_max": max(r[2] for r in rows),
        "clock_event_reasons": hex(reasons),
    }
