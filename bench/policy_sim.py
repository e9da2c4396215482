#!/usr/bin/env python3
"""What the agent's policy does with a mix of clients on one GPU, without a GPU: the real
scheduling core (agent/scheduler.py) against clients played on a clock of 1 ms steps, a
model of the GPU they share, and the ideal to judge it by.

    python3 bench/policy_sim.py trainer@30 duty:0.03:0.3 duty:0.03:0.3+2 --gpu-gib 64
    python3 bench/policy_sim.py --sweep 1000        # random mixes against their ideal

Each argument is a client, KIND[:A:B][@GIB][+START][*WEIGHT]: GIB its memory (1 by default;
the agent adds its context's 512 MiB), START when it comes (seconds), WEIGHT its share
group's weight (each client is a user of its own):
  trainer[:STEP:PAUSE]   a step of GPU work, then a pause on the host (0.1 s, 0.0005 s)
  service[:PERIOD:WORK]  a request every PERIOD seconds, WORK of GPU time each (0.05, 0.001)
  notebook[:CELL:THINK]  a cell of GPU work, then THINK seconds of reading it (0.15, 1.5)
  duty[:BURST:BUSY]      a burst of GPU work, then the host time that makes it BUSY of the
                         time alone (0.03, 0.3): a data loader, a pipeline's stage, an agent

The clients play their shims as docs/scheduling.md describes them: ask for the lock with
work, report GPU time every 100 ms, give it back once idle idle_release_ms, when asked to
drop (after their work in flight, DRAIN_S), when asked to yield (once idle that long); a
grant that says DISPLACED first brings memory back (--swap-s).

The GPU (calibrated on the H100 and H200, docs/benchmarks.md): in each step every holder
with work gets an equal slice of it, as the driver's time-slicing gives, and the GPU does
INTERLEAVED_EFFICIENCY of its work while two or more contexts have work (two trainers
time-sliced: 0.91x of one alone).  The ideal (ideal_run) plays the same clients on a
fluid GPU: no memory limit, no cost to interleaving, each client with work its weight's
part of every step (weighted max-min at every instant).  It ignores memory: where turns
are needed it is a bound, not a target.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from dataclasses import dataclass, field

from policy_ceiling import ceiling, fitting_sets

from nvshare_agent.actions import AskToDrop, Grant
from nvshare_agent.core_state import FEATURE_USAGE, FEATURE_YIELD
from nvshare_agent.scheduler import Scheduler
from nvshare_agent.settings import AntiThrash, Settings, Share

GPU = b"GPU-sim-0000000"
STEP_S = 0.001
REPORT_EVERY_S = 0.1  # the shim's GPU_USAGE frames come at most this often
DRAIN_S = 0.02  # asked to drop: its work in flight drains first
INTERLEAVED_EFFICIENCY = 0.91
GIB = 1 << 30
KINDS = {
    "trainer": (0.1, 0.0005),
    "service": (0.05, 0.001),
    "notebook": (0.15, 1.5),
    "duty": (0.03, 0.3),
}
WINDOW_S = 10.0  # shares are judged over the run and over every window this long
SETTLE_S = 5.0  # ... after a client's first seconds


@dataclass
class Client:
    """One simulated process and its shim."""

    number: int
    kind: str
    a: float
    b: float
    memory_bytes: int
    start: float = 0.0
    weight: int = 1
    next_arrival: float = 0.0
    pending: list = field(default_factory=list)  # [arrived_at, GPU seconds left]
    lease: Grant | None = None
    waiting: bool = False
    joined: bool = False
    ready_at: float = 0.0  # a displaced turn's memory is back
    idle_since: float = 0.0
    drop_at: float | None = None
    yield_idle_s: float | None = None
    busy_s: float = 0.0  # GPU time it got (what its shim measures: time with work running)
    done_s: float = 0.0  # GPU work done
    reported_at: float = -1.0
    latencies: list = field(default_factory=list)
    turns: list = field(default_factory=list)  # grant times of its turns
    done_by_window: dict = field(default_factory=dict)

    @property
    def busy_alone(self) -> float:
        """Its busy fraction alone on the GPU."""
        if self.kind == "service":
            return min(1.0, self.b / self.a)
        if self.kind == "duty":
            return self.b
        return self.a / (self.a + self.b)

    def arrive(self, now: float) -> None:
        if now < self.start:
            return
        if self.kind == "service":
            while self.next_arrival <= now:
                self.pending.append([self.next_arrival, self.b])
                self.next_arrival += self.a
        elif not self.pending and self.next_arrival is not None and self.next_arrival <= now:
            self.pending.append([now, self.a])  # a step, a cell, a burst: after the last pause
            self.next_arrival = None

    def work(self, now: float, amount: float) -> None:
        job = self.pending[0]
        job[1] -= amount
        self.done_s += amount
        window = int(now // WINDOW_S)
        self.done_by_window[window] = self.done_by_window.get(window, 0.0) + amount
        self.idle_since = now
        if job[1] <= 1e-9:
            self.latencies.append(now - job[0])
            self.pending.pop(0)
            if self.kind == "duty":
                self.next_arrival = now + self.a * (1 - self.b) / self.b
            elif self.kind != "service":
                self.next_arrival = now + self.b


def parse_client(number: int, spec: str) -> Client:
    rest, _, weight = spec.partition("*")
    rest, _, start = rest.partition("+")
    shape, _, memory = rest.partition("@")
    kind, *numbers = shape.split(":")
    if kind not in KINDS:
        raise ValueError(f"{spec!r}: no kind {kind!r} (kinds: {', '.join(KINDS)})")
    if len(numbers) not in (0, 2):
        raise ValueError(f"{spec!r}: give both of {kind}'s numbers, or neither")
    try:
        a, b = (float(n) for n in numbers) if numbers else KINDS[kind]
        gib = float(memory) if memory else 1.0
        begins = float(start) if start else 0.0
        weighs = int(weight) if weight else 1
    except ValueError:
        raise ValueError(f"{spec!r}: not a number") from None
    if not (a > 0 and b >= 0 and gib >= 0 and begins >= 0 and weighs >= 1) or (
        kind in ("service", "duty") and b <= 0
    ):
        raise ValueError(f"{spec!r}: times must be positive, memory not negative")
    if kind == "duty" and b > 1:
        raise ValueError(f"{spec!r}: a duty's busy fraction is at most 1")
    # Each its own phase (seeded by its number): clients begun together are not in step.
    phase = random.Random(number).uniform(0, a * (1 - b) / b) if kind == "duty" else 0.0
    return Client(number, kind, a, b, int(gib * GIB), begins, weighs, next_arrival=begins + phase)


def ideal_run(specs: list[str], seconds: float) -> list[Client]:
    """The ideal: the same clients on a fluid GPU with no memory limit and no cost to
    interleaving, where in every step each client with work gets its weight's part of
    the GPU (generalized processor sharing: weighted max-min at every instant)."""
    clients = [parse_client(n + 1, spec) for n, spec in enumerate(specs)]
    for step in range(1, round(seconds / STEP_S) + 1):
        now = step * STEP_S
        for c in clients:
            c.arrive(now)
        running = [c for c in clients if c.pending]
        weights = sum(c.weight for c in running)
        for c in running:
            c.busy_s += STEP_S
            c.work(now, STEP_S * c.weight / weights)
    return clients


def simulate(
    specs: list[str],
    seconds: float,
    settings: Settings,
    gpu_gib: float,
    swap_s: float = 0.0,
    same_user: bool = False,
) -> dict:
    clients = [parse_client(n + 1, spec) for n, spec in enumerate(specs)]
    uid = {c.number: 1000 if same_user else 1000 + c.number for c in clients}
    shares = tuple(
        (f"user:{uid[c.number]}", Share(weight=c.weight)) for c in clients if c.weight > 1
    )
    settings = settings.replaced(shares=shares) if shares else settings
    core = Scheduler(settings)
    core.add_gpu(GPU, "simulated", int(gpu_gib * GIB))
    by_number = {c.number: c for c in clients}
    idle_while_one_could_run = 0.0
    gpu = core.gpus[GPU]

    def join(c: Client, now: float) -> None:
        c.joined = True
        # A newcomer's report moves the GPU's figures: what the rules do then is carried
        # out (a grant made here was once lost, and its client counted idle for good).
        carry_out(
            core.connect(c.number, pid=100 + c.number, uid=uid[c.number], gid=1000, now=now)
            + core.hello(c.number, (GPU,), c.kind, now=now, features=FEATURE_YIELD | FEATURE_USAGE)
            + core.memory_report(c.number, GPU, c.memory_bytes, 0, now=now),
            now,
        )

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
            if not c.joined and now >= c.start:
                join(c, now)
            c.arrive(now)
        running = [
            c
            for c in clients
            if c.lease is not None
            and c.pending
            and now >= c.ready_at
            and (c.drop_at is None or now < c.drop_at)
        ]
        if running:
            efficiency = 1.0 if len(running) == 1 else INTERLEAVED_EFFICIENCY
            for c in running:
                c.busy_s += STEP_S  # its shim counts all the time it has work on the GPU
                c.work(now, STEP_S * efficiency / len(running))
        elif any(
            c.pending
            and c.joined
            and c.lease is None
            and core.policy.fits(gpu, [*gpu.holders, c.number], keeping=False)
            for c in clients
        ):
            idle_while_one_could_run += STEP_S
        for c in clients:
            if c.lease is None:
                continue
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
        deadline = core.next_deadline()
        if deadline is not None and deadline <= now:
            carry_out(core.tick(now), now)
    ideal = ideal_run(specs, seconds)
    return {
        "seconds": seconds,
        "idle_while_one_could_run_s": idle_while_one_could_run,
        "clients": {f"{c.number} {c.kind}": figures(c, i, seconds) for c, i in zip(clients, ideal)},
    }


def figures(c: Client, ideal: Client, seconds: float) -> dict:
    """Its figures, and its work against the ideal's (ideal_run): over the run, and over
    every whole window WINDOW_S once it has been there SETTLE_S."""
    ordered = sorted(c.latencies)
    turns = [b - a for a, b in zip(c.turns, c.turns[1:])]

    def at(fraction):
        return (
            ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]
            if ordered
            else None
        )

    ratios = [
        c.done_by_window.get(window, 0.0) / owed
        for window, owed in ideal.done_by_window.items()
        if window * WINDOW_S >= c.start + SETTLE_S
        and (window + 1) * WINDOW_S <= seconds
        and owed > 1e-6
    ]
    return {
        "share": c.done_s / seconds,
        "ideal": ideal.done_s / seconds,
        "of_ideal": c.done_s / ideal.done_s if ideal.done_s > 1e-6 else 1.0,
        "worst_window_of_ideal": min(ratios) if ratios else None,
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
        "| client | share | ideal | of ideal (worst 10 s) | done | p50 / p99 / max (s) | turn grants |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, f in result["clients"].items():
        lines.append(
            f"| {name} | {100 * f['share']:.1f} % | {100 * f['ideal']:.1f} % | "
            f"{s(f['of_ideal'])} ({s(f['worst_window_of_ideal'])}) | {f['done']} | "
            f"{s(f['p50_s'])} / {s(f['p99_s'])} / {s(f['max_s'])} | {f['turns']} |"
        )
    idle = result["idle_while_one_could_run_s"] / result["seconds"]
    lines.append(
        f"GPU idle while work that fits waited: {100 * idle:.1f} % of {result['seconds']:g} s"
    )
    return lines


# ---------------------------------------------------------------- the random sweep


def random_mix(rng: random.Random) -> tuple[list[str], float, str]:
    """2-8 clients, 5-100 % busy, bursts 1 ms-2 s, memory that fits all, some pairs or
    one at a time, weights 1-4, arrivals in the first 10 s; and the GPU's memory."""
    n = rng.randint(2, 8)
    gpu_gib = 80.0
    staging = rng.choice(("all", "pairs", "one"))
    gib = {"all": 60.0 / n, "pairs": 30.0, "one": 60.0}[staging]
    specs = []
    for _ in range(n):
        burst = 10 ** rng.uniform(-3, 0.3)  # 1 ms .. 2 s
        busy = rng.uniform(0.05, 1.0)
        kind = f"duty:{burst:.4f}:{busy:.3f}" if busy < 0.98 else f"trainer:{burst:.4f}:0.0005"
        start = rng.choice((0.0, rng.uniform(0, 10)))
        specs.append(f"{kind}@{gib:.1f}+{start:.2f}*{rng.randint(1, 4)}")
    return specs, gpu_gib, staging


