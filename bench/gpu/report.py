"""The default GPU run's printed table (run.py): one row per figure, read from the results of
one or more phases, with its target.  Pure: the results in, the lines out.  A new figure is
one row of ROWS (or EXTRA_ROWS, for the phases not in the default run)."""

from __future__ import annotations

from collections.abc import Callable


class Figures:
    """One run's results, each figure formatted as the table shows it ("n/a" where missing)."""

    def __init__(self, results: dict):
        self.results = results

    def _value(self, phase, key):
        return self.results.get(phase, {}).get(key)

    def get(self, phase, key, fmt="{:.3f}") -> str:
        value = self._value(phase, key)
        return "n/a" if value is None else fmt.format(value)

    def slash(self, phase, keys, fmt) -> str:
        """Several figures of one phase: "p50 / p95"."""
        return " / ".join(self.get(phase, key, fmt) for key in keys)

    def across(self, phases, key, fmt) -> str:
        """One figure of several phases: "solo / TQ 2"."""
        return " / ".join(self.get(phase, key, fmt) for phase in phases)

    def clock(self, phases, key, fmt) -> str:
        """One of the GPU clock sampler's figures, of several phases."""
        shown = []
        for phase in phases:
            value = self.results.get(phase, {}).get("gpu_clocks", {}).get(key)
            shown.append("n/a" if value is None else fmt.format(value))
        return " / ".join(shown)

    def step_ms(self, phases) -> str:
        """GPU time per step, each trainer's, of several phases."""
        shown = []
        for phase in phases:
            value = self._value(phase, "gpu_step_s")
            values = value if isinstance(value, list) else [] if value is None else [value]
            shown.append(", ".join(f"{1000 * v:.1f}" for v in values) or "n/a")
        return " / ".join(shown)

    def vs_solo(self, phase, solo_phase="solo", key="aggregate_steps_per_s") -> str:
        alone = self._value(solo_phase, "steps_per_s")
        rate = self._value(phase, key)
        return "n/a" if rate is None or not alone else f"{rate / alone:.3f}x"

    def trainer_vs_solo(self, phase) -> str:
        return self.vs_solo(phase, key="trainer_steps_per_s")

    def shares(self, phase) -> str:
        values = self._value(phase, "shares")
        return "n/a" if not values else " / ".join(f"{100 * v:.1f}%" for v in values)

    def drops(self, phase) -> str:
        return self.slash(phase, ("drop_to_release_p50_ms", "drop_to_release_p99_ms"), "{:.1f}")

    def waits(self, phase, fmt="{:.1f}") -> str:
        return self.slash(phase, ("wait_p50_ms", "wait_p95_ms"), fmt)


Row = tuple[str, Callable[[Figures], str], str]  # label, measured, target

