"""The most of its ideal that any scheduler can give a mix's worst-served client when memory
keeps some clients apart: policy_sim's sweep judges a policy against it.

policy_sim's ideal (ideal_run) shares a fluid GPU by weight and ignores memory.  Clients
whose memory does not fit together cannot run at once without paging each other out, and a
client running without the others keeps the GPU busy at most its busy fraction alone (a
burst, then host time: the GPU idles in the gaps).  So the best any schedule can do is a
max-min linear programme over the sets S of clients that fit together: S runs t_S of the
time, and in it each member i does x_i <= b_i t_S of work, together at most t_S (b_i: its
busy fraction alone, or, where bringing back what another pushes out is shorter than its
pauses, a burst per burst and prefetch; 1 for a client whose work arrives on its own
clock, a server, which may have a backlog to run back to back: the caller's figures):

    maximise lambda:  every client's work >= lambda x its ideal share d_i.

Any prices y >= 0 with sum(y_i d_i) = 1 bound it from above (weak duality):
lambda <= max over S of the most that one unit of S's time earns at prices y, which a
greedy fill finds (the dearest member first, each up to b_i, until the unit is used).
Multiplicative weights search the prices and, on the way, build a schedule that reaches a
lower bound; the two close in on lambda.  The upper one is the ceiling: no policy beats it
(it ignores arrival times, prefetches and the cost of interleaving, which only lower what
can be had)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from nvshare_agent import memory_fit

ROUNDS = 4000
STEP = 0.05


def fitting_sets(memory_bytes: Sequence[int], capacity_bytes: int) -> list[tuple[int, ...]]:
    """The largest sets of clients (by index) whose memory fits the GPU at once, as the
    agent counts it (memory_fit: each one's context too, and the others' contexts that stay
    resident); the looser of its two lines, so that the bound stays a bound."""
    everyone = range(len(memory_bytes))
    context = memory_fit.resident_demand(0, 0, None)
    fitting = [(i,) for i in everyone]  # alone, anyone runs
    for size in range(2, len(memory_bytes) + 1):
        for members in itertools.combinations(everyone, size):
            running = sum(memory_fit.client_demand(memory_bytes[i], 0, None) for i in members)
            demand = running + context * (len(memory_bytes) - size)
            if memory_fit.fits(True, demand, capacity_bytes):
                fitting.append(members)
    return [s for s in fitting if not any(set(s) < set(t) for t in fitting)]


def smallest_push_out(memory_bytes: Sequence[int], capacity_bytes: int, i: int) -> int | None:
    """The least of client i's memory that running any client it does not fit beside
    pushes out of the GPU (what i must bring back after), as fitting_sets counts memory;
    None where it fits beside every other client (it never has to)."""
    context = memory_fit.resident_demand(0, 0, None)
    line = capacity_bytes - memory_fit.reserve(capacity_bytes)
    pushed = []
    for j in range(len(memory_bytes)):
        if j == i:
            continue
        demand = sum(memory_fit.client_demand(memory_bytes[k], 0, None) for k in (i, j))
        demand += context * (len(memory_bytes) - 2)
        if not memory_fit.fits(True, demand, capacity_bytes):
            pushed.append(min(memory_bytes[i], demand - line))
    return min(pushed) if pushed else None


def _best_unit(sets, prices, busy) -> tuple[float, tuple[int, ...], dict[int, float]]:
    """The set whose unit of time earns the most at these prices, its earning and its fill."""
    best = (-1.0, (), {})
    for members in sets:
        left, earned, fill = 1.0, 0.0, {}
        for i in sorted(members, key=lambda i: -prices[i]):
            fill[i] = min(busy[i], left)
            earned += prices[i] * fill[i]
            left -= fill[i]
        if earned > best[0]:
            best = (earned, members, fill)
    return best


def ceiling(
    ideal: Sequence[float], busy: Sequence[float], sets: list[tuple[int, ...]]
) -> tuple[float, float]:
    """(lower, upper) bounds of lambda above, each capped at 1: a schedule that reaches
    the lower exists; none reaches past the upper.  Clients with no ideal share (the run
    ended before they came) are left out."""
    wanted = [i for i, d in enumerate(ideal) if d > 1e-9]
    if not wanted:
        return 1.0, 1.0
    sets = [s for s in (tuple(i for i in s if i in wanted) for s in sets) if s]
    # Prices start where each client's full share is worth the same; a client's price falls
    # by the part of its share one unit served it, scaled so that no step moves it far.
    width = max(min(busy[i], 1.0) / ideal[i] for i in wanted)
    prices = {i: 1.0 / ideal[i] for i in wanted}
    served = dict.fromkeys(wanted, 0.0)
    upper = math.inf
    for _ in range(ROUNDS):
        scale = sum(prices[i] * ideal[i] for i in wanted)
        prices = {i: p / scale for i, p in prices.items()}
        earned, _, fill = _best_unit(sets, prices, busy)
        upper = min(upper, earned)
        for i, x in fill.items():
            served[i] += x
            prices[i] *= 1.0 - STEP * (x / ideal[i]) / width
    lower = min(served[i] / (ROUNDS * ideal[i]) for i in wanted)
    return min(lower, 1.0), min(upper, 1.0)
