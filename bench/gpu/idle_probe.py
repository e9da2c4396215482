#!/usr/bin/env python3
"""Does the idle release wait for the work a process queued, on the real driver?  One
process under the shim (anti-thrash on, idle_release_ms 100) queues matmuls longer than the
queue bound, so its thread waits inside the gate for each, passing it once per kernel; then
it sleeps a second, works again, and exits.  Its shim's log must show one idle release, in
the sleep, about idle_release_ms after the first stretch of work ended, and none in it.

    bench/gpu/run.sh --idle-probe [RESULTS_DIR]    # prints one JSON line"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
import tempfile

from harness import Agent

IDLE_RELEASE_MS = 100

CLIENT = r"""
import json, time, torch
n = 16384
a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
torch.backends.cuda.matmul.allow_tf32 = False
(a @ b); torch.cuda.synchronize()
def work(seconds):
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        c = a @ b  # ~0.1 s of fp32 each: longer than the 50 ms bound, so the thread waits
    torch.cuda.synchronize()
    return time.perf_counter() - started
t0 = time.perf_counter()
first = work(4.0)
time.sleep(1.0)
second = work(2.0)
print(json.dumps({"first_work_s": round(first, 3), "second_work_s": round(second, 3),
                  "total_s": round(time.perf_counter() - t0, 3)}), flush=True)
"""


def main() -> None:
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())
    out.mkdir(parents=True, exist_ok=True)
    agent = Agent(out, anti_thrash=True, idle_release_ms=IDLE_RELEASE_MS)
    try:
        env = agent.env(NVSHARE_DEBUG="1")  # the shim preloaded, its log on
        done = subprocess.run(
            [sys.executable, "-c", CLIENT], env=env, capture_output=True, text=True, timeout=180
        )
    finally:
        agent.stop()
    (out / "client.stderr").write_text(done.stderr)
    result = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {}
    releases = [
        {"reason": reason, "held_ms": float(held), "idle_ms": int(idle)}
        for reason, held, idle in re.findall(
            r"release gpu=\d+ lease=\d+ reason=(\w+) held_ms=([\d.]+) drain_ms=[\d.]+ idle_ms=(\d+)",
            done.stderr,
        )
    ]
    grants = len(re.findall(r"\] grant gpu=", done.stderr))
    result.update(returncode=done.returncode, grants=grants, releases=releases)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
