#!/usr/bin/env python3
"""What a grant's prefetch costs when nothing was evicted: cuMemPrefetchAsync of managed
memory that is already resident on the GPU, timed to the stream's end, against the same
call after the pages were pushed to the host.  A window of light work (issue 35) re-grants
the turn holder its lease many times a second, each time with this prefetch.

    python3 bench/gpu/prefetch_resident.py [GIB ...]      # default: 1 4 8
Prints one JSON line per size (milliseconds, median of 5)."""

import ctypes
import json
import statistics
import sys
import time

cuda = ctypes.CDLL("libcuda.so.1")
CU_MEM_ATTACH_GLOBAL = 1
CU_DEVICE_CPU = -1


def check(result, what):
    if result != 0:
        raise SystemExit(f"{what} failed: CUresult {result}")


def main() -> None:
    sizes = [float(a) for a in sys.argv[1:]] or [1.0, 4.0, 8.0]
    check(cuda.cuInit(0), "cuInit")
    device = ctypes.c_int()
    check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
    context = ctypes.c_void_p()
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "retain")
    check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    stream = ctypes.c_void_p()
    check(cuda.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate")
    prefetch = cuda.cuMemPrefetchAsync
    prefetch.argtypes = [ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]

    def timed(pointer, size, where) -> float:
        started = time.perf_counter()
        check(prefetch(pointer, size, where, stream), "cuMemPrefetchAsync")
        check(cuda.cuStreamSynchronize(stream), "cuStreamSynchronize")
        return (time.perf_counter() - started) * 1000

    for gib in sizes:
        size = int(gib * (1 << 30))
        pointer = ctypes.c_uint64()
        check(
            cuda.cuMemAllocManaged(
                ctypes.byref(pointer), ctypes.c_size_t(size), CU_MEM_ATTACH_GLOBAL
            ),
            "alloc",
        )
        timed(pointer.value, size, 0)  # first touch: populate on the GPU
        resident = [timed(pointer.value, size, 0) for _ in range(5)]
        evicted = []
        for _ in range(3):
            timed(pointer.value, size, CU_DEVICE_CPU)
            evicted.append(timed(pointer.value, size, 0))
        check(cuda.cuMemFree_v2(pointer), "cuMemFree")
        print(
            json.dumps(
                {
                    "gib": gib,
                    "resident_ms": round(statistics.median(resident), 3),
                    "evicted_ms": round(statistics.median(evicted), 1),
                    "evicted_gb_s": round(size / 1e9 / (statistics.median(evicted) / 1000), 1),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
