"""`nvsharectl top`: who uses each GPU now, who waits and why, refreshed.

GPU time % is the rate of the agent's gpu_seconds (the shim's measure of the
client's GPU time) over the refresh interval: two readings of the agent, the
difference, divided by the seconds between them.  Everything else is the
agent's as the second reading says it.  The frame is plain text that fits
the width (text_fit.py); on a terminal it is redrawn in place (cursor home,
each line cleared to its end, the rest of the screen cleared), elsewhere
frames follow one another, a blank line between.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from nvshare_agent.text import printable

from .client import connect
from .render import gpu_labels, origin, status_as_dict, who
from .text_fit import fit, size, terminal_width

HOME = "\x1b[H"  # cursor to the top left
CLEAR_LINE_END = "\x1b[K"
CLEAR_SCREEN_END = "\x1b[J"
CLEAR_SCREEN = "\x1b[2J"

# A process with several connections to one GPU has one row: its state the
# busiest of theirs.
_STATE_ORDER = ("holding", "draining", "waiting", "idle")
WIDE = 120  # from this width on, a column of its own for the unit or pod


class Reading:
    """The agent's status (render.status_as_dict) and when it was read."""

    def __init__(self, status: dict, at: float):
        self.status = status
        self.at = at


async def read_agent(client) -> Reading:
    status = status_as_dict(await client.properties())
    return Reading(status, time.monotonic())


def _figures(reading: Reading) -> dict:
    """(pid, GPU uuid) -> the client's row fields, its connections merged."""
    rows: dict = {}
    for client in reading.status["clients"]:
        for entry in client["gpus"]:
            key = (client["pid"], entry["uuid"])
            row = rows.get(key)
            if row is None:
                rows[key] = {
                    "pid": client["pid"],
                    "gpu": entry["uuid"],
                    "user": who(client),
                    "unit": printable(client.get("unit") or ""),
                    "pod": printable(client.get("container") or ""),
                    "origin": origin(client),
                    "command": printable(client["command"]),
                    "state": entry["state"],
                    "memory_bytes": entry["allocated_bytes"],
                    # Per process already (ClientDetails): taken once, not per connection.
                    "gpu_seconds": float(entry.get("gpu_seconds", 0.0)),
                    "recent_use": float(entry.get("recent_use", 0.0)),
                    "wait_cause": entry.get("wait_cause", ""),
                    "waited_s": dict(entry.get("waited_s", {})),
                }
                continue
            row["memory_bytes"] += entry["allocated_bytes"]
            if _STATE_ORDER.index(entry["state"]) < _STATE_ORDER.index(row["state"]):
                row["state"] = entry["state"]
    return rows


def frame_data(before: Reading, after: Reading) -> dict:
    """What a frame shows, JSON-ready: each GPU and each client's row on it, the
    rows sorted by GPU time % (then memory), as top sorts by CPU."""
    interval = max(after.at - before.at, 1e-6)
    earlier = _figures(before)
    labels = gpu_labels(after.status["gpus"])
    rows = []
    for key, row in _figures(after).items():
        then = earlier.get(key)
        if then is not None:
            used = max(row["gpu_seconds"] - then["gpu_seconds"], 0.0)
            row["gpu_percent"] = round(min(used / interval, 1.0) * 100, 1)
        else:  # came between the readings: the agent's own recent figure
            row["gpu_percent"] = round(min(row["recent_use"], 1.0) * 100, 1)
        row["gpu_label"] = labels.get(row["gpu"], "-")
        row["waited_total_s"] = round(sum(row["waited_s"].values()), 3)
        rows.append(row)
    rows.sort(key=lambda r: (-r["gpu_percent"], -r["memory_bytes"], r["pid"]))
    gpus = []
    for gpu in after.status["gpus"]:
        mine = [row for row in rows if row["gpu"] == gpu["uuid"]]
        gpus.append(
            {
                "uuid": gpu["uuid"],
                "label": labels[gpu["uuid"]],
                "name": gpu["name"],
                "memory_total_bytes": gpu["memory_total_bytes"]
                or gpu.get("memory_capacity_bytes", 0),
                "memory_allocated_bytes": sum(row["memory_bytes"] for row in mine),
                "gpu_percent": round(min(sum(row["gpu_percent"] for row in mine), 100.0), 1),
                "holding": sum(row["state"] in ("holding", "draining") for row in mine),
                "waiting": sum(row["state"] == "waiting" for row in mine),
            }
        )
    return {"interval_s": round(interval, 3), "gpus": gpus, "clients": rows}


