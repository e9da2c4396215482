#!/usr/bin/env python3
"""What NVML counts for a process under the shim: its per-process used memory
(what anti-thrash auto reads for each client, agent/memory_fit.py) while the
process holds GIB of memory that the shim made managed and that sits on the
GPU.  Managed memory counted there would be counted twice by auto (once in
the shim's report): this tells which.

    python3 bench/gpu/nvml_probe.py [GIB]        (builds nothing; needs the shim built)
Prints one JSON line.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

from gpu_state import nvidia_smi_rows
from harness import SHIM

CHILD = """
import sys, time, torch
x = torch.ones(int(sys.argv[1]) << 28, device="cuda")  # GIB of float32, written on the GPU
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(30)
"""


def nvml_used_mib(pid: int) -> int | None:
    for fields in nvidia_smi_rows("--query-compute-apps=pid,used_memory"):
        if fields[0] == str(pid):
            return int(fields[1])
    return None


def main() -> None:
    gib = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    results = {}
    for label, env in (
        ("plain", dict(os.environ)),
        (
            "shim",
            dict(
                os.environ,
                LD_PRELOAD=str(SHIM),
                NVSHARE_SOCKET=os.path.join(tempfile.mkdtemp(), "none.sock"),
            ),
        ),
    ):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(gib)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert child.stdout.readline().strip() == "ready"
            time.sleep(1)
            results[f"{label}_nvml_used_mib"] = nvml_used_mib(child.pid)
        finally:
            child.kill()
            child.wait()
    results["allocated_mib"] = gib * 1024
    print(json.dumps(results))


if __name__ == "__main__":
    main()
