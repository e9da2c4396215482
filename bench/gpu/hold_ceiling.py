#!/usr/bin/env python3
"""The most that holding a busy client's launches could give latency work (issue 44 h.).

No nvshare here: the two processes coordinate by hand, as a perfect shim would.  The
inference server (inference.py, the mix's) raises a flag in shared memory while a request is
under way; beside it a busy client runs back-to-back GEMMs of --width (8192: the mix's
trainer, ~18 ms each on an H200; 4096: run.py's reference trainer).  Ways of running it:
- plain: the busy client queues a step of 18 GEMMs ahead, then syncs (the reference loop);
- one_in_flight: it syncs before every GEMM, so at most one is on the GPU (what a queue
  bound of one kernel could do), no hold;
- held: also, before every GEMM, it waits while the flag is up.  A request then finds at
  most the one GEMM already running beside it, and nothing is launched until it is answered:
  what any launch-holding policy could give, and no more (it cannot preempt that GEMM).
Each against the inference server alone and the busy client alone.

    bench/gpu/run.sh --hold-ceiling [RESULTS_DIR] [--window S] [--widths 8192,4096]   # ~4 min at 15 s
    ... --inference-args "--batch 1 --width 1024 --passes 40"   # a launch-bound server instead
Prints a table; every latency and rate to RESULTS_DIR/hold_ceiling.json.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import pathlib
import shlex
import sys
import tempfile
import time

from gpu_measures import percentile
from harness import finish_json, start_json, stop_process, wait_for_file

HERE = pathlib.Path(__file__).resolve().parent
GEMMS_PER_STEP = 18  # the reference trainer's: 6 layers forward, 12 backward
WAYS = ("plain", "one_in_flight", "held")


def busy_client(args) -> None:
    """The busy side: back-to-back GEMMs until the window (and a slack) is over."""
    import torch

    a, b = (torch.randn(args.width, args.width, device="cuda") for _ in range(2))
    out = torch.empty_like(a)
    flag = None
    if args.way == "held":
        flag = mmap.mmap(os.open(args.flag, os.O_RDONLY), 1, prot=mmap.PROT_READ)
    stream = torch.cuda.current_stream()
    for _ in range(3):
        torch.matmul(a, b, out=out)
    torch.cuda.synchronize()
    pathlib.Path(args.ready_file).touch()
    go_at = _wait_for_go(args.go_file)
    end_at = go_at + args.seconds + 1.0
    steps = []
    while time.time() < end_at:
        for _ in range(GEMMS_PER_STEP):
            if args.way != "plain":
                stream.synchronize()
                while flag is not None and flag[0]:
                    pass
            torch.matmul(a, b, out=out)
        stream.synchronize()
        steps.append(time.time())
    print(json.dumps({"step_times": steps}))


def _wait_for_go(go_file: str) -> float:
    path = pathlib.Path(go_file)
    while True:
        try:
            return float(path.read_text())
        except (FileNotFoundError, ValueError):
            time.sleep(0.005)


def steps_per_s(step_times: list[float], start: float, end: float) -> float:
    inside = [t for t in step_times if start <= t <= end]
    if len(inside) < 2:
        return float("nan")
    return (len(inside) - 1) / (inside[-1] - inside[0])


def run_once(
    workdir: pathlib.Path,
    window_s: float,
    width: int | None,
    way: str | None,
    inference: list[str] | None,
) -> dict:
    """One run: the inference server and/or the busy client, over one window."""
    rundir = pathlib.Path(tempfile.mkdtemp(dir=workdir, prefix="run-"))
    flag, go = rundir / "flag", rundir / "go"
    flag.write_bytes(b"\0")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    processes, ready = {}, {}
    try:
        if inference is not None:
            ready["inference"] = rundir / "inference-ready"
            processes["inference"] = start_json(
                [
                    sys.executable,
                    str(HERE / "inference.py"),
                    "--seconds",
                    str(window_s),
                    "--ready-file",
                    str(ready["inference"]),
                    "--go-file",
                    str(go),
                    "--hold-flag",
                    str(flag),
                    *inference,
                ],
                env=env,
            )
            wait_for_file(ready["inference"], processes["inference"], timeout=180)
        if width:
            ready["busy"] = rundir / "busy-ready"
            processes["busy"] = start_json(
                [
                    sys.executable,
                    __file__,
                    "--busy",
                    "--width",
                    str(width),
                    "--way",
                    way,
                    "--flag",
                    str(flag),
                    "--seconds",
                    str(window_s),
                    "--ready-file",
                    str(ready["busy"]),
                    "--go-file",
                    str(go),
                ],
                env=env,
            )
            wait_for_file(ready["busy"], processes["busy"], timeout=180)
        go_at = time.time() + 0.5  # the busy client's first step is under way by then
        (rundir / "go.tmp").write_text(repr(go_at))
        (rundir / "go.tmp").rename(go)
        outputs = {name: finish_json(p, timeout=window_s + 120) for name, p in processes.items()}
    finally:
        for process in processes.values():
            if process.poll() is None:
                stop_process(process)
    result: dict = {"width": width, "way": way}
    if inference is not None:
        latencies = outputs["inference"]["latencies_ms"]
        result["inference"] = {
            "p50_ms": percentile(latencies, 0.5),
            "p99_ms": percentile(latencies, 0.99),
            "max_ms": max(latencies),
            "count": len(latencies),
            "latencies_ms": latencies,
        }
    if width:
        start = go_at + 1.0  # past the first step, into the window
        result["busy_steps_per_s"] = steps_per_s(
            outputs["busy"]["step_times"], start, go_at + window_s
        )
    return result


def table(results: dict) -> list[str]:
    solo = results["inference_solo"]["inference"]
    lines = [
        f"inference alone: p50 {solo['p50_ms']:.2f} / p99 {solo['p99_ms']:.2f} ms "
        f"(n={solo['count']})",
        "",
        "| busy GEMM width | way | inference p50 / p99 ms | p99 ÷ alone | busy steps/s | ÷ alone |",
        "|---|---|---|---|---|---|",
    ]
    for width in results["widths"]:
        alone = results[f"busy_solo_{width}"]["busy_steps_per_s"]
        lines.append(f"| {width} | alone | | | {alone:.2f} | 1.00x |")
        for way in WAYS:
            run = results.get(f"pair_{width}_{way}")
            if not run:
                continue
            inf = run["inference"]
            lines.append(
                f"| {width} | {way} | {inf['p50_ms']:.2f} / {inf['p99_ms']:.2f} | "
                f"{inf['p99_ms'] / solo['p99_ms']:.2f}x | {run['busy_steps_per_s']:.2f} | "
                f"{run['busy_steps_per_s'] / alone:.3f}x |"
            )
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("results", nargs="?", default=str(HERE.parents[1] / "results" / "gpu"))
    parser.add_argument("--window", type=float, default=15.0)
    parser.add_argument("--widths", default="8192,4096")
    parser.add_argument(
        "--inference-args", default="", help="more arguments for inference.py (its shape)"
    )
    parser.add_argument("--busy", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--width", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)
    parser.add_argument("--flag", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--ready-file", help=argparse.SUPPRESS)
    parser.add_argument("--go-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.busy:
        busy_client(args)
        return
    widths = [int(w) for w in args.widths.split(",")]
    results_dir = pathlib.Path(args.results)
    results_dir.mkdir(parents=True, exist_ok=True)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="hold-ceiling-"))
    server = shlex.split(args.inference_args)
    results: dict = {"window_s": args.window, "widths": widths, "inference_args": server}
    results["inference_solo"] = run_once(workdir, args.window, None, None, server)
    for width in widths:
        results[f"busy_solo_{width}"] = run_once(workdir, args.window, width, "plain", None)
        for way in WAYS:
            results[f"pair_{width}_{way}"] = run_once(workdir, args.window, width, way, server)
            print(f"hold_ceiling: {width} {way} done", flush=True)
    (results_dir / "hold_ceiling.json").write_text(json.dumps(results, indent=1))
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
