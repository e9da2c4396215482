#!/usr/bin/env python3
"""What the agent's policy does with a mix of clients on one GPU, without a GPU: the real
scheduling core (agent/scheduler.py) against clients played on a clock of 1 ms steps.

    python3 bench/policy_sim.py trainer@30 trainer@30 service:0.05:0.002@10 --gpu-gib 64

Each argument is a client, KIND[:A:B][@GIB] (GIB: its memory, 1 by default; the agent adds
its context's 512 MiB):
  trainer[:STEP:PAUSE]   a step of GPU work, then a pause on the host (0.1 s, 0.006 s)
  service[:PERIOD:WORK]  a request every PERIOD seconds, WORK of GPU time each (0.05, 0.001)
  notebook[:CELL:THINK]  a cell of GPU work, then THINK seconds of reading it (0.15, 1.5)

A client plays its shim as docs/scheduling.md and the shim's code describe it: it asks for
the lock when it has work, reports its GPU time every 100 ms, gives the lock back once idle
idle_release_ms, or when asked to drop (after its work in flight: DRAIN_S) or to yield
(once idle that long); a turn granted DISPLACED first brings its memory back (--swap-s).
The GPU runs every holder's work at once at full speed (no slowdown when they share it):
what this shows is who holds the GPU when, not how fast kernels go.

Prints, per client: its share of the GPU's time, its work's latency (from arrival to done)
at p50 / p99 / max, and its turn grants (a turn that goes on after a window counts again);
then how long the GPU sat idle while work waited.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field

from nvshare_agent.actions import AskToDrop, Grant
from nvshare_agent.core_state import FEATURE_USAGE, FEATURE_YIELD
from nvshare_agent.scheduler import Scheduler
from nvshare_agent.settings import AntiThrash, Settings

GPU = b"GPU-sim-0000000"
STEP_S = 0.001
REPORT_EVERY_S = 0.1  # the shim's GPU_USAGE frames come at most this often
DRAIN_S = 0.02  # asked to drop: its work in flight drains first
GIB = 1 << 30
KINDS = {"trainer": (0.1, 0.006), "service": (0.05, 0.001), "notebook": (0.15, 1.5)}


@dataclass
class Client:
    """One simulated process and its shim."""

    number: int
    kind: str
    a: float
    b: float
    memory_bytes: int
    next_arrival: float = 0.0
    pending: list = field(default_factory=list)  # [arrived_at, GPU seconds left]
    lease: Grant | None = None
    waiting: bool = False
    ready_at: float = 0.0  # a displaced turn's memory is back
    idle_since: float = 0.0
    drop_at: float | None = None
    yield_idle_s: float | None = None
    busy_s: float = 0.0
    reported_at: float = -1.0
    latencies: list = field(default_factory=list)
    turns: list = field(default_factory=list)  # grant times of its turns

    def arrive(self, now: float) -> None:
        if self.kind == "service":
            while self.next_arrival <= now:
                self.pending.append([self.next_arrival, self.b])
                self.next_arrival += self.a
        elif not self.pending and self.next_arrival is not None and self.next_arrival <= now:
            self.pending.append([now, self.a])  # a step or a cell: after the last one's pause
            self.next_arrival = None

    def work(self, now: float) -> None:
        job = self.pending[0]
        job[1] -= STEP_S
        self.busy_s += STEP_S
        self.idle_since = now
        if job[1] <= 1e-9:
            self.latencies.append(now - job[0])
            self.pending.pop(0)
            if self.kind != "service":
                self.next_arrival = now + self.b


def parse_client(number: int, spec: str) -> Client:
    shape, _, memory = spec.partition("@")
    kind, *numbers = shape.split(":")
    if kind not in KINDS:
        raise ValueError(f"{spec!r}: no kind {kind!r} (kinds: {', '.join(KINDS)})")
    if len(numbers) not in (0, 2):
        raise ValueError(f"{spec!r}: give both of {kind}'s numbers, or neither")
    try:
        a, b = (float(n) for n in numbers) if numbers else KINDS[kind]
        gib = float(memory) if memory else 1.0
    except ValueError:
        raise ValueError(f"{spec!r}: not a number") from None
    if not (a > 0 and b >= 0 and gib >= 0) or (kind == "service" and b <= 0):
        raise ValueError(f"{spec!r}: times must be positive, memory not negative")
    return Client(number, kind, a, b, int(gib * GIB))


def simulate(
    specs: list[str],
    seconds: float,
    settings: Settings,
    gpu_gib: float,
    swap_s: float = 0.0,
    same_user: bool = False,
) -> dict:
    clients = [parse_client(n + 1, spec) for n, spec in enumerate(specs)]
    core = Scheduler(settings)
    core.add_gpu(GPU, "simulated", int(gpu_gib * GIB))
    for c in clients:
        uid = 1000 if same_user else 1000 + c.number
        core.connect(c.number, pid=100 + c.number, uid=uid, gid=uid, now=0.0)
        core.hello(c.number, (GPU,), c.kind, now=0.0, features=FEATURE_YIELD | FEATURE_USAGE)
        core.memory_report(c.number, GPU, c.memory_bytes, 0, now=0.0)
    by_number = {c.number: c for c in clients}
    idle_while_waiting = 0.0

    def carry_out(actions, now):
        for action in actions:
            client = by_number.get(getattr(action, "client", None))
            if isinstance(action, Grant) and client is not None:
                client.lease, client.waiting = action, False
                # Idle counts once its memory is back: a long prefetch is no idle time.
                client.ready_at = now + (swap_s if action.displaced else 0.0)
                client.idle_since = client.ready_at
                client.drop_at = client.yield_idle_s = None
                if action.role == "turn":
                    client.turns.append(now)
            elif isinstance(action, AskToDrop) and client is not None and client.lease:
                if action.when_idle_ms:
                    client.yield_idle_s = action.when_idle_ms / 1000
                elif client.drop_at is None:
                    # Its work in flight drains first; with none, it releases at once.
                    client.drop_at = now + (DRAIN_S if client.pending else 0.0)

    def release(c: Client, now: float) -> None:
        core.gpu_usage(c.number, GPU, round(c.busy_s * 1e6), now)
        idle_ms = round(max(0.0, now - c.idle_since) * 1000)
        lease, c.lease = c.lease, None
        carry_out(core.release(c.number, GPU, lease.lease, now, idle_ms), now)

    steps = round(seconds / STEP_S)
    for step in range(1, steps + 1):
        now = step * STEP_S
        for c in clients:
            c.arrive(now)
        gpu_busy = False
        for c in clients:
            if c.lease is None:
                continue
            if c.pending and now >= c.ready_at and (c.drop_at is None or now < c.drop_at):
                c.work(now)
                gpu_busy = True
            if now - c.reported_at >= REPORT_EVERY_S:
                core.gpu_usage(c.number, GPU, round(c.busy_s * 1e6), now)
                c.reported_at = now
            idle = now - c.idle_since
            if (
                (c.drop_at is not None and now >= c.drop_at)
                or idle >= settings.idle_release_ms / 1000
                or (c.yield_idle_s is not None and idle >= c.yield_idle_s)
            ):
                release(c, now)
        for c in clients:
            if c.lease is None and c.pending and not c.waiting:
                c.waiting = True
                carry_out(core.request(c.number, GPU, now), now)
        if not gpu_busy and any(c.pending for c in clients):
            idle_while_waiting += STEP_S
        deadline = core.next_deadline()
        if deadline is not None and deadline <= now:
            carry_out(core.tick(now), now)
    return {
        "seconds": seconds,
        "idle_while_work_waited_s": idle_while_waiting,
        "clients": {f"{c.number} {c.kind}": figures(c, seconds) for c in clients},
    }


def figures(c: Client, seconds: float) -> dict:
    ordered = sorted(c.latencies)
    turns = [b - a for a, b in zip(c.turns, c.turns[1:])]

    def at(fraction):
        return (
            ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]
            if ordered
            else None
        )

    return {
        "share": c.busy_s / seconds,
        "done": len(ordered),
        "p50_s": at(0.5),
        "p99_s": at(0.99),
        "max_s": ordered[-1] if ordered else None,
        "turns": len(c.turns),
        "median_turn_gap_s": statistics.median(turns) if turns else None,
    }


def printed(result: dict) -> list[str]:
    def s(value):
        return "-" if value is None else f"{value:.3f}"

    lines = [
        "| client | share | done | p50 / p99 / max (s) | turn grants (median gap, s) |",
        "|---|---|---|---|---|",
    ]
    for name, f in result["clients"].items():
        lines.append(
            f"| {name} | {100 * f['share']:.1f} % | {f['done']} | {s(f['p50_s'])} / {s(f['p99_s'])} / "
            f"{s(f['max_s'])} | {f['turns']} ({s(f['median_turn_gap_s'])}) |"
        )
    idle = result["idle_while_work_waited_s"] / result["seconds"]
    lines.append(f"GPU idle while work waited: {100 * idle:.1f} % of {result['seconds']:g} s")
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="policy_sim", description=__doc__.split("\n\n")[0])
    parser.add_argument("clients", nargs="+", help="KIND[:A:B][@GIB], e.g. trainer@30")
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--gpu-gib", type=float, default=80.0, help="the GPU's memory")
    parser.add_argument("--tq", type=int, default=30, help="time quantum, seconds")
    parser.add_argument("--anti-thrash", choices=[m.value for m in AntiThrash], default="auto")
    parser.add_argument("--swap-s", type=float, default=0.0, help="a displaced turn's prefetch")
    parser.add_argument("--same-user", action="store_true", help="one share group for all")
    args = parser.parse_args(argv)
    if not (args.seconds > 0 and args.gpu_gib > 0 and args.tq > 0 and args.swap_s >= 0):
        sys.exit(
            "policy_sim: --seconds, --gpu-gib and --tq must be positive, --swap-s not negative"
        )
    settings = Settings(time_quantum_s=args.tq, anti_thrash=AntiThrash(args.anti_thrash))
    try:
        result = simulate(
            args.clients, args.seconds, settings, args.gpu_gib, args.swap_s, args.same_user
        )
    except ValueError as error:
        sys.exit(f"policy_sim: {error}")
    print("\n".join(printed(result)))


if __name__ == "__main__":
    main()
