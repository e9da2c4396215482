"""The node-mix benchmark's arithmetic (mix.py), pure: each client's figures over the
measured window, the memory_limit that stages each phase, the targets of issue 35 as
one table with their verdicts, and the printed table.  No GPU, no processes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpu_measures import bootstrap_95, percentile
from light import latency_summary
from multi_gpu import rate_between

from nvshare_agent import memory_fit

GIB, MIB = 1 << 30, 1 << 20
# Each client's footprint on the GPU (its allocations and CUDA context) when the solo phase
# did not measure it in this run: the trainer's reserved memory is ~3.5 GiB with its context
# (multi_gpu.py's plan), a light client's a few hundred MiB besides its ~500 MiB context.
DEFAULT_TRAINER_BYTES = 4 * GIB
DEFAULT_LIGHT_BYTES = 768 * MIB
# Kept between the staged line and either side of it: the agent's own figure for a client
# (managed + NVML's, or + CONTEXT_ESTIMATE_BYTES) differs from the footprint seen here.
STAGING_MARGIN_BYTES = 256 * MIB
# Below one trainer, as run.py's exclusive phases and issue 35's table stage it.
NOTHING_FITS_LIMIT_BYTES = GIB
TAILS = {"inference": 0.99, "loader": 0.99, "notebook": 0.95}
# A ratio of two latency figures is shown with its 95 % interval, from resampled latencies: a
# p99 over one 30 s window is the 7th slowest of ~600 requests, and the p99s of two runs of
# the same mix without nvshare in one call differed by up to 1.10x (H100, three calls).
RATIO_DRAWS = 2000
# Two runs without nvshare in one call: the second divided by the first is the noise floor.
NO_NVSHARE_TWICE = ("mix_off_vs_plain/plain", "mix_plain")


def trainer_figures(runs: list[dict], start: float, end: float) -> dict:
    """Each trainer's rate over the window (trainer, trainer_2, ...) and, with several, their
    aggregate and shares under "trainers"."""
    figures, counts = {}, []
    for index, run in enumerate(runs):
        inside = [t for t in run["step_times"] if start < t <= end]
        counts.append(len(inside))
        figures["trainer" if index == 0 else f"trainer_{index + 1}"] = {
            "steps_per_s": rate_between(run["step_times"], start, end),
            "steps": len(inside),
            "last_step_at": run["step_times"][-1],
        }
    if len(runs) > 1:
        figures["trainers"] = {
            "steps_per_s": sum(f["steps_per_s"] for f in figures.values()),
            "shares": [count / sum(counts) if sum(counts) else math.nan for count in counts],
        }
    return figures


def light_figures(name: str, output: dict) -> dict:
    """A light client's summary, recomputed from its latencies (the tail by its kind), and a
    notebook's by the size of its cells: its p50 over 15 and 150 ms cells at once is the
    slowest short cell or the fastest long one, whichever the draw gives (H200, one code
    and phase, two runs: 39 and 135 ms)."""
    summary = latency_summary(output["latencies_ms"], TAILS[name])
    kept = {
        key: value
        for key, value in output.items()
        if key not in ("p50_ms", "p99_ms", "p95_ms", "max_ms", "count", "by_cell_ms")
    }
    sizes = output.get("cell_ms")
    if sizes and len(sizes) == len(output["latencies_ms"]):
        summary["by_cell_ms"] = {
            size: latency_summary(
                [ms for ms, of in zip(output["latencies_ms"], sizes) if of == size], TAILS[name]
            )
            for size in sorted(set(sizes))
        }
    return {**kept, **summary}


def apart_memory_limit(trainer_bytes: int, light_bytes: list[int]) -> int:
    """memory_limit for two trainers that do not fit together while either fits beside all
    the light clients, by the agent's own rule (memory_fit): its line (capacity less the
    reserve) is put halfway between one trainer with the light ones (plus the hysteresis
    band, so it fits even from "does not fit") and two trainers alone."""
    light = sum(light_bytes)
    band = memory_fit.band(2 * trainer_bytes)
    low, high = trainer_bytes + light + band, 2 * trainer_bytes
    if high - low < 2 * STAGING_MARGIN_BYTES:
        raise ValueError(
            f"cannot stage two trainers apart: one trainer ({trainer_bytes >> 20} MiB) is not "
            f"{(light + band + 2 * STAGING_MARGIN_BYTES) >> 20} MiB more than the light clients"
        )
    line = (low + high) // 2
    capacity = line + memory_fit.RESERVE_MIN_BYTES
    if memory_fit.reserve(capacity) > memory_fit.RESERVE_MIN_BYTES:
        capacity = math.ceil(line / (1 - memory_fit.RESERVE_FRACTION))
    capacity = -(-capacity // MIB) * MIB  # whole MiB, as the config writes it
    line = capacity - memory_fit.reserve(capacity)
    assert trainer_bytes + light + memory_fit.band(capacity) <= line < 2 * trainer_bytes
    return capacity


def nothing_fits_memory_limit(trainer_bytes: int, light_bytes: list[int]) -> int:
    """memory_limit under which no trainer fits beside anything (its line is below one
    trainer alone) while the light clients fit together, so that light work is served in
    windows between a trainer's turns, all of it at once; NOTHING_FITS_LIMIT_BYTES when
    the light clients are too big for that (then each window serves one of them)."""
    light = sum(light_bytes)
    low, high = light + memory_fit.band(trainer_bytes), trainer_bytes
    if high - low >= 2 * STAGING_MARGIN_BYTES:
        capacity = -(-((low + high) // 2 + memory_fit.reserve(high)) // MIB) * MIB
        line = capacity - memory_fit.reserve(capacity)
        if low <= line < high:
            return capacity
    capacity = NOTHING_FITS_LIMIT_BYTES
    if trainer_bytes <= capacity - memory_fit.reserve(capacity):
        raise ValueError(f"a trainer of {trainer_bytes >> 20} MiB fits in {capacity >> 20} MiB")
    return capacity


@dataclass(frozen=True)
class Target:
    """One of issue 35's targets: a client's figure in one run, alone (against None) or
    against the same figure of a reference run: "solo", "mix_plain", or "own_plain" (the
    plain half of the same phase)."""

    item: str  # the letter
    run: str  # a row of RUNS
    client: str
    figure: str
    against: str | None
    rule: str  # "ratio<=", "ratio>=", "<=", "plus<=" (at most the reference plus), "within"
    limit: float | tuple[float, float]
    reference_client: str | None = None  # default: the same client

    def label(self) -> str:
        name = self.figure.removesuffix("_ms").replace("steps_per_s", "steps/s")
        against = {"own_plain": "plain", None: ""}.get(self.against, self.against)
        if self.rule == "within":
            low, high = self.limit  # type: ignore[misc]
            return f"{name} {100 * low:.0f}-{100 * high:.0f} %"
        if self.rule == "plus<=":
            return f"{name} <= {against} + {self.limit:g} ms"
        if self.rule == "<=":
            return f"{name} <= {self.limit:g} ms"
        return f"{name} {self.rule[-2:]} {self.limit:g}x {against}"


AUTO, APART, NOTHING = "mix_auto", "mix_two_trainers_apart", "mix_nothing_fits"
OFF = "mix_off_vs_plain/off"
TARGETS = (
    Target("a", AUTO, "inference", "p50_ms", "mix_plain", "ratio<=", 1.1),
    Target("a", AUTO, "inference", "p99_ms", "mix_plain", "ratio<=", 1.1),
    Target("a", AUTO, "notebook", "p95_ms", "solo", "ratio<=", 1.2),
    Target("a", AUTO, "trainer", "steps_per_s", "solo", "ratio>=", 0.95),
    Target("b", APART, "trainers", "steps_per_s", "solo", "ratio>=", 0.95, "trainer"),
    Target("b", APART, "trainers", "shares", None, "within", (0.45, 0.55)),
    Target("b", APART, "inference", "p99_ms", "mix_plain", "ratio<=", 1.2),
    Target("c", NOTHING, "trainer", "steps_per_s", "solo", "ratio>=", 0.85),
    Target("c", NOTHING, "inference", "p99_ms", None, "<=", 150),
    Target("c", NOTHING, "notebook", "p95_ms", "solo", "plus<=", 150),
    Target("d", OFF, "inference", "p50_ms", "own_plain", "ratio<=", 1.1),
    Target("d", OFF, "inference", "p99_ms", "own_plain", "ratio<=", 1.2),
    Target("d", OFF, "notebook", "p50_ms", "own_plain", "ratio<=", 1.1),
    Target("d", OFF, "notebook", "p95_ms", "own_plain", "ratio<=", 1.2),
)
# The table's rows: a phase, or "phase/part" for a phase of two runs.
RUNS = (
    "solo",
    "mix_plain",
    AUTO,
    APART,
    NOTHING,
    OFF,
    "mix_off_vs_plain/plain",
)


def clients_of(results: dict, run: str | None) -> dict:
    if run is None:
        return {}
    phase, _, part = run.partition("/")
    found = results.get(phase, {})
    return (found.get(part, {}) if part else found).get("clients", {})


def reference_run(run: str, against: str | None) -> str | None:
    if against == "own_plain":
        return run.partition("/")[0] + "/plain"
    return against


def figure(results: dict, run: str | None, client: str, name: str):
    value = clients_of(results, run).get(client, {}).get(name)
    return None if isinstance(value, float) and math.isnan(value) else value


def verdict(target: Target, results: dict) -> tuple[str, str]:
    """(what was measured against what, "MET" / "MISSED" / "NO DATA")."""
    value = figure(results, target.run, target.client, target.figure)
    reference = figure(
        results,
        reference_run(target.run, target.against),
        target.reference_client or target.client,
        target.figure,
    )
    if value is None or (target.against is not None and not reference):
        return "n/a", "NO DATA"
    if target.rule == "within":
        low, high = target.limit  # type: ignore[misc]
        shown = " / ".join(f"{100 * share:.1f} %" for share in value)
        return shown, "MET" if all(low <= share <= high for share in value) else "MISSED"
    if target.rule == "<=":
        return f"{value:.1f} ms", "MET" if value <= target.limit else "MISSED"  # type: ignore[operator]
    if target.rule == "plus<=":
        extra = value - reference
        return f"{extra:+.1f} ms", "MET" if extra <= target.limit else "MISSED"  # type: ignore[operator]
    ratio = value / reference
    met = ratio <= target.limit if target.rule == "ratio<=" else ratio >= target.limit  # type: ignore[operator]
    interval = ratio_interval(
        results,
        target.run,
        reference_run(target.run, target.against),
        target.reference_client or target.client,
        target.figure,
    )
    return f"{ratio:.3f}x{interval}", "MET" if met else "MISSED"


def headline_latencies(client: str) -> list[str]:
    """A light client's two headline figures: its median and its tail (TAILS)."""
    return ["p50_ms", f"p{round(100 * TAILS[client])}_ms"]


