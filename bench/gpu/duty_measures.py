"""Issue 44's shapes f and g (duty.py), pure: the plan of runs and their time budget, the
arguments, each process's rate over a window, fair shares (the targets and the printed
table are duty_table.py's).  No GPU, no processes, no PyTorch.

Roles: `d10`..`d70` a duty process (30 ms bursts, busy that percentage of the time alone;
`d30_3` is the third of eight), `trainer` the always-busy trainer, `loader` the
loader-bound trainer (60 ms of GPU work, then 90 ms waiting for its next batch),
`pipeline` a two-stage pipeline (its rate: items out of stage two)."""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass

PARTS = ("f4", "f8", "g_loader", "g_pipe")
BURST_MS = 30.0
DUTY_SETS = {"f4": (10, 30, 50, 70), "f8": (30,) * 8}
LOADER_BURST_MS, LOADER_GAP_MS = 60.0, 90.0
STAGE_MS = 20.0  # each pipeline stage's GPU work per item
PIPE_QUEUES = {"unbounded": 0, "bounded": 2}  # multiprocessing.Queue's maxsize (0: none)
ORDERS = {"busy_first": ("trainer", "loader"), "loader_first": ("loader", "trainer")}
ENVS = ("plain", "nvshare")  # without nvshare (the driver's time-slicing), under the shim
TOLERANCE = 0.95  # each process's target: this much of its reference rate
# Timings of a run, for the plan and the budget (measured on nothing yet: estimates).
ARRIVAL_GAP_S = 3.0  # g: the second process's release after the first one's first step
WARMUP_S, SOLO_WARMUP_S = 2.0, 1.0
SOLO_WINDOW_S = 3.0  # a process alone is regular: its rate settles in a few cycles
# The pipeline's window, of --window: ~25 items a second are as many in 10 s as a 10 % duty
# process's bursts in 75 s, and the 20 s saved keep the default run under 7 minutes.
PIPE_WINDOW_FRACTION = 2 / 3
TAIL_S = 0.5  # past a window's end, so each process completes once after it
SET_UP_S = 2.0  # release to first unit: CUDA context, cuBLAS, the first burst
STOP_S = 1.0  # SIGTERM to its JSON line: the burst under way, the context's end
AGENT_S = 1.0
# Every process of the whole run imports torch at the start, together (3-5 s each alone).
IMPORT_BASE_S, IMPORT_PER_PROCESS_S = 5.0, 0.2
DEFAULT_WINDOW_S = 15.0
# A run that would end past this is skipped: the device's command limit is 480 s, and the
# shim's make, the last run's overrun and the table come on top.
DEFAULT_BUDGET_S = 440.0


def base_role(role: str) -> str:
    """`d30_3` -> `d30`: the role whose solo run stands for it."""
    return role.split("_")[0]


def role_shape(role: str) -> dict:
    """What a role's process does: its kind and GPU time per unit (burst, step, item)."""
    role = base_role(role)
    if role.startswith("d") and role[1:].isdigit():
        return {"kind": "bursts", "burst_ms": BURST_MS, "duty": int(role[1:]) / 100}
    if role == "loader":
        return {"kind": "bursts", "burst_ms": LOADER_BURST_MS, "gap_ms": LOADER_GAP_MS}
    if role == "trainer":
        return {"kind": "trainer"}
    if role == "pipeline":
        return {"kind": "pipeline", "burst_ms": STAGE_MS}
    raise ValueError(f"no role {role!r}")


def duty_roles(part: str) -> list[str]:
    duties = DUTY_SETS[part]
    if len(set(duties)) == len(duties):
        return [f"d{duty}" for duty in duties]
    return [f"d{duty}_{index + 1}" for index, duty in enumerate(duties)]


