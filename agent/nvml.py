"""The NVML adapter: which GPUs this node has (UUID, name, total memory).

Without NVML (CI, containers without the driver) this returns nothing and the
agent learns GPUs from its clients' HELLO frames instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from .protocol import parse_uuid


@dataclass(frozen=True, slots=True)
class GpuInfo:
    uuid: bytes
    name: str
    memory_total_bytes: int


def _text(value) -> str:
    # nvidia-ml-py returns str in new releases and bytes in old ones.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def read_inventory() -> tuple[list[GpuInfo], str | None]:
    """Returns (GPUs, None), or ([], one-line reason) when NVML is not usable.

    Blocking (nvmlInit can take a while on a cold driver): run it in a thread."""
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
            gpus.append(GpuInfo(uuid, _text(pynvml.nvmlDeviceGetName(handle)),
                                int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)))
        return gpus, None
    except Exception as e:
        return [], f"NVML query failed: {e}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
