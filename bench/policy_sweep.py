"""policy_sim's random sweep (`policy_sim.py --sweep N`): mixes drawn as issue 44 names
them, each played through policy_sim.simulate and judged against its ideal and against the
most any policy could give it (policy_ceiling)."""

from __future__ import annotations

import random
import statistics

from policy_ceiling import ceiling, fitting_sets, smallest_push_out
from policy_sim import GIB, STEP_S, WINDOW_S, ideal_run, judged_windows, parse_client, simulate

from nvshare_agent.settings import Settings


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


def judged(
    specs: list[str], staging: str, result: dict, gpu_gib: float, prefetch_bytes_per_s: float
) -> dict:
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
    # Or, where its pauses are longer than bringing back what another pushes out, it may
    # give the GPU up in each and prefetch that back for its next burst.  A server's work
    # comes on its own clock: with a backlog it may run back to back.
    memory = [c.memory_bytes for c in played]
    for i, c in enumerate(played):
        pushed = smallest_push_out(memory, int(gpu_gib * GIB), i)
        if c.kind == "service":
            busy[i] = 1.0
        elif pushed is not None:
            busy[i] = max(busy[i], c.a / (c.a + pushed / prefetch_bytes_per_s))
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


def arrivals_reversed(specs: list[str]) -> list[str]:
    """The same clients arriving in the reverse order: the list reversed (who joins first
    in one step) and each taking the arrival time of its mirror (the last comes first)."""
    parts = [spec.partition("+") for spec in specs]
    starts = [rest.partition("*")[0] for _, _, rest in parts]
    return [
        f"{head}+{start}{rest[len(own) :]}"
        for (head, _, rest), own, start in zip(parts, starts, reversed(starts))
    ][::-1]


def shares_once_all_came(result: dict, specs: list[str]) -> list[float]:
    """Each client's part of the GPU's work over the whole windows that begin SETTLE_S
    after the last arrival, in the order of specs."""
    last = max(parse_client(n + 1, spec).start for n, spec in enumerate(specs))
    windows = judged_windows(last, result["seconds"])
    return [
        sum(f["done_by_window"].get(w, 0.0) for w in windows) / (len(windows) * WINDOW_S)
        if windows
        else 0.0
        for f in result["clients"].values()
    ]


def sweep(
    count: int, seconds: float, settings: Settings, seed: int, paging: dict, reverse=False
) -> list[dict]:
    """count random mixes, each played for `seconds` (paging: simulate's page-in rates);
    reverse: each again with its arrivals reversed, and how far any client's share moved."""
    rng = random.Random(seed)
    verdicts = []
    for _ in range(count):
        specs, gpu_gib, staging = random_mix(rng)
        result = simulate(specs, seconds, settings, gpu_gib, **paging)
        verdicts.append(judged(specs, staging, result, gpu_gib, paging["prefetch_bytes_per_s"]))
        if reverse:
            other = arrivals_reversed(specs)
            again = simulate(other, seconds, settings, gpu_gib, **paging)
            before = shares_once_all_came(result, specs)
            after = shares_once_all_came(again, other)[::-1]
            verdicts[-1]["order_move"] = max(abs(a - b) for a, b in zip(before, after))
    return verdicts


# What the sweep holds each mix to: every client's GPU time at least this much of its
# ideal's where all fit, and where turns are needed (issue 44); and, arrivals reversed,
# no client's share moved by more than this (5 points).
BAR = {"all": 0.9, "pairs": 0.8, "one": 0.8}
ORDER_MOVE_BAR = 0.05


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
    moves = [v for v in verdicts if "order_move" in v]
    if moves:
        most = max(moves, key=lambda v: v["order_move"])
        lines.append(
            f"arrivals reversed: the largest move of a client's share once all have come, "
            f"median {100 * statistics.median(v['order_move'] for v in moves):.1f} points; "
            f"{sum(v['order_move'] > ORDER_MOVE_BAR for v in moves)} of {len(moves)} mixes "
            f"over {100 * ORDER_MOVE_BAR:g}; the most {100 * most['order_move']:.1f} "
            f"({most['staging']}: " + " ".join(most["specs"]) + ")"
        )
        for staging in BAR:
            some = [v["order_move"] for v in moves if v["staging"] == staging]
            if some:
                lines.append(
                    f"  memory fitting {staging}: {sum(m > ORDER_MOVE_BAR for m in some)} of "
                    f"{len(some)} over {100 * ORDER_MOVE_BAR:g} points, median "
                    f"{100 * statistics.median(some):.1f}"
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
