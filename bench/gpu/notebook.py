"""A notebook-like process: a short burst of GPU work every few seconds.

The burst is sized at start to take about --burst-ms of GPU time (matrix
products measured with CUDA events).  Prints one JSON line with each burst's
latency (start to completion), the burst's GPU time, and when the first burst
started and the last ended (wall clock, to compare with other processes); the
benchmark reads each burst's wait for the lock from the agent's grant lines."""

import argparse
import json
import time

import torch


def burst(matrix: torch.Tensor, products: int) -> torch.Tensor:
    for _ in range(products):
        matrix = torch.tanh(matrix @ matrix)
    return matrix


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--burst-ms", type=float, default=50.0, help="GPU time per burst")
    parser.add_argument("--size", type=int, default=4096)
    args = parser.parse_args()
    matrix = torch.randn(args.size, args.size, device="cuda") / args.size**0.5
    # How many products make a burst: time a few (the first ones warm up cuBLAS).
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    burst(matrix, 3)
    begin.record()
    burst(matrix, 5)
    end.record()
    torch.cuda.synchronize()
    products = max(1, round(args.burst_ms / (begin.elapsed_time(end) / 5)))
    latencies, gpu_ms = [], []
    started = time.time()
    while time.time() - started < args.seconds:
        burst_start = time.perf_counter()
        begin.record()
        matrix = burst(matrix, products)
        end.record()
        torch.cuda.synchronize()
        latencies.append(time.perf_counter() - burst_start)
        gpu_ms.append(begin.elapsed_time(end))
        time.sleep(args.every)
    print(
        json.dumps(
            {
                "burst_latencies_s": latencies,
                "burst_gpu_ms": sorted(gpu_ms)[len(gpu_ms) // 2],
                "products_per_burst": products,
                "started_at": started,
                "ended_at": time.time(),
            }
        )
    )


if __name__ == "__main__":
    main()