def judged(specs: list[str], staging: str, result: dict, gpu_gib: float) -> dict:
    """The sweep's verdict on one mix: the worst client against its ideal, over the run
    and over any window; the most any policy could give it (policy_ceiling: where memory
    keeps clients apart); and the idle GPU."""
    clients = list(result["clients"].values())
    played = [parse_client(n + 1, spec) for n, spec in enumerate(specs)]
    sets = fitting_sets([c.memory_bytes for c in played], int(gpu_gib * GIB))
    # Each one's busy fraction alone as the clock of 1 ms steps plays it (a 1 ms step
    # and a 0.5 ms pause take two steps), over the time it is there.
    seconds = result["seconds"]
    busy = [
        ideal_run([spec], seconds)[0].done_s / max(seconds - c.start, STEP_S)
        for spec, c in zip(specs, played)
    ]
    _, most = ceiling([f["ideal"] for f in clients], busy, sets)
    return {
        "specs": specs,
        "staging": staging,
        "ceiling": most,
        "worst_of_ideal": min(f["of_ideal"] for f in clients),
        "worst_window": min(
            (f["worst_window_of_ideal"] for f in clients if f["worst_window_of_ideal"] is not None),
            default=None,
        ),
        "idle": result["idle_while_one_could_run_s"] / result["seconds"],
    }