def latency_fraction(figure_name: str) -> float | None:
    """0.5 for "p50_ms", 0.99 for "p99_ms"; None for a figure that is no percentile."""
    if figure_name.startswith("p") and figure_name.endswith("_ms") and figure_name[1:-3].isdigit():
        return int(figure_name[1:-3]) / 100
    return None


def ratio_interval(results: dict, run: str, reference: str | None, client: str, name: str) -> str:
    """ " (95 %: low-high)" for a latency percentile's ratio where both runs kept their
    latencies, else "".  Every run's requests and cells come on the same seeded schedule, so
    where the counts agree request i of one run is request i of the other: they are resampled
    in pairs (a notebook's mix of 15 and 150 ms cells is then the same on both sides)."""
    fraction = latency_fraction(name)
    value = clients_of(results, run).get(client, {}).get("latencies_ms")
    alone = clients_of(results, reference).get(client, {}).get("latencies_ms")
    if fraction is None or not value or not alone:
        return ""

    def ratio(a, b):
        return percentile(a, fraction) / percentile(b, fraction)

    if len(value) == len(alone):
        pairs = list(zip(value, alone))
        low, high = bootstrap_95(lambda drawn: ratio(*zip(*drawn)), pairs, draws=RATIO_DRAWS)
    else:
        low, high = bootstrap_95(ratio, value, alone, draws=RATIO_DRAWS)
    return f" (95 %: {low:.2f}-{high:.2f})"


