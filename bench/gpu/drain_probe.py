#!/usr/bin/env python3
"""Where a window's time goes (issue 35, "nothing fits"): the reference trainer at width
8192 under the shim with NVSHARE_DEBUG=1, beside a light client that asks every 50 ms
(a small matmul answered with .item()), memory_limit 1G so that nothing runs beside the
turn.  From the trainer's own log: the yields it was sent before each drop, each drop's
drain (drain_ms) and each grant's prefetch (ms_after_grant).

    bench/gpu/run.sh --drain-probe [RESULTS] [SECONDS] [KEY=VALUE ...]  # the trainer's env
Prints one JSON line of percentiles; the logs land in RESULTS."""

import json
import pathlib
import re
import subprocess
import sys
import tempfile
import time

from run import Agent, stop_process

HERE = pathlib.Path(__file__).resolve().parent
LIGHT = """
import time, torch
x = torch.randn(256, 256, device="cuda")
end = time.time() + float(__import__("sys").argv[1])
while time.time() < end:
    (x @ x).sum().item()
    time.sleep(0.05)
"""


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    values = sorted(values)
    at = lambda q: values[min(len(values) - 1, int(q * len(values)))]  # noqa: E731
    return {"n": len(values), "p50": at(0.5), "p90": at(0.9), "max": values[-1]}


def main() -> None:
    results = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "drain-probe")
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 15.0
    results.mkdir(parents=True, exist_ok=True)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="nvshare-drain-"))
    agent = Agent(workdir, anti_thrash="auto", memory_limit="1G", debug=True)
    try:
        extra = dict(a.split("=", 1) for a in sys.argv[3:])
        env = agent.env(NVSHARE_DEBUG=1, **extra)
        with open(results / "trainer.log", "w") as trainer_log:
            trainer = subprocess.Popen(
                [
                    sys.executable,
                    str(HERE / "trainer.py"),
                    "--width",
                    "8192",
                    "--seconds",
                    str(seconds + 5),
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=trainer_log,
            )
            time.sleep(5)
            light = subprocess.run(
                [sys.executable, "-c", LIGHT, str(seconds)], env=agent.env(), timeout=seconds + 60
            )
            stop_process(trainer)
    finally:
        agent.stop()
    (results / "agent.log").write_text(agent.log())
    log = (results / "trainer.log").read_text(errors="replace")
    print(
        json.dumps(
            {
                "light_rc": light.returncode,
                "yields": len(re.findall(r"drop gpu=\d+ lease=\d+ when idle", log)),
                "drops": len(re.findall(r"drop gpu=\d+ lease=\d+(?! when idle)", log)),
                "drain_ms": percentiles(
                    [float(v) for v in re.findall(r"reason=drop .*?drain_ms=([\d.]+)", log)]
                ),
                "prefetch_ms": percentiles(
                    [
                        float(v)
                        for v in re.findall(
                            r"gate gpu=\d+ lease=\d+ open ms_after_grant=([\d.]+)", log
                        )
                    ]
                ),
                "drop_to_release_ms": percentiles(
                    [float(v) for v in re.findall(r"drop_to_release_ms=([\d.]+)", agent.log())]
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