@dataclass(frozen=True)
class RunPlan:
    """One run: its processes, released stage by stage.  A stage is (window, roles): the
    roles are released and waited for (their first unit), then the window is measured
    after a warm-up; a stage with no window waits ARRIVAL_GAP_S instead."""

    part: str
    name: str  # "d10" (solo), "plain", "busy_first/nvshare", ...
    env: str  # "plain" or "nvshare"
    stages: tuple[tuple[str | None, tuple[str, ...]], ...]
    queue_size: int = 0  # g_pipe

    @property
    def roles(self) -> list[str]:
        return [role for _, roles in self.stages for role in roles]

    @property
    def key(self) -> str:
        return f"{self.part}/{self.name}"


def solo_roles(parts: list[str]) -> list[str]:
    """The roles to run alone for these parts, a bursts process first: it sizes the bursts
    (ms per matrix product) for every later process."""
    needed: list[str] = []
    for part in parts:
        if part in DUTY_SETS:
            needed += [base_role(role) for role in duty_roles(part)] + ["trainer"]
        elif part == "g_loader":
            needed += ["trainer", "loader"]
    roles = list(dict.fromkeys(needed))
    bursts = [role for role in roles if role_shape(role)["kind"] == "bursts"]
    if not bursts:
        return ["d30", *roles]  # g_pipe alone: sizing only
    return [bursts[0], *[role for role in roles if role != bursts[0]]]


def plan(parts: list[str]) -> list[RunPlan]:
    runs = [RunPlan("solo", role, "plain", (("alone", (role,)),)) for role in solo_roles(parts)]
    for part in parts:
        for env in ENVS if part in DUTY_SETS else ():
            stages = (("alone", tuple(duty_roles(part))), ("beside_trainer", ("trainer",)))
            runs.append(RunPlan(part, env, env, stages))
        for order, (first, second) in ORDERS.items() if part == "g_loader" else ():
            for env in ENVS:
                stages = ((None, (first,)), ("both", (second,)))
                runs.append(RunPlan(part, f"{order}/{env}", env, stages))
        for queue, size in PIPE_QUEUES.items() if part == "g_pipe" else ():
            for env in ENVS:
                runs.append(RunPlan(part, f"{queue}/{env}", env, (("both", ("pipeline",)),), size))
    return runs


def window_length_s(run: RunPlan, window_s: float) -> float:
    if run.part == "solo":
        return min(SOLO_WINDOW_S, window_s)
    return window_s * PIPE_WINDOW_FRACTION if run.part == "g_pipe" else window_s


def planned_run_s(run: RunPlan, window_s: float) -> float:
    """A run's estimated wall time: each stage's set-up and window (or arrival gap), the stop."""
    warmup = SOLO_WARMUP_S if run.part == "solo" else WARMUP_S
    seconds = STOP_S + (AGENT_S if run.env == "nvshare" else 0.0)
    for window, _ in run.stages:
        seconds += SET_UP_S
        seconds += (
            ARRIVAL_GAP_S if window is None else warmup + window_length_s(run, window_s) + TAIL_S
        )
    return seconds


def process_count(runs: list[RunPlan]) -> int:
    """Python processes the run starts: a pipeline is two."""
    return sum(1 + (role == "pipeline") for run in runs for role in run.roles)


def planned_seconds(runs: list[RunPlan], window_s: float) -> dict[str, float]:
    """Estimated wall time per part (the imports under "imports") and in all ("total")."""
    planned = {"imports": IMPORT_BASE_S + IMPORT_PER_PROCESS_S * process_count(runs)}
    for run in runs:
        planned[run.part] = planned.get(run.part, 0.0) + planned_run_s(run, window_s)
    planned["total"] = sum(planned.values())
    return planned


# ---------------------------------------------------------------------------- arguments


def parse_only(text: str) -> list[str]:
    """`f4,g_pipe` -> the parts in their fixed order; an unknown one is a one-line error."""
    named = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [part for part in named if part not in PARTS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"no part {', '.join(unknown)} (parts: {', '.join(PARTS)})"
        )
    if not named:
        raise argparse.ArgumentTypeError("name at least one part")
    return [part for part in PARTS if part in named]


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return value