def noise_floor(results: dict) -> list[str]:
    """The light clients' figures in the second run without nvshare divided by the first's:
    how far two runs of the same mix differ with nothing of nvshare in either."""
    second, first = NO_NVSHARE_TWICE
    shown = []
    for client in clients_of(results, second):
        if client not in TAILS or client not in clients_of(results, first):
            continue
        parts = []
        for name in headline_latencies(client):
            value, reference = (
                figure(results, second, client, name),
                figure(results, first, client, name),
            )
            if value is None or not reference:
                continue
            interval = ratio_interval(results, second, first, client, name)
            parts.append(f"{name.removesuffix('_ms')} {value / reference:.3f}x{interval}")
        if parts:
            shown.append(f"{client} {', '.join(parts)}")
    if not shown:
        return []
    return [f"no nvshare twice ({second} ÷ {first}): " + "; ".join(shown)]


def _ms(value) -> str:
    return "n/a" if value is None else f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def measured(name: str, figures: dict) -> str:
    if name.startswith("trainer"):
        shown = f"{figures['steps_per_s']:.2f} steps/s"
        shares = figures.get("shares")
        return shown + (f"; {' / '.join(f'{100 * s:.1f}' for s in shares)} %" if shares else "")
    tail = headline_latencies(name)[1]
    by_cell = "".join(
        f"; {float(size):g} ms cells p50 {_ms(of['p50_ms'])} / {tail[:3]} {_ms(of[tail])}"
        for size, of in figures.get("by_cell_ms", {}).items()
    )
    return (
        f"p50 {_ms(figures.get('p50_ms'))} / {tail[:3]} {_ms(figures.get(tail))}"
        f" / max {_ms(figures.get('max_ms'))} ms (n={figures.get('count', 0)}){by_cell}"
    )