def seconds_text(seconds: float) -> str:
    """A span in at most 6 characters: 0.4s, 12.0s, 4m05s, 2h03m, 3d04h."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def _waited(row: dict) -> str:
    return seconds_text(row["waited_total_s"]) if row["waited_total_s"] else "-"


# (title, width, right-aligned, cell): the columns before WHERE and COMMAND.
_COLUMNS = (
    ("PID", 7, True, lambda r: str(r["pid"])),
    ("USER", 8, False, lambda r: r["user"]),
    ("GPU", 3, False, lambda r: r["gpu_label"]),
    ("%GPU", 5, True, lambda r: f"{r['gpu_percent']:.1f}"),
    ("MEMORY", 9, True, lambda r: size(r["memory_bytes"])),
    ("STATE", 8, False, lambda r: r["state"]),
    ("WAITED", 6, True, _waited),
    ("WHY", 12, False, lambda r: r["wait_cause"] or "-"),
)
_WHERE_WIDTH = 28


def _cell(text: str, width: int, right: bool) -> str:
    text = fit(text, width)
    return text.rjust(width) if right else text.ljust(width)


def frame_lines(data: dict, width: int, clock: str = "") -> list[str]:
    """The frame as lines of at most `width` characters."""
    gpus, rows = data["gpus"], data["clients"]
    waiting = sum(gpu["waiting"] for gpu in gpus)
    head = "nvshare top" + (f" {clock}" if clock else "")
    head += f"  {len(rows)} clients, {waiting} waiting  %GPU: over {data['interval_s']:.1f} s"
    lines = [head]
    for gpu in gpus:
        total = gpu["memory_total_bytes"]
        memory = size(gpu["memory_allocated_bytes"]) + (f" of {size(total)}" if total else "")
        lines.append(
            f"GPU {gpu['label']}  {gpu['gpu_percent']:5.1f}% busy  {memory}  "
            f"{gpu['holding']} holding, {gpu['waiting']} waiting  {gpu['name'] or ''}  "
            f"{gpu['uuid']}"
        )
    if not gpus:
        lines.append("no GPUs")
    lines.append("")
    wide = width >= WIDE
    titles = [_cell(title, w, right) for title, w, right, _ in _COLUMNS]
    if wide:
        titles.append(_cell("UNIT/POD", _WHERE_WIDTH, False))
    lines.append(" ".join([*titles, "COMMAND"]))
    for row in rows:
        cells = [_cell(cell(row), w, right) for _, w, right, cell in _COLUMNS]
        command = row["command"]
        if wide:
            cells.append(_cell(row["origin"] or "-", _WHERE_WIDTH, False))
        elif row["origin"]:
            command += f" [{row['origin']}]"
        lines.append(" ".join([*cells, command]))
    if not rows:
        lines.append("no clients")
    return [fit(line.rstrip(), width) for line in lines]


def in_place(lines: list[str], first: bool) -> str:
    """A frame redrawn over the last one on a terminal, without a blank moment:
    each line overwrites the old one and clears what is left of it."""
    start = CLEAR_SCREEN + HOME if first else HOME
    return start + "".join(line + CLEAR_LINE_END + "\n" for line in lines) + CLEAR_SCREEN_END


async def watch(bus: str, interval_s: float, once: bool, json_output: bool, out=None) -> None:
    """Read the agent every interval_s and show each frame: in place on a
    terminal, else one after another (JSON: a line each); once: the first only."""
    out = out or sys.stdout
    live = not once and not json_output and out.isatty()
    async with connect(bus) as client:
        before = await read_agent(client)
        first = True
        while True:
            await asyncio.sleep(interval_s)
            after = await read_agent(client)
            data = frame_data(before, after)
            if json_output:
                out.write(json.dumps(data, sort_keys=True) + "\n")
            else:
                lines = frame_lines(data, terminal_width(out), time.strftime("%H:%M:%S"))
                if live:
                    out.write(in_place(lines, first))
                else:
                    out.write(("" if first else "\n") + "\n".join(lines) + "\n")
            out.flush()
            if once:
                return
            before, first = after, False
