"""A stand-in for nvidia-ml-py's pynvml, for the NVML adapter's tests (no GPU).

FAKE_NVML picks what it does: "two-gpus" (two GPUs and a MIG instance),
"standin" (the stand-in driver's two GPUs, tests/standin, as NVML would list them),
"init-fails", "hangs" (nvmlInit never returns), "crashes" (the process dies),
"bytes" (old releases' bytes strings), "missing" (import fails).
FAKE_NVML_HIDDEN may name a file of UUIDs, one a line, that the GPU list leaves
out while they are in it (a GPU that falls off the bus).
"""

import os
import time

MODE = os.environ.get("FAKE_NVML", "two-gpus")
if MODE == "missing":
    raise ImportError("No module named 'pynvml'")

DEVICES = [
    ("GPU-0d84ee44-b797-1c71-8ccd-cefec22161de", "NVIDIA H100 80GB HBM3", 85520809984),
    ("MIG-5c3f2a11-0000-4000-8000-000000000001", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 10737418240),
    ("GPU-11111111-2222-3333-4444-555555555555", "NVIDIA L4", 24152899584),
]


if MODE == "standin":
    DEVICES = [
        (f"GPU-5374616e-6469-6e00-0000-00000000000{n}", f"NVIDIA Stand-in GPU {n}", 16 << 30)
        for n in range(2)
    ]


class NVMLError(Exception):
    pass


class _Memory:
    def __init__(self, total):
        self.total, self.free, self.used = total, total, 0


def nvmlInit():
    if MODE == "init-fails":
        raise NVMLError("Driver Not Loaded")
    if MODE == "hangs":
        time.sleep(3600)
    if MODE == "crashes":
        os._exit(134)


def nvmlShutdown():
    pass


def _visible_devices():
    hidden_file = os.environ.get("FAKE_NVML_HIDDEN")
    hidden = set()
    if hidden_file and os.path.exists(hidden_file):
        with open(hidden_file) as listing:
            hidden = set(listing.read().split())
    return [device for device in DEVICES if device[0] not in hidden]


def nvmlDeviceGetCount():
    return len(_visible_devices())


def nvmlDeviceGetHandleByIndex(index):
    return _visible_devices()[index]


def _text(value):
    return value.encode() if MODE == "bytes" else value


def nvmlDeviceGetUUID(handle):
    return _text(handle[0])


def nvmlDeviceGetName(handle):
    return _text(handle[1])


def nvmlDeviceGetMemoryInfo(handle):
    return _Memory(handle[2])


class _Process:
    def __init__(self, pid, used):
        self.pid, self.usedGpuMemory = pid, used


def _processes(handle):
    """FAKE_NVML_PROCESSES: a file holding JSON {uuid: [[pid, bytes], ...]}, read at
    every call so that a test can change what the GPU runs while the agent watches."""
    path = os.environ.get("FAKE_NVML_PROCESSES")
    if not path:
        return []
    import json

    try:
        with open(path) as f:
            table = json.load(f)
    except (OSError, ValueError):
        return []
    return [_Process(pid, used) for pid, used in table.get(handle[0], [])]


def nvmlDeviceGetComputeRunningProcesses(handle):
    return _processes(handle)


def nvmlDeviceGetGraphicsRunningProcesses(handle):
    return []
