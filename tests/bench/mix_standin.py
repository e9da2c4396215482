"""Stand-ins for mix.py's clients, without PyTorch or a GPU: `mix_standin.py KIND ARGS`,
KIND one of trainer, inference, notebook, loader, with the real scripts' arguments and
JSON lines.  The light ones run the real light.py loops with sleeps for GPU work; the
notebook's gaps are short, so that a window of a second holds cells."""

import argparse
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "gpu"))
import light


def trainer(argv) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--ready-file")
    args = parser.parse_args(argv)
    time.sleep(0.05)  # its set-up
    started, step_times = time.time(), []
    while not step_times or step_times[-1] - started < args.seconds:
        time.sleep(0.02)
        step_times.append(time.time())
        if len(step_times) == 1:
            pathlib.Path(args.ready_file).touch()
    print(json.dumps({"step_times": step_times, "loss": 0.5, "checksum": 1.0}))


def light_client(kind, argv) -> None:
    parser = argparse.ArgumentParser()
    light.add_window_arguments(parser)
    parser.add_argument("--passes", type=int, default=0)
    parser.add_argument("--ms-per-product", type=float, default=0.0)
    args = parser.parse_args(argv)
    window_start = light.wait_for_go(args.ready_file, args.go_file)
    if kind == "notebook":
        cells = light.notebook_cells(args.seed, gap_s=(0.05, 0.15))
        latencies, cell_ms = light.run_cells(
            window_start, args.seconds, cells, lambda ms: time.sleep(ms / 10_000)
        )
        light.report(latencies, 0.95, window_start, cell_ms=cell_ms, ms_per_product=0.35)
    elif kind == "inference":
        arrivals = light.poisson_arrivals(20, args.seconds, args.seed)
        latencies = light.serve(arrivals, window_start, lambda: time.sleep(0.0008))
        light.report(latencies, 0.99, window_start, passes=args.passes or 7, request_gpu_ms=0.8)
    else:
        arrivals = light.periodic_arrivals(0.01, args.seconds)
        latencies = light.serve(arrivals, window_start, lambda: time.sleep(0.0002))
        light.report(latencies, 0.99, window_start)


if __name__ == "__main__":
    if sys.argv[1] == "trainer":
        trainer(sys.argv[2:])
    else:
        light_client(sys.argv[1], sys.argv[2:])
