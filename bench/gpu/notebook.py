"""A notebook-like process: a short burst of GPU work every few seconds.

Prints one JSON line with each burst's latency (start to completion); the
benchmark reads each burst's wait for the lock from the agent's grant lines."""

import argparse
import json
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=2.0)
    args = parser.parse_args()
    matrix = torch.randn(2048, 2048, device="cuda")
    torch.cuda.synchronize()
    latencies = []
    started = time.time()
    while time.time() - started < args.seconds:
        burst_start = time.perf_counter()
        for _ in range(10):
            matrix = torch.tanh(matrix @ matrix)
        torch.cuda.synchronize()
        latencies.append(time.perf_counter() - burst_start)
        time.sleep(args.every)
    print(json.dumps({"burst_latencies_s": latencies}))


if __name__ == "__main__":
    main()
