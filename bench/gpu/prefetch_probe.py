"""How fast can the driver bring a managed working set back from host memory?

Times cuMemPrefetchAsync_v2 of one managed allocation pushed to the host, done
several ways: one call; many chunks on one stream; chunks spread over several
streams from one thread; chunks issued from several threads at once (each
migration call does CPU work inside the driver, which threads can overlap).
Talks to libcuda directly (no PyTorch, no shim), prints one JSON line.

    python3 bench/gpu/prefetch_probe.py --gib 8
"""

import argparse
import ctypes
import json
import statistics
import threading
import time

CU_MEM_ATTACH_GLOBAL = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_LOCATION_TYPE_HOST = 2
CU_STREAM_NON_BLOCKING = 1

cuda = ctypes.CDLL("libcuda.so.1")


class MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


cuda.cuMemPrefetchAsync_v2.argtypes = [
    ctypes.c_uint64,
    ctypes.c_size_t,
    MemLocation,
    ctypes.c_uint,
    ctypes.c_void_p,
]


def check(result, what):
    if result != 0:
        raise RuntimeError(f"{what} failed: CUresult {result}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    check(cuda.cuInit(0), "cuInit")
    device, context = ctypes.c_int(), ctypes.c_void_p()
    check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    nbytes = int(args.gib * (1 << 30))
    pointer = ctypes.c_uint64()
    check(
        cuda.cuMemAllocManaged(
            ctypes.byref(pointer), ctypes.c_size_t(nbytes), CU_MEM_ATTACH_GLOBAL
        ),
        "cuMemAllocManaged",
    )
    check(
        cuda.cuMemsetD8_v2(pointer, 1, ctypes.c_size_t(nbytes)), "cuMemsetD8"
    )  # populate on the GPU
    check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
    streams = []
    for _ in range(8):
        stream = ctypes.c_void_p()
        check(cuda.cuStreamCreate(ctypes.byref(stream), CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        streams.append(stream)

    def prefetch(start, length, location, stream):
        check(
            cuda.cuMemPrefetchAsync_v2(start, length, location, 0, stream), "cuMemPrefetchAsync_v2"
        )

    def to_host():
        prefetch(pointer.value, nbytes, MemLocation(CU_MEM_LOCATION_TYPE_HOST, 0), streams[0])
        check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")

    gpu = MemLocation(CU_MEM_LOCATION_TYPE_DEVICE, 0)

    def chunks(size):
        return [
            (pointer.value + offset, min(size, nbytes - offset))
            for offset in range(0, nbytes, size)
        ]

    def one_call():
        prefetch(pointer.value, nbytes, gpu, streams[0])

    def chunked(size, stream_count):
        def run():
            for index, (start, length) in enumerate(chunks(size)):
                prefetch(start, length, gpu, streams[index % stream_count])

        return run

    def threaded(thread_count):
        def run():
            parts = chunks(-(-nbytes // thread_count))

            def worker(index):
                cuda.cuCtxSetCurrent(context)
                start, length = parts[index]
                prefetch(start, length, gpu, streams[index])
                check(cuda.cuStreamSynchronize(streams[index]), "cuStreamSynchronize")

            threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(parts))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()

        return run

    ways = {
        "one_call": one_call,
        "chunks_256MiB_1_stream": chunked(256 << 20, 1),
        "chunks_256MiB_4_streams": chunked(256 << 20, 4),
        "threads_2": threaded(2),
        "threads_4": threaded(4),
        "threads_8": threaded(8),
    }
    rates = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, way in ways.items():  # interleaved, so drift hits every way alike
            to_host()
            started = time.perf_counter()
            way()
            check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
            rates[name].append(nbytes / (time.perf_counter() - started) / 1e9)
    print(
        json.dumps(
            {
                "bytes": nbytes,
                "gb_per_s": rates,
                "median_gb_per_s": {name: statistics.median(v) for name, v in rates.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
