#!/usr/bin/env python3
"""What JAX's allocator settings cost under the shim: median step time of a small JAX
training loop (tests/gpu/frameworks.py) per allocator, alone on the GPU, with and without
the shim, as ratios to the same allocator without the shim (the shim's cost) and to JAX's
default allocator without it, taken in this one run.

    bench/gpu/run.sh --jax-allocators [RESULTS]      # RESULTS defaults to results/gpu

XLA's default allocator maps CUDA virtual memory, which the shim cannot make managed;
XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async allocates stream-ordered, which the shim converts
(and, since parking, reuses).  Each process preallocates 5 % of the GPU at most.
"""

from __future__ import annotations

import json
import pathlib
import statistics
import sys

import harness as bench

WORKLOAD = bench.REPO / "tests" / "gpu" / "frameworks.py"
SHAPES = (1024, 256)  # width = batch: ~2.8 ms and ~0.45 ms steps on the H100
ROUNDS = 3  # interleaved, the order flipping each round


def median_step_ms(result: dict, skip: int = 20) -> float:
    times = result["step_times"]
    return statistics.median(b - a for a, b in zip(times[skip:], times[skip + 1 :])) * 1e3


def main() -> None:
    results_dir = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else bench.REPO / "results" / "gpu")
    results_dir.mkdir(parents=True, exist_ok=True)
    agent = bench.Agent(results_dir)
    variants = [
        (allocator, shimmed) for allocator in ("default", "cuda_async") for shimmed in (False, True)
    ]
    steps: dict[str, list[float]] = {}
    managed: dict[str, bool] = {}
    try:
        for round_ in range(ROUNDS):
            for allocator, shimmed in variants if round_ % 2 == 0 else variants[::-1]:
                for width in SHAPES:
                    key = f"{allocator} {'shim' if shimmed else 'plain'} w={width}"
                    result = bench.run_json(
                        [
                            sys.executable,
                            str(WORKLOAD),
                            "jax",
                            "--steps",
                            "300",
                            "--width",
                            str(width),
                            "--batch",
                            str(width),
                            "--jax-allocator",
                            allocator,
                        ],
                        env=agent.env() if shimmed else None,
                    )
                    steps.setdefault(key, []).append(median_step_ms(result))
                    managed[key] = result["managed"]
    finally:
        agent.stop()
    rows = []
    for width in SHAPES:
        default_plain = statistics.median(steps[f"default plain w={width}"])
        for allocator, shimmed in variants:
            key = f"{allocator} {'shim' if shimmed else 'plain'} w={width}"
            ms = statistics.median(steps[key])
            same_plain = statistics.median(steps[f"{allocator} plain w={width}"])
            rows.append(
                {
                    "variant": key,
                    "step_ms": round(ms, 4),
                    "vs_same_plain": round(ms / same_plain, 3),
                    "vs_default_plain": round(ms / default_plain, 3),
                    "managed": managed[key],
                    "runs_ms": [round(v, 4) for v in steps[key]],
                }
            )
    (results_dir / "jax_allocators.json").write_text(json.dumps(rows, indent=2))
    print(f"{'variant':<28}{'step ms':>9}{'vs same, plain':>16}{'vs default plain':>18}  managed")
    for row in rows:
        print(
            f"{row['variant']:<28}{row['step_ms']:>9.3f}{row['vs_same_plain']:>15.3f}x"
            f"{row['vs_default_plain']:>17.3f}x  {row['managed']}"
        )


if __name__ == "__main__":
    main()
