"""`nvsharectl explain PID`: why a process waits for a GPU now, or that it
runs, and what would change it, in one sentence per GPU it uses.

Only the agent's own figures (render.status_as_dict): its state and
wait_cause, what it and the holders have allocated, the memory the agent
counts the GPU as having, the time quantum.  The scheduling rules behind
each cause are docs/scheduling.md's; the sentences say them in brief.
"""

from __future__ import annotations

from nvshare_agent.text import printable

from .render import gpu_labels
from .text_fit import size
from .top import seconds_text

_STATE_ORDER = ("holding", "draining", "waiting", "idle")


def _entries(status: dict, pid: int) -> list[tuple[dict, dict]]:
    """(client, entry) per GPU the process uses, its connections merged: the
    busiest state, the memory added up (the figures are per process already)."""
    merged: dict = {}
    for client in status["clients"]:
        if client["pid"] != pid:
            continue
        for entry in client["gpus"]:
            seen = merged.get(entry["uuid"])
            if seen is None:
                merged[entry["uuid"]] = (client, dict(entry))
                continue
            seen[1]["allocated_bytes"] += entry["allocated_bytes"]
            if _STATE_ORDER.index(entry["state"]) < _STATE_ORDER.index(seen[1]["state"]):
                seen[1]["state"] = entry["state"]
                seen[1]["holding_seconds"] = entry["holding_seconds"]
    return list(merged.values())


def _holders(status: dict, gpu: dict, pid: int) -> tuple[str, str, int]:
    """The processes holding the GPU in words, by pid alone, and what they have
    allocated there."""
    pids = [p for p in dict.fromkeys(gpu["holder_pids"]) if p != pid]
    commands = {c["pid"]: printable(c["command"]) for c in status["clients"]}
    held = sum(
        entry["allocated_bytes"]
        for client in status["clients"]
        if client["pid"] in pids
        for entry in client["gpus"]
        if entry["uuid"] == gpu["uuid"]
    )
    named = [f"PID {p} ({commands[p]})" if commands.get(p) else f"PID {p}" for p in pids]
    short = " and ".join(f"PID {p}" for p in pids) or "the holder"
    return " and ".join(named) or "the holder", short, held


def _waited(entry: dict) -> str:
    waited = entry.get("waited_s", {})
    if not waited:
        return ""
    parts = ", ".join(f"{cause} {seconds_text(s)}" for cause, s in sorted(waited.items()))
    return f"it has waited {seconds_text(sum(waited.values()))} in all ({parts})"


def sentence(status: dict, client: dict, entry: dict) -> str:
    gpu = next(g for g in status["gpus"] if g["uuid"] == entry["uuid"])
    label = gpu_labels(status["gpus"])[gpu["uuid"]]
    command = printable(client["command"])
    me = f"PID {client['pid']}" + (f" ({command})" if command else "")
    quantum = gpu.get("time_quantum_s", status["time_quantum_s"])
    holders, short, held = _holders(status, gpu, client["pid"])
    state, cause = entry["state"], entry.get("wait_cause", "")
    waited = _waited(entry)
    if state == "holding":
        behind = len(gpu["queue_pids"])
        if behind:
            after = (
                f"{behind} {'process waits' if behind == 1 else 'processes wait'} behind it, "
                f"so its turn ends after the time quantum ({quantum} s)"
            )
        else:
            after = "nobody waits, so it keeps the GPU until it lets go"
        return (
            f"{me} runs on GPU {label}: it holds the GPU "
            f"({seconds_text(entry['holding_seconds'])} in this turn, "
            f"{seconds_text(entry.get('gpu_seconds', 0.0))} of GPU time since it came); {after}."
        )
    if state == "draining":
        return (
            f"{me} was asked to release GPU {label} (its turn is over, others wait) and is "
            "finishing its work; the agent takes the GPU back if it does not let go in time."
        )
    if state == "idle":
        tail = f"; {waited}" if waited else ""
        return f"{me} is connected to GPU {label} but does not ask for it now (idle){tail}."
    so_far = f"; {waited}" if waited else ""
    if cause == "memory":
        capacity = gpu.get("memory_capacity_bytes") or gpu["memory_total_bytes"]
        of = f" of the {size(capacity)} the agent counts the GPU as having" if capacity else ""
        limit = gpu.get("memory_limit_bytes", 0)
        hint = (
            f" (the memory limit, {size(limit)}, counts the GPU smaller than it may be)"
            if limit
            else ""
        )
        return (
            f"{me} waits for GPU {label} because its memory does not fit beside the holder's: "
            f"it needs {size(entry['allocated_bytes'])} beside the {size(held)} that {holders} "
            f"holds{of}{hint}; it gets the GPU when {short} releases it (asked to once it has "
            f"waited the time quantum, {quantum} s) or frees memory{so_far}."
        )
    if cause == "turn":
        return (
            f"{me} waits for GPU {label} for its turn: it and {holders} both keep the GPU busy, "
            f"and busy work runs one at a time; it gets the GPU when {short}'s turn ends, "
            f"about the time quantum ({quantum} s) after it began to wait{so_far}."
        )
    if cause == "latency work":
        return (
            f"{me} waits for GPU {label} while {holders} runs a short burst of work; it gets "
            f"the GPU when the burst ends{so_far}."
        )
    if cause == "share":
        return (
            f"{me} waits for GPU {label} because other share groups are owed more of its time "
            f"than its own (nvsharectl share shows them); it gets the GPU once they have had "
            f"their share, sooner with a higher weight for its group{so_far}."
        )
    return f"{me} waits for GPU {label} behind {holders}{so_far}."


def explain(status: dict, pid: int) -> list[dict]:
    """Per GPU the process uses: its state, why it waits, and the sentence;
    LookupError when the agent has no such client."""
    found = _entries(status, pid)
    if not found:
        if not any(client["pid"] == pid for client in status["clients"]):
            raise LookupError(pid)
        said = f"PID {pid} is connected to the nvshare agent but uses no GPU yet."
        return [{"gpu": "", "state": "idle", "wait_cause": "", "sentence": said}]
    return [
        {
            "gpu": entry["uuid"],
            "state": entry["state"],
            "wait_cause": entry.get("wait_cause", ""),
            "sentence": sentence(status, client, entry),
        }
        for client, entry in found
    ]
