#!/usr/bin/env python3
"""Does the queue bound hold for each kind of launch?  Under the shim (LD_PRELOAD, an
agent), queue N launches of one kind without a sync and time the host loop against the
GPU time they take: with the bound (NVSHARE_MAX_QUEUED_MS, 50 ms by default) the loop
returns at most about that bound before the GPU is done; without it, at once.

    python3 bench/gpu/bound_probe.py    # prints one JSON line per kind"""

import json
import time

import torch


def probe(name, launch, count):
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(count):
        launch()
    queued = time.perf_counter() - started
    torch.cuda.synchronize()
    done = time.perf_counter() - started
    print(
        json.dumps(
            {
                "kind": name,
                "launches": count,
                "host_loop_ms": round(queued * 1000, 1),
                "gpu_done_ms": round(done * 1000, 1),
                "queued_at_end_ms": round((done - queued) * 1000, 1),
            }
        ),
        flush=True,
    )


def main() -> None:
    a = torch.randn(8192, 8192, device="cuda")
    b = torch.randn(8192, 8192, device="cuda")
    c = torch.empty_like(a)
    big = torch.randn(1 << 28, device="cuda")
    for _ in range(2):  # warm-up, and the bound's learning
        probe("matmul (cuBLAS)", lambda: torch.mm(a, b, out=c), 30)
        probe("elementwise (mul_)", lambda: big.mul_(1.0000001), 300)
        probe("mixed", lambda: (torch.mm(a, b, out=c), big.mul_(1.0), c.relu_()), 20)


if __name__ == "__main__":
    main()
