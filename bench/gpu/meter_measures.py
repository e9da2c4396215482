"""meter_check.py's arithmetic, pure: the profiler's intervals as busy time, NVML's
per-process samples as busy time, and the table of the three against each other."""

from __future__ import annotations

TOLERANCE = 0.05  # issue 46: the meter within 5 % of NVML's and of the profiler's figure


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Time covered by at least one interval: kernels that overlap count once."""
    covered, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        covered += end - max(start, reach)
        reach = end
    return covered


def burst_spans_seconds(intervals: list[tuple[float, float]], gap_s: float = 0.001) -> float:
    """The bursts' spans: from each burst's first start to its last end, a burst ending
    where the GPU sat idle gap_s or longer.  What timestamps around a burst (the shim's
    events) can see: the idle moments inside a burst, where the host launches slower than
    the kernels run, count as busy."""
    spans, first, reach = 0.0, None, float("-inf")
    for start, end in sorted(intervals):
        if first is not None and start - reach >= gap_s:
            spans += reach - first
            first = None
        if first is None:
            first = start
        reach = max(reach, end)
    return spans + (reach - first if first is not None else 0.0)


def nvml_busy_seconds(samples: list[tuple[int, int]], longest_gap_s: float = 1.0) -> dict:
    """NVML's per-process samples (timestamp in µs, SM utilization in %), as polled, as
    seconds busy: each sample's utilization over the time since the one before (NVML
    gives its newest per poll), a gap longer than longest_gap_s counting that long (the
    process was not on the GPU, or starting)."""
    if len(samples) < 2:
        return {"busy_s": None, "samples": len(samples)}
    ordered = sorted(samples)
    busy = sum(
        util / 100 * min((stamp - before) / 1e6, longest_gap_s)
        for (before, _), (stamp, util) in zip(ordered, ordered[1:])
    )
    return {"busy_s": busy, "samples": len(samples)}


def ratio(measured: float | None, truth: float | None) -> float | None:
    return None if not measured or not truth else measured / truth


def table(results: dict[str, dict]) -> str:
    """One row per workload: the meter's GPU seconds against the profiler's busy time, its
    bursts' spans and NVML's; ratios outside TOLERANCE are marked."""

    def shown(value: float | None) -> str:
        if value is None:
            return "-"
        mark = "" if abs(value - 1) <= TOLERANCE else " !"
        return f"{value:.3f}{mark}"

    rows = [
        "| workload | meter s | profiler busy s (bursts' spans s) | NVML s | meter / profiler"
        " | meter / spans | meter / NVML |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        nvml = r["nvml"]["busy_s"]
        rows.append(
            f"| {name} | {r['meter_s']:.2f} | {r['profiler']['busy_s']:.2f}"
            f" ({r['profiler'].get('spans_s', 0):.2f}) | {'-' if nvml is None else f'{nvml:.2f}'}"
            f" | {shown(ratio(r['meter_s'], r['profiler']['busy_s']))}"
            f" | {shown(ratio(r['meter_s'], r['profiler'].get('spans_s')))}"
            f" | {shown(ratio(r['meter_s'], nvml))} |"
        )
    return "\n".join(rows)
