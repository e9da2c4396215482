"""Issue 44's shapes f and g (duty.py), pure: each process against its targets, the
markdown table, the agents' lock figures.  results is duty.json's shape: results[part][run]
["windows"][window]["clients"][role]["rate"], the solo part's runs named by their role."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from duty_measures import (
    DUTY_SETS,
    ENVS,
    ORDERS,
    PARTS,
    PIPE_QUEUES,
    TOLERANCE,
    base_role,
    duty_roles,
    fair_rates,
)

NAN = math.nan


@dataclass(frozen=True)
class Row:
    """One process (or a sum) in one window: alone, without nvshare, under it; bar is the
    rate under nvshare that its target asks for (None: reported, no target)."""

    part: str
    window: str
    process: str
    solo: float
    plain: float
    nvshare: float
    bar: float | None
    target: str

    def verdict(self) -> str:
        if self.bar is None:
            return ""
        if any(math.isnan(x) for x in (self.nvshare, self.bar)):
            return "NO DATA"
        return "MET" if self.nvshare >= self.bar else "MISSED"


def clients(results: dict, part: str, run: str, window: str) -> dict:
    found = results.get(part, {}).get(run, {})
    return (
        found.get("windows", {}).get(window, {}).get("clients", {})
        if isinstance(found, dict)
        else {}
    )


def rate(results: dict, part: str, run: str, window: str, role: str) -> float:
    return clients(results, part, run, window).get(role, {}).get("rate", NAN)


def solo_figures(results: dict) -> dict[str, dict]:
    """Each role's figures alone (the solo part's runs are named by their role)."""
    found = {}
    for role in results.get("solo", {}):
        figures = clients(results, "solo", role, "alone").get(role)
        if figures:
            found[role] = figures
    return found


def solo_rate(solo: dict[str, dict], role: str) -> float:
    return solo.get(base_role(role), {}).get("rate", NAN)


def against_plain(
    part: str, window: str, process: str, solo: float, plain: float, nvshare: float
) -> Row:
    """The usual target: TOLERANCE of the rate without nvshare."""
    return Row(
        part,
        window,
        process,
        solo,
        plain,
        nvshare,
        TOLERANCE * plain,
        f">= {TOLERANCE:.2f}x no nvshare",
    )


def duty_rows(results: dict, part: str) -> list[Row]:
    """Shape f: each duty process against its rate without nvshare, or against its fair
    share where that run starves it; the sum against the sum without nvshare (all of it);
    the trainer beside them, reported."""
    solo = solo_figures(results)
    rows = []
    for window in ("alone", "beside_trainer"):
        roles = duty_roles(part)
        try:
            fair = fair_rates(roles + (["trainer"] if window == "beside_trainer" else []), solo)
        except KeyError:  # a solo run missing: no fair shares
            fair = {}
        for role in roles:
            plain, nvshare = (rate(results, part, env, window, role) for env in ENVS)
            row = against_plain(part, window, role, solo_rate(solo, role), plain, nvshare)
            fair_rate = fair.get(role, NAN)
            if plain < fair_rate:
                target = f">= {TOLERANCE:.2f}x fair {fair_rate:.2f}"
                row = replace(row, bar=TOLERANCE * fair_rate, target=target)
            rows.append(row)
        plain, nvshare = (sum(rate(results, part, env, window, r) for r in roles) for env in ENVS)
        solo_sum = sum(solo_rate(solo, role) for role in roles)
        rows.append(
            Row(part, window, "sum", solo_sum, plain, nvshare, plain, ">= 1.00x no nvshare")
        )
        if window == "beside_trainer":
            plain, nvshare = (rate(results, part, env, window, "trainer") for env in ENVS)
            solo_trainer = solo_rate(solo, "trainer")
            rows.append(
                Row(part, window, "trainer", solo_trainer, plain, nvshare, None, "reported")
            )
    return rows


def loader_rows(results: dict) -> list[Row]:
    """Shape g, the loader-bound trainer beside a busy one, each arrival order."""
    solo = solo_figures(results)
    rows = []
    for order in ORDERS:
        for role in ("trainer", "loader"):
            plain, nvshare = (
                rate(results, "g_loader", f"{order}/{env}", "both", role) for env in ENVS
            )
            rows.append(
                against_plain("g_loader", order, role, solo_rate(solo, role), plain, nvshare)
            )
    return rows


def pipe_rows(results: dict) -> list[Row]:
    """Shape g, the two-stage pipeline: items out of stage two per second, each queue."""
    rows = []
    for queue in PIPE_QUEUES:
        plain, nvshare = (
            rate(results, "g_pipe", f"{queue}/{env}", "both", "pipeline") for env in ENVS
        )
        rows.append(against_plain("g_pipe", queue, "pipeline", NAN, plain, nvshare))
    return rows


def rows(results: dict) -> list[Row]:
    found = []
    for part in PARTS:
        if part not in results:
            continue
        if part in DUTY_SETS:
            found += duty_rows(results, part)
        elif part == "g_loader":
            found += loader_rows(results)
        else:
            found += pipe_rows(results)
    return found


def _figure(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.2f}"


def _ratio(value: float, reference: float) -> str:
    if math.isnan(value) or math.isnan(reference) or reference == 0:
        return "n/a"
    return f"{value / reference:.3f}x"


def table(results: dict) -> list[str]:
    """The markdown table: every process's rate (per second: bursts, steps or items)
    alone, without nvshare and under it, their ratios, its target and the verdict."""
    lines = [
        "| part | window | process | solo /s | no nvshare /s | nvshare /s | no nvshare ÷ solo "
        "| nvshare ÷ solo | nvshare ÷ no nvshare | target | bar /s | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    found = rows(results)
    for row in found:
        lines.append(
            f"| {row.part} | {row.window} | {row.process} | {_figure(row.solo)} | {_figure(row.plain)} "
            f"| {_figure(row.nvshare)} | {_ratio(row.plain, row.solo)} | {_ratio(row.nvshare, row.solo)} "
            f"| {_ratio(row.nvshare, row.plain)} | {row.target} | {_figure(row.bar)} | {row.verdict()} |"
        )
    verdicts = [row.verdict() for row in found if row.bar is not None]
    lines.append("")
    lines.append(
        f"targets: {verdicts.count('MET')} met, {verdicts.count('MISSED')} missed, "
        f"{verdicts.count('NO DATA')} without data"
    )
    return lines


def lock_lines(results: dict) -> list[str]:
    """Each run under nvshare, from its agent's log: every process's grants of the lock and
    its waits for them, the drops by reason, the revokes."""
    lines = []
    for part in PARTS:
        for name, run in results.get(part, {}).items():
            lock = run.get("lock") if isinstance(run, dict) else None
            if not lock:
                continue
            if "error" in lock:
                lines.append(f"{part}/{name}: no lock figures ({lock['error']})")
                continue
            grants = ", ".join(
                f"{role} {sum(found.get('grants_per_gpu', {}).values())}"
                + (
                    f" (wait p50 {_figure(found['wait_p50_ms'])} / max "
                    f"{_figure(found.get('wait_max_ms', NAN))} ms)"
                    if not math.isnan(found.get("wait_p50_ms", NAN))
                    else ""
                )
                for role, found in lock.get("grants", {}).items()
            )
            lines.append(
                f"{part}/{name}: grants {grants}; drops {lock.get('drop_reasons', {})}; "
                f"revokes {lock.get('revokes', 0)}"
            )
    return lines