SOLO_AND_TQ2 = ("solo", "pair_tq2")
ROWS: list[Row] = [
    (
        "1 training step ratio, shim/plain (median of 3)",
        lambda f: f.get("overhead", "step_ratio_median", "{:.4f}"),
        "<= 1.002",
    ),
    (
        "1 results identical with and without shim",
        lambda f: f.get("overhead", "results_identical", "{}"),
        "True",
    ),
    (
        "1 launch cost delta, us/launch (fastest 10k-launch round per process)",
        lambda f: f.get("overhead", "launch_us_delta", "{:+.3f}"),
        "<= +0.3",
    ),
    (
        "1 same, fastest 100k launches in a row (the bench before)",
        lambda f: f.get("overhead", "launch_us_delta_100k", "{:+.3f}"),
        "(compare)",
    ),
    (
        "1 same, median of the pairs' own deltas",
        lambda f: f.get("overhead", "launch_us_delta_paired", "{:+.3f}"),
        "(compare)",
    ),
    (
        "1 same, the hook alone in one process, ns (median/mean)",
        lambda f: f.slash("overhead", ("hook_delta_ns_median", "hook_delta_ns_mean"), "{:+.1f}"),
        "<= +300",
    ),
    (
        "2 drop->release p50/p99 ms, TQ 2 s, loss read every step",
        lambda f: f.drops("pair_tq2"),
        "<= 100",
    ),
    (
        "2 same, loss read every 50 steps (work queued ahead)",
        lambda f: f.drops("pair_tq2_queued"),
        "<= 100",
    ),
    ("2 same, TQ 5 s, loss read every 50 steps", lambda f: f.drops("pair_tq5_queued"), "<= 100"),
    (
        "2 turn p50/max s from step times, TQ 2 s",
        lambda f: f.slash("pair_tq2", ("turn_p50_s", "turn_max_s"), "{:.2f}"),
        "(TQ+drop)",
    ),
    (
        "3 two trainers, anti-thrash on, TQ 2: aggregate vs solo",
        lambda f: f.vs_solo("pair_tq2"),
        "(withdrawn)",
    ),
    ("3 shares, anti-thrash on, TQ 2", lambda f: f.shares("pair_tq2"), "45-55%"),
    (
        "3 two trainers, anti-thrash off: aggregate vs solo",
        lambda f: f.vs_solo("pair_off"),
        "(compare)",
    ),
    (
        "3 GPU busy fraction: solo / TQ 2",
        lambda f: f.across(SOLO_AND_TQ2, "gpu_busy_fraction", "{:.3f}"),
        "(why)",
    ),
    ("3 GPU time per step ms: solo / TQ 2 (each)", lambda f: f.step_ms(SOLO_AND_TQ2), "(why)"),
    (
        "3 SM clock MHz, median: solo / TQ 2",
        lambda f: f.clock(SOLO_AND_TQ2, "sm_mhz_median", "{:.0f}"),
        "(why)",
    ),
    (
        "3 power W, median: solo / TQ 2",
        lambda f: f.clock(SOLO_AND_TQ2, "power_w_median", "{:.0f}"),
        "(why)",
    ),
    (
        "4 warm-up GB/s, bulk prefetch",
        lambda f: f.get("warmup", "prefetch_gb_per_s", "{:.1f}"),
        ">= 45",
    ),
    (
        "4 warm-up GB/s, page faults",
        lambda f: f.get("warmup", "page_fault_gb_per_s", "{:.1f}"),
        "(~8.5)",
    ),
    ("4 prefetch / page faults", lambda f: f.get("warmup", "speedup", "{:.1f}x"), ">= 5x"),
    (
        "4 warm-up GB/s, process prefetching by hand, no lock",
        lambda f: f.get("warmup", "driver_prefetch_gb_per_s", "{:.1f}"),
        "(ceiling)",
    ),
    (
        "5 notebook wait p50/p95 ms, TQ 30 s",
        lambda f: f.waits("notebook_tq30", "{:.0f}"),
        "(report)",
    ),
    (
        "5 notebook wait p50/p95 ms, TQ 2 s",
        lambda f: f.waits("notebook_tq2", "{:.0f}"),
        "(report)",
    ),
    (
        "a auto, fits: notebook wait p50/p95 ms",
        lambda f: f.waits("auto_notebook_fits"),
        "<= 5 / 50",
    ),
    (
        "a auto, fits: trainer beside it vs solo",
        lambda f: f.trainer_vs_solo("auto_notebook_fits"),
        ">= 0.95x",
    ),
    (
        "b auto, not fit, TQ 30: notebook wait p50/p95 ms",
        lambda f: f.waits("auto_notebook_exclusive"),
        "p95 <= 500",
    ),
    (
        "b auto, not fit: trainer vs solo",
        lambda f: f.trainer_vs_solo("auto_notebook_exclusive"),
        ">= 0.85x",
    ),
    (
        "c auto, two trainers fit: aggregate vs solo",
        lambda f: f.vs_solo("auto_pair_fits"),
        ">= 0.99x",
    ),
    ("c shares", lambda f: f.shares("auto_pair_fits"), "45-55%"),
    (
        "d auto, two trainers not fit: aggregate vs solo",
        lambda f: f.vs_solo("auto_pair_exclusive"),
        ">= 0.99x",
    ),
    ("d drop->release p50/p99 ms", lambda f: f.drops("auto_pair_exclusive"), "<= 100"),
    (
        "e anti-thrash on, TQ 30: notebook wait p50/p95 ms",
        lambda f: f.waits("notebook_tq30"),
        "(today's)",
    ),
]
# Shown when the run had the pausing trainers (run.py's extra phases).
EXTRA_ROWS: list[Row] = [
    (
        "3x pausing trainers, TQ 2: aggregate vs one pausing alone",
        lambda f: f.vs_solo("pair_pausing_tq2", "solo_pausing"),
        "(extra)",
    ),
    ("3x shares, pausing trainers", lambda f: f.shares("pair_pausing_tq2"), "(extra)"),
    (
        "3x pausing trainers, anti-thrash off: aggregate",
        lambda f: f.vs_solo("pair_pausing_off", "solo_pausing"),
        "(extra)",
    ),
    (
        "3x GPU busy fraction: solo / pair, pausing",
        lambda f: f.across(("solo_pausing", "pair_pausing_tq2"), "gpu_busy_fraction", "{:.3f}"),
        "(extra)",
    ),
]


def table_lines(results: dict) -> list[str]:
    figures = Figures(results)
    rows = ROWS + (EXTRA_ROWS if "pair_pausing_tq2" in results else [])
    lines = ["", f"{'figure':<58}{'measured':>18}  target"]
    for label, measured, target in rows:
        lines.append(f"{label:<58}{measured(figures):>18}  {target}")
    return lines


def print_table(results: dict) -> None:
    print("\n".join(table_lines(results)))
