"""CuPy work with a Python host function after every step (cuLaunchHostFunc or
cuStreamAddCallback), reading back only every --sync-every steps, so callbacks
are still queued behind kernels when a drop request comes.

A Python callback needs the GIL.  A release waits for all queued work, callbacks
included; had CuPy held the GIL while waiting at the shim's gate, the callback,
and so the release, could never finish.  Prints one JSON line: steps, callbacks
seen (in order or not) and a checksum.
"""

import argparse
import json

import cupy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("api", choices=["launch_host_func", "add_callback"])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--sync-every", type=int, default=100)
    parser.add_argument("--width", type=int, default=4096)
    args = parser.parse_args()

    seen = []
    stream = cupy.cuda.Stream(non_blocking=True)
    enqueue = {
        "launch_host_func": lambda step: stream.launch_host_func(seen.append, step),
        "add_callback": lambda step: stream.add_callback(
            lambda _stream, _status, s: seen.append(s), step
        ),
    }[args.api]
    with stream:
        state = cupy.random.RandomState(0).standard_normal(
            (args.width, args.width), dtype=cupy.float32
        )
        mixer = cupy.random.RandomState(1).standard_normal(
            (args.width, args.width), dtype=cupy.float32
        )
        mixer /= args.width**0.5
        for step in range(args.steps):
            state = state + 0.01 * cupy.tanh(state @ mixer)  # ~3 ms on an H100
            enqueue(step)
            if step % args.sync_every == args.sync_every - 1:
                stream.synchronize()
        stream.synchronize()
        checksum = float(cupy.sum(state, dtype=cupy.float64))
    print(
        json.dumps(
            {
                "steps": args.steps,
                "callbacks": len(seen),
                "in_order": seen == list(range(args.steps)),
                "checksum": checksum,
            }
        )
    )


if __name__ == "__main__":
    main()