def parse_args(
    argv: list[str] | None, default_results: str, default_only: str = ""
) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="duty", description="issue 44's shapes f and g on one GPU"
    )
    parser.add_argument("results", nargs="?", default=default_results, help="folder for duty.json")
    parser.add_argument(
        "--window", type=positive_seconds, default=DEFAULT_WINDOW_S, help="seconds measured per run"
    )
    parser.add_argument(
        "--only",
        type=parse_only,
        default=parse_only(default_only) if default_only else list(PARTS),
        help=f"parts to run, comma-separated: {','.join(PARTS)} (all by default)",
    )
    parser.add_argument(
        "--budget",
        type=positive_seconds,
        default=DEFAULT_BUDGET_S,
        help="wall seconds: a run that would end past it is skipped, and said so",
    )
    parser.add_argument(
        "--plan", action="store_true", help="print the runs and their time, run nothing"
    )
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------- arithmetic


def products_for(burst_ms: float, ms_per_product: float) -> int:
    """Matrix products that make a burst of burst_ms on this GPU (at least one)."""
    return max(1, round(burst_ms / ms_per_product))


def rate_over(done_at: list[float], start: float, end: float) -> float:
    """Units per second over [start, end]: counted between the last completion at or before
    start and the first at or after end, so a regular process's rate is exact whatever its
    phase, and a stall at either edge counts in full.  Without completions on both sides,
    the completions inside the window over its length."""
    before = [t for t in done_at if t <= start]
    after = [t for t in done_at if t >= end]
    if not before or not after:
        inside = sum(start < t <= end for t in done_at)
        return inside / (end - start) if end > start else math.nan
    first, last = max(before), min(after)
    return sum(first < t <= last for t in done_at) / (last - first)


def figures_over(output: dict, start: float, end: float) -> dict:
    """A process's rate over a window, its units inside it, and their median GPU time."""
    done_at, gpu_ms = output.get("done_at", []), output.get("gpu_ms", [])
    inside = [ms for t, ms in zip(done_at, gpu_ms) if start < t <= end]
    return {
        "rate": rate_over(done_at, start, end),
        "units": len(inside),
        "gpu_ms": statistics.median(inside) if inside else math.nan,
    }


def demand(solo: dict) -> float:
    """The fraction of the GPU a process keeps busy alone: its GPU time per unit times its
    rate (an always-busy trainer ~1)."""
    return min(1.0, max(0.0, solo["gpu_ms"] * solo["rate"] / 1000))


def max_min_shares(demands: list[float], capacity: float = 1.0) -> list[float]:
    """Max-min fair shares of one GPU: each gets what it asks up to an equal split of what
    is left, the rest going to those who ask more."""
    shares = [0.0] * len(demands)
    left = capacity
    order = sorted(range(len(demands)), key=lambda index: demands[index])
    for taken, index in enumerate(order):
        shares[index] = min(demands[index], left / (len(demands) - taken))
        left -= shares[index]
    return shares


def fair_rates(roles: list[str], solo: dict[str, dict]) -> dict[str, float]:
    """Each role's rate at its max-min fair share of the GPU among these roles."""
    demands = [demand(solo[base_role(role)]) for role in roles]
    shares = max_min_shares(demands)
    return {
        role: solo[base_role(role)]["rate"] * (share / asked if asked > 0 else 1.0)
        for role, asked, share in zip(roles, demands, shares)
    }


def sizing(ms_per_product: float | None) -> dict:
    """What the first solo run measured, and the products each kind of burst got from it."""
    if ms_per_product is None:
        return {"ms_per_product": None}
    burst_ms = {"duty": BURST_MS, "loader": LOADER_BURST_MS, "pipeline stage": STAGE_MS}
    return {
        "ms_per_product": ms_per_product,
        "products": {name: products_for(ms, ms_per_product) for name, ms in burst_ms.items()},
    }
