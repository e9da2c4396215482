"""A notebook as a person drives it, for the node-mix benchmark (mix.py): cells of about
15 ms or 150 ms of GPU work (chosen at random, seeded), each ending with .item(), at
random gaps of 0.7-2.3 s after the previous result.

The cells are notebook.py's bursts (tanh of matrix products); --ms-per-product sizes
them: by default it is timed at start with CUDA events.  Latency runs from a cell's start
to its result.  Prints one JSON line (light.report, p95 as the tail)."""

import argparse

import light
import torch
from notebook import burst


def main() -> None:
    parser = argparse.ArgumentParser()
    light.add_window_arguments(parser)
    parser.add_argument("--size", type=int, default=2048, help="the matrices' side")
    parser.add_argument(
        "--ms-per-product", type=float, default=0.0, help="GPU ms of one product (0: timed)"
    )
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    matrix = torch.randn(args.size, args.size, device="cuda") / args.size**0.5
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    burst(matrix, 5)  # the first products warm cuBLAS up
    begin.record()
    burst(matrix, 20)
    end.record()
    torch.cuda.synchronize()
    ms_per_product = args.ms_per_product or begin.elapsed_time(end) / 20

    def run_cell(cell_ms: float) -> float:
        return burst(matrix, max(1, round(cell_ms / ms_per_product))).sum().item()

    run_cell(15.0)
    light.refuse_over_budget("notebook", torch.cuda.max_memory_reserved())

    window_start = light.wait_for_go(args.ready_file, args.go_file)
    latencies, cell_ms = light.run_cells(
        window_start, args.seconds, light.notebook_cells(args.seed), run_cell
    )
    light.report(
        latencies,
        0.95,
        window_start,
        cell_ms=cell_ms,
        ms_per_product=ms_per_product,
        reserved_bytes=torch.cuda.max_memory_reserved(),
    )


if __name__ == "__main__":
    main()
