"""What the node-mix benchmark's light clients share (mix.py): no PyTorch here.

Each light client (inference.py, notebook_cells.py, loader.py) sets itself up,
creates its --ready-file, then waits for mix.py to write the --go-file: the
wall-clock time at which every client's measured window starts.  Work that
arrives on a schedule (requests, batches) is timed from its scheduled arrival,
so a request that waits behind a late one counts that wait too."""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import time
from collections.abc import Callable, Iterator

from gpu_measures import percentile

# A light client's allocations stay under this: mix.py plans memory with it.
LIGHT_MAX_BYTES = 1 << 30


def refuse_over_budget(client: str, reserved_bytes: int) -> None:
    """A light client that holds more than LIGHT_MAX_BYTES would break mix.py's
    sum against half the GPU's free memory: it stops at once."""
    if reserved_bytes > LIGHT_MAX_BYTES:
        raise SystemExit(f"{client}: holds {reserved_bytes} bytes, over 1 GiB")


def add_window_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=30.0, help="the measured window")
    parser.add_argument("--ready-file", help="created once set up")
    parser.add_argument("--go-file", help="holds the window's start (epoch seconds)")
    parser.add_argument("--seed", type=int, default=1)


def poisson_arrivals(rate_per_s: float, seconds: float, seed: int) -> list[float]:
    """Arrival times in [0, seconds) of a Poisson stream: exponential gaps, seeded."""
    rng = random.Random(seed)
    arrivals, now = [], rng.expovariate(rate_per_s)
    while now < seconds:
        arrivals.append(now)
        now += rng.expovariate(rate_per_s)
    return arrivals


def periodic_arrivals(period_s: float, seconds: float) -> list[float]:
    """One arrival every period_s from the window's start, as a data loader's batches land."""
    return [index * period_s for index in range(int(seconds / period_s - 1e-9) + 1)]


def notebook_cells(seed: int, cell_ms=(15.0, 150.0), gap_s=(0.7, 2.3)) -> Iterator[tuple]:
    """(gap before the cell in s, the cell's GPU time in ms), forever: a user thinking for a
    while, then running a short or a long cell, chosen at random (seeded)."""
    rng = random.Random(seed)
    while True:
        yield rng.uniform(*gap_s), rng.choice(cell_ms)


def wait_for_go(ready_file: str | None, go_file: str | None, poll_s=0.005) -> float:
    """Says this client is set up; returns the window's start in time.monotonic()'s terms
    (now, with no go file)."""
    if ready_file:
        pathlib.Path(ready_file).touch()
    if not go_file:
        return time.monotonic()
    path = pathlib.Path(go_file)
    while True:
        try:
            go_at = float(path.read_text())
            break
        except (FileNotFoundError, ValueError):  # not there yet, or mid-rename
            time.sleep(poll_s)
    return time.monotonic() + (go_at - time.time())


def serve(arrivals: list[float], window_start: float, answer: Callable[[], object]) -> list[float]:
    """Answers one request per arrival (offsets from window_start, time.monotonic()'s clock),
    each once it has arrived and the one before is answered; returns each one's latency in ms,
    from its scheduled arrival to its answer."""
    latencies = []
    for offset in arrivals:
        arrival = window_start + offset
        ahead = arrival - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        answer()
        latencies.append(1000 * (time.monotonic() - arrival))
    return latencies


def run_cells(
    window_start: float, seconds: float, cells: Iterator[tuple], run_cell: Callable[[float], object]
) -> tuple[list[float], list[float]]:
    """Runs cells one after the other, each after its gap, until the window is over: a user
    waits for a cell's result, thinks, runs the next.  Returns each cell's latency in ms (its
    start to its result) and the GPU time it was sized to."""
    latencies, sizes = [], []
    finished = window_start
    for gap_s, cell_ms in cells:
        start_at = finished + gap_s
        if start_at >= window_start + seconds:
            break
        time.sleep(max(0.0, start_at - time.monotonic()))
        begin = time.monotonic()
        run_cell(cell_ms)
        finished = time.monotonic()
        latencies.append(1000 * (finished - begin))
        sizes.append(cell_ms)
    return latencies, sizes


def latency_summary(latencies_ms: list[float], tail: float) -> dict:
    """p50, the tail percentile (0.99 or 0.95), max and count, as the JSON line gives them."""
    return {
        "count": len(latencies_ms),
        "p50_ms": percentile(latencies_ms, 0.5),
        f"p{round(100 * tail)}_ms": percentile(latencies_ms, tail),
        "max_ms": max(latencies_ms, default=float("nan")),
    }


def report(latencies_ms: list[float], tail: float, window_start: float, **extra) -> None:
    """The client's one JSON line: every latency, its summary, and its window in wall-clock time."""
    offset = time.time() - time.monotonic()
    print(
        json.dumps(
            {
                "latencies_ms": latencies_ms,
                **latency_summary(latencies_ms, tail),
                "started_at": window_start + offset,
                "ended_at": time.time(),
                **extra,
            }
        )
    )