def ratios(results: dict, name: str, run: str, reference: str | None) -> str:
    """The client's headline figures divided by the same in the reference run."""
    if name.startswith("trainer"):  # trainer_2 and the trainers' aggregate: against one trainer
        keys, reference_client = ["steps_per_s"], "trainer"
    else:
        keys, reference_client = headline_latencies(name), name
    shown = []
    for key in keys:
        value, alone = (
            figure(results, run, name, key),
            figure(results, reference, reference_client, key),
        )
        shown.append("n/a" if value is None or not alone else f"{value / alone:.2f}x")
    return " / ".join(shown)


def pooled(runs: list[dict]) -> dict:
    """Several calls' results as one: each light client's latencies joined (its summary
    recomputed), each trainer's rate and the trainers' shares averaged.  A tail over three
    windows rests on three times the requests."""
    pooled_results: dict = {}
    for run in RUNS:
        phase, _, part = run.partition("/")
        each = [clients_of(results, run) for results in runs]
        each = [clients for clients in each if clients]
        if not each:
            continue
        clients = {}
        for name in each[0]:
            found = [c[name] for c in each if name in c]
            if name in TAILS and all("latencies_ms" in f for f in found):
                joined = [ms for f in found for ms in f["latencies_ms"]]
                clients[name] = {"latencies_ms": joined, **latency_summary(joined, TAILS[name])}
            elif name.startswith("trainer"):
                clients[name] = {"steps_per_s": sum(f["steps_per_s"] for f in found) / len(found)}
                if all(f.get("shares") for f in found):
                    columns = zip(*(f["shares"] for f in found))
                    clients[name]["shares"] = [sum(c) / len(found) for c in columns]
        target = pooled_results.setdefault(phase, {})
        (target.setdefault(part, {}) if part else target)["clients"] = clients
    return pooled_results


def table(results: dict) -> list[str]:
    """The markdown table: every run's clients, their ratios, the targets and verdicts."""
    lines = [
        "| run | client | measured | ÷ solo | ÷ no nvshare | target | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    # Once each: a latency ratio's interval resamples its runs 2000 times.
    judged = {target: verdict(target, results) for target in TARGETS}
    for run in RUNS:
        # The shim's own cost is judged against the plain run of its own phase.
        plain = reference_run(run, "own_plain") if run == OFF else "mix_plain"
        for name, figures in clients_of(results, run).items():
            aimed = [t for t in TARGETS if t.run == run and t.client == name]
            checked = [judged[t] for t in aimed]
            against_solo = ratios(results, name, run, "solo") if run != "solo" else ""
            against_plain = ratios(results, name, run, plain) if run not in ("solo", plain) else ""
            targets = "; ".join(
                f"{t.item}. {t.label()}: {shown}" for t, (shown, _) in zip(aimed, checked)
            )
            verdicts = "; ".join(v for _, v in checked)
            lines.append(
                f"| {run} | {name} | {measured(name, figures)} | {against_solo} | {against_plain} "
                f"| {targets} | {verdicts} |"
            )
    tally = [outcome for _, outcome in judged.values()]
    lines.append("")
    lines.extend(noise_floor(results))
    lines.append(
        f"targets: {tally.count('MET')} met, {tally.count('MISSED')} missed, "
        f"{tally.count('NO DATA')} without data"
    )
    return lines
