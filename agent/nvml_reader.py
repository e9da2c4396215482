"""The NVML reader child (`python -m nvshare_agent.nvml_reader [--watch SECONDS]`),
started by nvml.py: prints JSON lines with NVML's UUID text, parsed by the agent.

Light on purpose: it imports nothing of the agent (no asyncio, no wire format),
since every agent start runs it once or twice (~50 ms against ~100 ms).
"""

from __future__ import annotations

import json
import sys
import time


def _text(value) -> str:
    # nvidia-ml-py returns str in new releases and bytes in old ones.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def read_inventory_here() -> dict:
    """The inventory line: whole GPUs (uuid text, name, memory, index), MIG instances'
    uuid texts, and a one-line problem or None."""
    try:
        import pynvml
    except ImportError:
        return {"gpus": [], "mig": [], "problem": "pynvml is not installed"}
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return {"gpus": [], "mig": [], "problem": f"NVML unavailable: {e}"}
    try:
        gpus, mig = [], []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            if uuid.startswith("MIG-"):
                mig.append(uuid)  # the shim names whole GPUs; MIG instances are only let through
                continue
            gpus.append(
                {
                    "uuid": uuid,
                    "name": _text(pynvml.nvmlDeviceGetName(handle)),
                    "memory_total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                    "index": index,
                }
            )
        return {"gpus": gpus, "mig": mig, "problem": None}
    except Exception as e:
        return {"gpus": [], "mig": [], "problem": f"NVML query failed: {e}"}
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def processes_here(pynvml) -> dict[str, list[list[int]]]:
    """Each whole GPU's processes: uuid text -> [[pid, bytes], ...]."""
    readings = {}
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        if uuid.startswith("MIG-"):
            continue
        used: dict[int, int] = {}
        for query in (
            pynvml.nvmlDeviceGetComputeRunningProcesses,
            pynvml.nvmlDeviceGetGraphicsRunningProcesses,
        ):
            for process in query(handle):
                # None where the driver cannot tell (some containers, Windows).
                if process.usedGpuMemory is not None:
                    used[process.pid] = max(used.get(process.pid, 0), int(process.usedGpuMemory))
        readings[uuid] = [[pid, b] for pid, b in used.items()]
    return readings


def watch_here(interval_s: float) -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:
        print(json.dumps({"problem": f"NVML unavailable: {e}"}), flush=True)
        return
    try:
        while True:
            line: dict[str, object]
            try:
                line = {"processes": processes_here(pynvml)}
            except Exception as e:
                line = {"problem": f"NVML query failed: {e}"}
            print(json.dumps(line), flush=True)
            if "problem" in line:
                return
            time.sleep(interval_s)
    except BrokenPipeError:
        pass  # the agent is gone


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--watch":
        watch_here(float(sys.argv[2]))
        return
    print(json.dumps(read_inventory_here()), flush=True)


if __name__ == "__main__":
    main()
