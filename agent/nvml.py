"""The NVML adapter: which GPUs this node has (UUID, name, total memory).

NVML is read in a short-lived child process (`python -m nvshare_agent.nvml`),
not in the agent: nvmlInit maps about 20 MB that nvmlShutdown never gives
back (measured on the H100 node), and a wedged driver can hang nvmlInit, which
would otherwise hang the agent with it.  The child prints one JSON line.

Without NVML (CI, containers without the driver) this returns nothing and the
agent learns GPUs from its clients' HELLO frames instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import asdict, dataclass

from .protocol import parse_uuid

READ_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class GpuInfo:
    uuid: bytes
    name: str
    memory_total_bytes: int


async def read_inventory(timeout_s: float = READ_TIMEOUT_S) -> tuple[list[GpuInfo], str | None]:
    """Returns (GPUs, None), or ([], one-line reason) when NVML is not usable."""
    # The child must import this package the way the agent did, whatever put it on sys.path.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            __name__,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
    except OSError as e:
        return [], f"could not start the NVML reader: {e}"
    try:
        out, err = await asyncio.wait_for(child.communicate(), timeout_s)
    except TimeoutError:
        return [], f"NVML did not answer within {timeout_s:g} s"
    finally:
        if child.returncode is None:  # timed out, or the agent is stopping
            child.kill()
            await child.wait()
    try:
        answer = json.loads(out.decode().strip().splitlines()[-1])
        gpus = [
            GpuInfo(bytes.fromhex(g["uuid"]), g["name"], int(g["memory_total_bytes"]))
            for g in answer["gpus"]
        ]
        return gpus, answer["problem"]
    except (ValueError, LookupError, TypeError):
        last = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        return [], f"NVML reader failed (exit status {child.returncode}): {last}"


def _text(value) -> str:
    # nvidia-ml-py returns str in new releases and bytes in old ones.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def read_inventory_here() -> tuple[list[GpuInfo], str | None]:
    """The reading itself, in the calling process (the child's main)."""
    try:
        import pynvml
    except ImportError:
        return [], "pynvml is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return [], f"NVML unavailable: {e}"
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid_text = _text(pynvml.nvmlDeviceGetUUID(handle))
            try:
                uuid = parse_uuid(uuid_text)
            except ValueError:
                continue  # MIG instances print "MIG-..."; the shim names whole GPUs
            gpus.append(
                GpuInfo(
                    uuid,
                    _text(pynvml.nvmlDeviceGetName(handle)),
                    int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                )
            )
        return gpus, None
    except Exception as e:
        return [], f"NVML query failed: {e}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def main() -> None:
    gpus, problem = read_inventory_here()
    rows = [dict(asdict(g), uuid=g.uuid.hex()) for g in gpus]
    print(json.dumps({"gpus": rows, "problem": problem}), flush=True)


if __name__ == "__main__":
    main()