def sweep(count: int, seconds: float, settings: Settings, seed: int) -> list[dict]:
    rng = random.Random(seed)
    verdicts = []
    for _ in range(count):
        specs, gpu_gib, staging = random_mix(rng)
        result = simulate(specs, seconds, settings, gpu_gib)
        verdicts.append(judged(specs, staging, result, gpu_gib))
    return verdicts


# What the sweep holds each mix to: every client's GPU time at least this much of its
# ideal's where all fit, and where turns are needed (issue 44).
BAR = {"all": 0.9, "pairs": 0.8, "one": 0.8}


def sweep_lines(verdicts: list[dict]) -> list[str]:
    worst = sorted(verdicts, key=lambda v: v["worst_of_ideal"] / BAR[v["staging"]])[:10]
    idle = max(v["idle"] for v in verdicts)
    lines = [
        f"{len(verdicts)} mixes; the GPU idle while work that fits waited at most {100 * idle:.2f} %"
    ]
    for staging, bar in BAR.items():
        mixes = [v for v in verdicts if v["staging"] == staging]
        reachable = [v for v in mixes if v["ceiling"] >= bar]
        below = sum(v["worst_of_ideal"] < bar for v in reachable)
        worst_of_ceiling = [v["worst_of_ideal"] / v["ceiling"] for v in mixes]
        lines.append(
            f"  memory fitting {staging}: {len(mixes)} mixes; {len(mixes) - len(reachable)} "
            f"out of reach (no policy gives every client {bar}x its ideal); of the rest, "
            f"{below} with a client under it; median worst client / ideal "
            f"{statistics.median(v['worst_of_ideal'] for v in mixes):.2f}, / the most any "
            f"policy could give it {statistics.median(worst_of_ceiling):.2f}"
            if mixes
            else f"  memory fitting {staging}: no mixes"
        )
    lines.append(
        "ten worst (worst client's GPU time / its ideal, the most any policy could give, "
        "worst 10 s window, idle %, mix):"
    )
    for v in worst:
        window = "-" if v["worst_window"] is None else f"{v['worst_window']:.2f}"
        lines.append(
            f"  {v['worst_of_ideal']:.2f}  {v['ceiling']:.2f}  {window}  {100 * v['idle']:.2f}  "
            f"{v['staging']}: " + " ".join(v["specs"])
        )
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="policy_sim", description=__doc__.split("\n\n")[0])
    parser.add_argument("clients", nargs="*", help="KIND[:A:B][@GIB][+START][*WEIGHT]")
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--gpu-gib", type=float, default=80.0, help="the GPU's memory")
    parser.add_argument("--tq", type=int, default=30, help="time quantum, seconds")
    parser.add_argument("--anti-thrash", choices=[m.value for m in AntiThrash], default="auto")
    parser.add_argument("--swap-s", type=float, default=0.0, help="a displaced turn's prefetch")
    parser.add_argument("--same-user", action="store_true", help="one share group for all")
    parser.add_argument("--sweep", type=int, default=0, help="N random mixes against the ideal")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if not (args.seconds > 0 and args.gpu_gib > 0 and args.tq > 0 and args.swap_s >= 0):
        sys.exit(
            "policy_sim: --seconds, --gpu-gib and --tq must be positive, --swap-s not negative"
        )
    if not args.clients and not args.sweep:
        sys.exit("policy_sim: name clients, or --sweep N")
    settings = Settings(time_quantum_s=args.tq, anti_thrash=AntiThrash(args.anti_thrash))
    if args.sweep:
        print("\n".join(sweep_lines(sweep(args.sweep, args.seconds, settings, args.seed))))
        return
    try:
        result = simulate(
            args.clients, args.seconds, settings, args.gpu_gib, args.swap_s, args.same_user
        )
    except ValueError as error:
        sys.exit(f"policy_sim: {error}")
    print("\n".join(printed(result)))


if __name__ == "__main__":
    main()
