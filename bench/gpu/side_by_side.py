#!/usr/bin/env python3
"""Side by side by weight (issue 44, principle 2; docs/scheduling.md, "Side by side"), on
one GPU: processes whose memory fits all run together, and the fair page
(shim/fair_share.c) is to split the GPU's time between those with work by their weights.

Each pair runs for --window seconds after both have done a first burst, each process as
its own uid (shares.py's users: A 4001, B 4002) so that each is its own share group:
- weights: two duty processes (duty_client.py: 20 ms bursts, 90 % busy alone), A at
  weight 3, B at 1: without nvshare, and under the shim with an agent at its defaults;
  the figure is each one's GPU time (bursts x its burst's GPU time alone) over the
  window: 0.75 / 0.25 is the weights' split, ~0.5 / 0.5 the driver's.
- light: a duty process 30 % busy (A) beside an always-busy trainer (B), weights 1:
  without and with nvshare; the duty process's bursts a second against its rate alone.
First each kind alone without nvshare (its rate, and its burst's GPU time).

    bench/gpu/run.sh --side-by-side [RESULTS] [--window S]     # ~3 minutes at 20 s

Prints a table; the numbers go to RESULTS/side_by_side.json, the agents' logs to
RESULTS/agent-logs/.  Runs as root (it drops to the two uids).  Safety: two processes
of < 1 GiB each (duty_client.py stops itself past 1 GiB), checked against the GPU first.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

from gpu_state import check_memory
from harness import Agent, wait_for_file
from shares import USER_A, USER_B, as_user, open_folder, shares_config, user_env

from nvshare_agent.settings import DEFAULT_SETTINGS

HERE = pathlib.Path(__file__).resolve().parent
CLIENT = [sys.executable, str(HERE / "duty_client.py")]
DUTY = ["bursts", "--burst-ms", "20", "--duty"]
BUSY = [*DUTY, "0.9"]
LIGHT = [*DUTY, "0.3"]
TRAINER = ["trainer"]
SETUP_S = 120.0


def run_pair(workdir, shapes, window_s, weights=None, options=None) -> list[dict]:
    """shapes: [(uid, duty_client args)], run together for window_s once each has done a
    unit; weights: {uid: weight} under nvshare, None for no nvshare; options: duty_client's
    start options (products: the bursts' size, as measured alone).  Each one's units."""
    shared = open_folder(workdir, "pair-")
    agent = None
    if weights is not None:
        groups = {f"user:{uid}": {"weight": str(w)} for uid, w in weights.items()}
        agent = Agent(
            workdir,
            anti_thrash="auto",
            idle_release_ms=DEFAULT_SETTINGS.idle_release_ms,
            socket=open_folder(workdir, "socket-") / "scheduler.sock",
            extra_config=shares_config("user", groups),
        )
    processes = []
    try:
        for number, (uid, args) in enumerate(shapes):
            ready = shared / f"ready-{number}"
            if agent is not None:
                env = user_env(agent, uid)
                if os.environ.get("NVSHARE_BENCH_DEBUG"):
                    env["NVSHARE_DEBUG"] = "1"  # the shims' fair lines, a second each
            else:
                env = dict(os.environ, HOME="/tmp")
                env.pop("LD_PRELOAD", None)
            hold = shared / f"options-{number}"
            hold.write_text(json.dumps(options or {}))
            process = subprocess.Popen(
                [*CLIENT, *args[:1], "--ready-file", str(ready), "--hold", str(hold), *args[1:]],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                preexec_fn=as_user(uid),
                cwd="/tmp",
            )
            processes.append((process, ready))
        for process, ready in processes:
            wait_for_file(ready, process, timeout=SETUP_S)
        start = time.time() + 1.0
        time.sleep(1.0 + window_s)
        results = []
        for process, _ready in processes:
            process.terminate()
        for process, _ready in processes:
            out, err = process.communicate(timeout=60)
            line = [x for x in out.splitlines() if x.startswith("{")]
            if not line:
                raise RuntimeError(f"a client printed nothing: {err[-2000:]}")
            result = json.loads(line[-1])
            units = [t for t in result["done_at"] if start <= t < start + window_s]
            results.append(
                {
                    "units": len(units),
                    "per_s": len(units) / window_s,
                    "products": result.get("products"),
                    "gpu_ms": sorted(result["gpu_ms"])[len(result["gpu_ms"]) // 2],
                    "fair_lines": [x for x in err.splitlines() if " fair gpu=" in x][-30:],
                }
            )
        return results
    finally:
        for process, _ready in processes:
            if process.poll() is None:
                process.kill()
        if agent is not None:
            agent.stop()
            logs = workdir / "agent-logs"
            logs.mkdir(exist_ok=True)
            shutil.copyfile(agent.log_path, logs / f"{agent.dir.name}.log")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("results", nargs="?", default="/tmp/side-by-side")
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--only", default="weights,light", help="weights, light or both")
    args = parser.parse_args()
    out = pathlib.Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    # Where the two uids reach (RESULTS may sit in root's 0700 home).
    work = pathlib.Path(tempfile.mkdtemp(prefix="side-by-side-", dir="/tmp"))
    work.chmod(0o755)
    check_memory(2)
    w = args.window
    figures: dict = {}
    # Alone, without nvshare: each kind's rate (a busy duty process's bursts a second
    # alone, at 90 %, is 0.9 / its burst's time).
    for name, shape in (("busy", BUSY), ("light", LIGHT), ("trainer", TRAINER)):
        figures[f"alone_{name}"] = run_pair(work, [(USER_A, shape)], w / 2)[0]
    only = args.only.split(",")
    for name, weights in (("none", None), ("nvshare", {USER_A: 3, USER_B: 1})):
        if "weights" not in only:
            break
        sized = {"products": figures["alone_busy"]["products"]}
        a, b = run_pair(work, [(USER_A, BUSY), (USER_B, BUSY)], w, weights, sized)
        figures[f"weights_{name}"] = {"a_w3": a, "b_w1": b}
    for name, weights in (("none", None), ("nvshare", {USER_A: 1, USER_B: 1})):
        if "light" not in only:
            break
        sized = {"products": figures["alone_light"]["products"]}
        a, b = run_pair(work, [(USER_A, LIGHT), (USER_B, TRAINER)], w, weights, sized)
        figures[f"light_{name}"] = {"light": a, "trainer": b}
    (out / "side_by_side.json").write_text(json.dumps(figures, indent=1))
    shutil.copytree(work / "agent-logs", out / "agent-logs", dirs_exist_ok=True)
    # A burst's GPU time alone: a process's part of the GPU is its bursts a second times it.
    burst_s = figures["alone_busy"]["gpu_ms"] / 1000
    busy_alone = 1 / burst_s
    print("| run | A | B | A's part of the GPU |")
    print("|---|---|---|---|")
    for name in ("none", "nvshare") if "weights" in only else ():
        a, b = figures[f"weights_{name}"]["a_w3"], figures[f"weights_{name}"]["b_w1"]
        print(
            f"| weights 3:1, both 90 % busy, {name} | {a['per_s']:.1f}/s | {b['per_s']:.1f}/s"
            f" | {a['per_s'] / busy_alone:.2f} (B {b['per_s'] / busy_alone:.2f}) |"
        )
    for name in ("none", "nvshare") if "light" in only else ():
        light, trainer = figures[f"light_{name}"]["light"], figures[f"light_{name}"]["trainer"]
        print(
            f"| 30 % busy beside a trainer, {name} | {light['per_s']:.1f}/s "
            f"({light['per_s'] / figures['alone_light']['per_s']:.2f}x alone) | trainer "
            f"{trainer['per_s']:.1f}/s ({trainer['per_s'] / figures['alone_trainer']['per_s']:.2f}x) | |"
        )


if __name__ == "__main__":
    main()
