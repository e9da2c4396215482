"""A two-stage pipeline of issue 44's shape g (duty.py): two processes joined by a
multiprocessing queue.  Stage one (this process) does --stage-ms of GPU work per item
(duty_client's bursts) and sends a small result, a float read back with `.item()`; stage
two (a child it spawns) takes each item and does its own --stage-ms.  The figure is items
out of stage two per second.  --queue-size 0 leaves the queue unbounded (stage one runs
ahead), 2 blocks stage one while two items wait.

duty_client's protocol: --hold PATH is created as PATH.held once both stages have imported
torch (the child is spawned first, so the two imports overlap); the options in PATH (the
bursts' `products`) size both stages; --ready-file once each stage has done a first unit;
SIGTERM ends both.  Prints one JSON line: stage two's completions and GPU times, stage
one's sends, both pids."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pathlib
import queue
import time
from typing import Any

REPLY_TIMEOUT_S = 120.0  # the child's import, set-up or last reply
POLL_S = 0.1


def orphaned(parent: int) -> bool:
    return os.getppid() != parent


def stage_two(items, replies, start, stop, stage_ms: float, seed: int, parent: int) -> None:
    """The child: waits for the options, sets up, then one burst per item until stop."""
    import duty_client  # torch, imported here beside the parent's own import

    replies.put(("imported", os.getpid()))
    while True:
        try:
            options = start.get(timeout=POLL_S)
            break
        except queue.Empty:
            if orphaned(parent):
                return
    bursts, products, _ = duty_client.sized_bursts(stage_ms, options, seed)
    bursts.run(products)
    duty_client.refuse_over_budget()
    replies.put(("ready", None))
    done_at: list[float] = []
    gpu_ms: list[float] = []
    while not stop.is_set() and not orphaned(parent):
        try:
            items.get(timeout=POLL_S)
        except queue.Empty:
            continue
        gpu_ms.append(bursts.run(products))
        done_at.append(time.time())
    replies.put(("done", {"done_at": done_at, "gpu_ms": gpu_ms}))


def expect(replies, what: str, child) -> Any:
    """The child's next reply, which must be `what`."""
    deadline = time.monotonic() + REPLY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            kind, payload = replies.get(timeout=POLL_S)
        except queue.Empty:
            if not child.is_alive():
                raise SystemExit(
                    f"duty_pipeline: stage two ended (exit {child.exitcode})"
                ) from None
            continue
        if kind != what:
            raise SystemExit(f"duty_pipeline: stage two said {kind!r}, not {what!r}")
        return payload
    raise SystemExit(f"duty_pipeline: no {what!r} from stage two in {REPLY_TIMEOUT_S:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--stage-ms", type=float, default=20.0, help="GPU time per item, each stage"
    )
    parser.add_argument("--queue-size", type=int, default=0, help="0: unbounded")
    parser.add_argument("--hold", help="wait for this file (JSON options) before using the GPU")
    parser.add_argument("--ready-file", help="created once both stages did a first unit")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.queue_size < 0:
        parser.error(f"--queue-size must be 0 (unbounded) or more, not {args.queue_size}")

    # spawn, not fork: the child must start its own CUDA context, and under the shim its own
    # client (LD_PRELOAD and NVSHARE_SOCKET come with the environment).
    context = multiprocessing.get_context("spawn")
    items = context.Queue(maxsize=args.queue_size)
    replies, start = context.Queue(), context.Queue()
    stop = context.Event()
    child = context.Process(
        target=stage_two,
        args=(items, replies, start, stop, args.stage_ms, args.seed + 1, os.getpid()),
        daemon=True,
    )
    child.start()
    import duty_client  # torch

    stopping = duty_client.stop_on_sigterm()
    child_pid = expect(replies, "imported", child)
    options = duty_client.wait_for_start(args.hold)
    start.put(options)
    bursts, products, ms_per_product = duty_client.sized_bursts(args.stage_ms, options, args.seed)
    bursts.run(products)
    duty_client.refuse_over_budget()
    expect(replies, "ready", child)
    if args.ready_file:
        pathlib.Path(args.ready_file).touch()

    sent_at: list[float] = []
    stage_one_gpu_ms: list[float] = []
    while not stopping:
        stage_one_gpu_ms.append(bursts.run(products))
        while not stopping:
            try:
                items.put((len(sent_at), bursts.checksum), timeout=POLL_S)
                sent_at.append(time.time())
                break
            except queue.Full:
                continue
    stop.set()
    stage_two_run = expect(replies, "done", child)
    items.cancel_join_thread()  # items never taken must not hold this process's exit
    child.join(10)
    print(
        json.dumps(
            {
                **stage_two_run,
                "sent_at": sent_at,
                "stage_one_gpu_ms": stage_one_gpu_ms,
                "products": products,
                "ms_per_product": ms_per_product,
                "queue_size": args.queue_size,
                **duty_client.about_process(),
                "stage_two_pid": child_pid,
            }
        )
    )


if __name__ == "__main__":
    main()
