"""Warm-up after a grant: how fast a process's evicted working set comes back.

Under the shim the tensor is managed memory.  The process pushes it to host
memory itself (a prefetch to the CPU, so no oversubscription is needed), waits
past the agent's idle-release window so the shim gives the GPU back, then runs
one kernel that reads all of it.  The time from that launch to its completion
covers the new lock request, the grant, the bulk prefetch (or, with
NVSHARE_PREFETCH=0, the page faults) and the kernel."""

import argparse
import json
import time

import torch

# libcuda with cuMemPrefetchAsync_v2's CUDA 13 signature declared, and its location type.
from prefetch_probe import (
    CU_MEM_LOCATION_TYPE_DEVICE,
    CU_MEM_LOCATION_TYPE_HOST,
    MemLocation,
    check,
    cuda,
)


def prefetch(tensor: torch.Tensor, location: MemLocation) -> None:
    check(
        cuda.cuMemPrefetchAsync_v2(
            tensor.data_ptr(), tensor.numel() * tensor.element_size(), location, 0, None
        ),
        "cuMemPrefetchAsync_v2",
    )
    torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=8.0)
    parser.add_argument(
        "--idle-wait",
        type=float,
        default=1.5,
        help="seconds, > the idle-release window (1 s in run.py)",
    )
    parser.add_argument(
        "--self-prefetch",
        action="store_true",
        help="prefetch to the GPU by hand before the kernel: the driver's own rate, "
        "for comparison (run with no agent, so the shim does not prefetch too)",
    )
    args = parser.parse_args()

    elements = int(args.gib * (1 << 30)) // 4
    working_set = torch.ones(elements, dtype=torch.float32, device="cuda")
    expected = float(elements)
    # Load the reduction kernel now: CUDA loads modules lazily, and its first use
    # would otherwise add ~20 ms that have nothing to do with the working set.
    working_set[:1024].sum()
    torch.cuda.synchronize()
    prefetch(working_set, MemLocation(CU_MEM_LOCATION_TYPE_HOST, 0))
    time.sleep(args.idle_wait)

    started = time.perf_counter()
    if args.self_prefetch:
        prefetch(working_set, MemLocation(CU_MEM_LOCATION_TYPE_DEVICE, torch.cuda.current_device()))
    total = working_set.sum()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    assert float(total) == expected, (float(total), expected)
    nbytes = elements * 4
    print(json.dumps({"bytes": nbytes, "seconds": seconds, "gb_per_s": nbytes / seconds / 1e9}))


if __name__ == "__main__":
    main()
