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
  paced[:BURST:BUSY]     a burst every BURST / BUSY seconds by the clock (0.03, 0.3): a burst
                         that ends late is followed at once, never caught up on, as the GPU
                         bench's duty processes (bench/gpu/duty_client.py) and frame-paced work

The clients play their shims as docs/scheduling.md describes them: ask for the lock with
work, report GPU time every 100 ms, give it back once idle idle_release_ms, when asked to
drop (after their work in flight, DRAIN_S), when asked to yield (once idle that long).

The GPU (calibrated on the H100 and H200, docs/benchmarks.md): in each step every holder
with work gets an equal slice of it, as the driver's time-slicing gives, and the GPU does
INTERLEAVED_EFFICIENCY of its work while two or more contexts have work (two trainers
time-sliced: 0.91x of one alone).  Its memory holds what fits (memory_fit's reserve and
each client's context aside): a holder about to run whose memory was evicted for others
waits while it comes back, prefetched where its grant said DISPLACED, else by faults
(--prefetch-gbps, --fault-gbps), evicting the least recently run.  The ideal (ideal_run)
plays the same clients on a fluid GPU: no memory limit, no cost to interleaving, each
client with work its weight's part of every step (weighted max-min at every instant).
Where memory keeps clients apart, the sweep (policy_sweep.py) also judges each mix against
the most any policy could give it (policy_ceiling.py).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from dataclasses import dataclass, field

from fair_page_model import FairPage

from nvshare_agent import memory_fit
from nvshare_agent.actions import AskToDrop, Grant
from nvshare_agent.core_state import FEATURE_USAGE, FEATURE_YIELD
from nvshare_agent.scheduler import Scheduler
from nvshare_agent.settings import AntiThrash, Settings, Share

GPU = b"GPU-sim-0000000"
STEP_S = 0.001
REPORT_EVERY_S = 0.1  # the shim's GPU_USAGE frames come at most this often
DRAIN_S = 0.02  # asked to drop: its work in flight drains first
INTERLEAVED_EFFICIENCY = 0.91
# Managed memory evicted for another comes back at these rates (H100, docs/benchmarks.md):
# prefetched, when a grant says DISPLACED; else by page faults as the kernels touch it.
PREFETCH_BYTES_PER_S = 49e9
FAULT_BYTES_PER_S = 8.5e9
GIB = 1 << 30
KINDS = {
    "trainer": (0.1, 0.0005),
    "service": (0.05, 0.001),
    "notebook": (0.15, 1.5),
    "duty": (0.03, 0.3),
    "paced": (0.03, 0.3),
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
    requested_at: float = 0.0  # when it last asked for the GPU
    joined: bool = False
    ready_at: float = 0.0  # its memory is back (paged in)
    resident_bytes: int = 0  # of memory_bytes, what is on the GPU now
    touched: bool = False  # has run: what is not resident must be paged back in
    prefetches: bool = False  # its grant said DISPLACED: its shim prefetches
    prefetching: bool = False  # its page-in now is that prefetch (its gate not yet open)
    last_ran: float = -1.0
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
        if self.kind in ("duty", "paced"):
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
            elif self.kind == "paced":  # the next cycle's start, or at once when late
                self.next_arrival = max(now, job[0] + self.a / self.b)
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
        kind in ("service", "duty", "paced") and b <= 0
    ):
        raise ValueError(f"{spec!r}: times must be positive, memory not negative")
    if kind in ("duty", "paced") and b > 1:
        raise ValueError(f"{spec!r}: a duty's busy fraction is at most 1")
    # Each its own phase (seeded by its number): clients begun together are not in step.
    phase = random.Random(number).uniform(0, a * (1 - b) / b) if kind in ("duty", "paced") else 0.0
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
    same_user: bool = False,
    prefetch_bytes_per_s: float = PREFETCH_BYTES_PER_S,
    fair_page: bool = True,
    fault_bytes_per_s: float = FAULT_BYTES_PER_S,
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
    # What managed memory may be resident at once: the GPU less the reserve and every
    # client's context (memory_fit's figures).
    room_bytes = int(gpu_gib * GIB) - memory_fit.reserve(int(gpu_gib * GIB))

    def holdable(c: Client) -> int:
        """What of c's memory the GPU can hold at once (a client larger than the GPU pages
        itself, which is not modelled: it runs with what fits)."""
        contexts = memory_fit.CONTEXT_ESTIMATE_BYTES * sum(o.joined for o in clients)
        return max(0, min(c.memory_bytes, room_bytes - contexts))

    def page_in(c: Client, now: float) -> None:
        """c is to run but not all its memory is on the GPU: others' is evicted, the least
        recently run first (holders last), and c waits while its own comes back.  Memory
        never run on is created there: no copy."""
        contexts = memory_fit.CONTEXT_ESTIMATE_BYTES * sum(o.joined for o in clients)
        free = room_bytes - contexts - sum(o.resident_bytes for o in clients)
        missing = holdable(c) - c.resident_bytes
        for other in sorted(clients, key=lambda o: (o.lease is not None, o.last_ran)):
            if free >= missing:
                break
            if other is not c:
                evicted = min(other.resident_bytes, missing - free)
                other.resident_bytes -= evicted
                free += evicted
        brought = max(0, min(missing, free))
        rate = prefetch_bytes_per_s if c.prefetches else fault_bytes_per_s
        if c.touched:
            c.ready_at = now + brought / rate
        c.resident_bytes += brought
        c.touched, c.prefetching, c.prefetches = True, c.prefetches, False

    fair = FairPage() if fair_page else None

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
                if fair is not None:  # as its shim hears at the grant
                    fair.asked(client.number, client.requested_at)
                client.prefetches = action.displaced
                client.idle_since = now
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
        may_run = [
            c
            for c in clients
            if c.lease is not None and c.pending and (c.drop_at is None or now < c.drop_at)
        ]
        for c in may_run:
            if now >= c.ready_at and c.resident_bytes < holdable(c):
                page_in(c, now)
        running = [c for c in may_run if now >= c.ready_at]
        if fair is not None:  # the shims' fair page: held launches wait (fair_page_model)
            holding = [c for c in clients if c.lease is not None]
            fair.look(
                {c.number: c in running for c in holding},
                {c.number: c.weight for c in holding},
                now,
            )
            running = [c for c in running if fair.may_run(c.number, now)]
        for c in may_run:
            if now < c.ready_at:  # paging in: busy by its faulting kernels; its grant's
                c.busy_s += 0.0 if c.prefetching else STEP_S  # prefetch, before its gate
                c.idle_since = now  # opens, its shim does not count (usage_meter.c)
        if running:
            efficiency = 1.0 if len(running) == 1 else INTERLEAVED_EFFICIENCY
            for c in running:
                c.last_ran = now
                c.busy_s += STEP_S  # its shim counts all the time it has work on the GPU
                c.work(now, STEP_S * efficiency / len(running))
                if fair is not None:
                    fair.ran(c.number, STEP_S * efficiency / len(running), STEP_S)
        elif any(now >= c.ready_at for c in may_run) or any(
            c.pending
            and c.joined
            and c.lease is None
            and core.policy.fits(gpu, [*gpu.holders, c.number], keeping=False)
            for c in clients
        ):  # a holder with work held by the fair page, or a waiter that fits
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
                c.waiting, c.requested_at = True, now
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


def judged_windows(start: float, seconds: float) -> list[int]:
    """The whole windows of WINDOW_S in a run of `seconds` that begin SETTLE_S or more
    after `start`: those a share is judged over."""
    return [
        window
        for window in range(int(seconds // WINDOW_S))
        if window * WINDOW_S >= start + SETTLE_S and (window + 1) * WINDOW_S <= seconds
    ]


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

    owed = {w: ideal.done_by_window.get(w, 0.0) for w in judged_windows(c.start, seconds)}
    ratios = [c.done_by_window.get(w, 0.0) / owed[w] for w in owed if owed[w] > 1e-6]
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
        "done_by_window": dict(c.done_by_window),  # its GPU work in each WINDOW_S
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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="policy_sim", description=__doc__.split("\n\n")[0])
    parser.add_argument("clients", nargs="*", help="KIND[:A:B][@GIB][+START][*WEIGHT]")
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--gpu-gib", type=float, default=80.0, help="the GPU's memory")
    parser.add_argument("--tq", type=int, default=30, help="time quantum, seconds")
    parser.add_argument("--anti-thrash", choices=[m.value for m in AntiThrash], default="auto")
    parser.add_argument(
        "--prefetch-gbps", type=float, default=PREFETCH_BYTES_PER_S / 1e9, help="GB/s"
    )
    parser.add_argument("--fault-gbps", type=float, default=FAULT_BYTES_PER_S / 1e9, help="GB/s")
    parser.add_argument("--same-user", action="store_true", help="one share group for all")
    parser.add_argument(
        "--no-fair-page", action="store_true", help="holders interleave as the driver does"
    )
    parser.add_argument("--sweep", type=int, default=0, help="N random mixes against the ideal")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--reversed",
        action="store_true",
        help="with --sweep: each mix again with its clients arriving in the reverse order",
    )
    args = parser.parse_args(argv)
    rates = (args.prefetch_gbps, args.fault_gbps)
    if not (args.seconds > 0 and args.gpu_gib > 0 and args.tq > 0 and min(rates) > 0):
        sys.exit(
            "policy_sim: --seconds, --gpu-gib, --tq, --prefetch-gbps and --fault-gbps "
            "must be positive"
        )
    if not args.clients and not args.sweep:
        sys.exit("policy_sim: name clients, or --sweep N")
    settings = Settings(time_quantum_s=args.tq, anti_thrash=AntiThrash(args.anti_thrash))
    paging = {"prefetch_bytes_per_s": rates[0] * 1e9, "fault_bytes_per_s": rates[1] * 1e9}
    if args.sweep:
        from policy_sweep import sweep, sweep_lines  # it plays mixes through simulate()

        verdicts = sweep(args.sweep, args.seconds, settings, args.seed, paging, args.reversed)
        print("\n".join(sweep_lines(verdicts)))
        return
    try:
        result = simulate(
            args.clients,
            args.seconds,
            settings,
            args.gpu_gib,
            args.same_user,
            **paging,
            fair_page=not args.no_fair_page,
        )
    except ValueError as error:
        sys.exit(f"policy_sim: {error}")
    print("\n".join(printed(result)))


if __name__ == "__main__":
    main()
