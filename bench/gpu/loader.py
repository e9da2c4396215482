"""A data loader feeding the GPU, for the node-mix benchmark (mix.py): a light shape the
issue does not name.  Every 10 ms a batch (64 images of 3 x 32 x 32, fp32, 768 KiB) lands
in pinned host memory; it is copied to the GPU, normalized per channel by a few tiny
kernels, and its checksum read back (.item()).  Latency runs from the batch's scheduled
arrival to that read, so a batch that waits behind a late one counts that wait.  Prints
one JSON line (light.report, p99 as the tail)."""

import argparse

import light
import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    light.add_window_arguments(parser)
    parser.add_argument("--period-ms", type=float, default=10.0, help="a batch every ...")
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    host_batch = torch.rand(args.batch, 3, 32, 32).pin_memory()
    mean = torch.tensor([0.49, 0.48, 0.45], device="cuda").view(1, 3, 1, 1)
    std = torch.tensor([0.25, 0.24, 0.26], device="cuda").view(1, 3, 1, 1)

    def load_one() -> float:
        batch = host_batch.to("cuda", non_blocking=True)
        return ((batch - mean) / std).sum().item()

    for _ in range(20):
        load_one()
    window_start = light.wait_for_go(args.ready_file, args.go_file)
    arrivals = light.periodic_arrivals(args.period_ms / 1000, args.seconds)
    latencies = light.serve(arrivals, window_start, load_one)
    light.report(latencies, 0.99, window_start, reserved_bytes=torch.cuda.max_memory_reserved())


if __name__ == "__main__":
    main()
