"""An inference server, for the node-mix benchmark (mix.py): requests arrive as a Poisson
stream (20 per second by default, seeded); each is a batch of 16 copied to the GPU and
run through a small MLP (4 x Linear(4096) with ReLU) --passes times, as a decoder runs
once per generated token, and is answered with a host sync (.item()).

--passes sizes a request's GPU work: by default it is chosen at start so that one request
takes about --request-ms (0.8 ms) on the GPU, timed with CUDA events.  One pass reads the
256 MiB of weights, so the work is a few dozen kernels, not one launch-bound stream of
tiny ones.  Latency runs from a request's scheduled arrival to its answer, so a request
queued behind a late one counts that wait.  Prints one JSON line (light.report)."""

import argparse
import mmap
import os

import light
import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    light.add_window_arguments(parser)
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--request-ms", type=float, default=0.8, help="GPU time per request")
    parser.add_argument("--passes", type=int, default=0, help="passes per request (0: sized)")
    parser.add_argument(
        "--hold-flag",
        help="a file whose first byte is 1 while a request is under way (hold_ceiling.py)",
    )
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).cuda().eval()
    host_batch = torch.randn(args.batch, args.width).pin_memory()

    @torch.no_grad()
    def answer(passes: int) -> float:
        x = host_batch.to("cuda", non_blocking=True)
        for _ in range(passes):
            x = model(x)
        return x.sum().item()

    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        answer(10)  # warms cuBLAS and the allocator
    begin.record()
    answer(20)
    end.record()
    torch.cuda.synchronize()
    pass_ms = begin.elapsed_time(end) / 20
    passes = args.passes or max(1, round(args.request_ms / pass_ms))
    begin.record()
    for _ in range(10):
        answer(passes)
    end.record()
    torch.cuda.synchronize()
    request_gpu_ms = begin.elapsed_time(end) / 10
    light.refuse_over_budget("inference", torch.cuda.max_memory_reserved())

    window_start = light.wait_for_go(args.ready_file, args.go_file)
    arrivals = light.poisson_arrivals(args.rate, args.seconds, args.seed)
    serve_one = lambda: answer(passes)  # noqa: E731
    if args.hold_flag:
        flag = mmap.mmap(os.open(args.hold_flag, os.O_RDWR), 1)

        def serve_one():
            flag[0] = 1
            try:
                return answer(passes)
            finally:
                flag[0] = 0

    latencies = light.serve(arrivals, window_start, serve_one)
    light.report(
        latencies,
        0.99,
        window_start,
        passes=passes,
        request_gpu_ms=request_gpu_ms,
        reserved_bytes=torch.cuda.max_memory_reserved(),
    )


if __name__ == "__main__":
    main()
