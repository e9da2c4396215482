"""nvsharectl's output: the agent's D-Bus values as JSON-ready dicts (keys
from nvshare_agent.dbus_names) and as human text that fits the terminal's
width (80 columns when not a terminal: text_fit.py).  nvshare-metrics builds
its Prometheus families from the same dicts.  Share groups: render_shares.py."""

import math
import textwrap

from nvshare_agent import dbus_names as names
from nvshare_agent.statistics import WAIT_BUCKETS_S

# Commands come from any process on the node; the agent cleans them too, but
# nvsharectl may be talking to another agent.
from nvshare_agent.text import printable

from .render_shares import SHARE_NOTE, groups_table, shares_as_dict, shares_text
from .text_fit import WIDTH, fit, limit_text, size

# Imported from here by nvsharectl and nvshare-metrics.
__all__ = ["WIDTH", "limit_text", "shares_as_dict", "shares_text", "size"]


def _record(struct, fields) -> dict:
    record = dict(zip((name for name, _ in fields), struct))
    if "gpus" in record:
        record["gpus"] = [_record(entry, names.CLIENT_GPU_FIELDS) for entry in record["gpus"]]
    return record


def statistics_as_dict(statistics: dict | None) -> dict:
    """One GPU's Statistics as JSON can carry them: the wait histogram's finite
    bounds as [upper bound, waits at or under it], and the +Inf bucket (every
    wait) as wait_seconds_count, since JSON has no infinity.  A GPU the agent
    has not counted anything on yet gets zeros, on the package's own bounds."""
    statistics = statistics or {}
    buckets = [
        [float(bound), int(count)] for bound, count in statistics.get("wait_seconds_buckets", ())
    ]
    if not buckets:
        buckets = [[bound, 0] for bound in (*WAIT_BUCKETS_S, math.inf)]
    finite = [bucket for bucket in buckets if math.isfinite(bucket[0])]
    every_wait = [count for bound, count in buckets if bound == math.inf]
    return {
        "grants": int(statistics.get("grants", 0)),
        "drops": int(statistics.get("drops", 0)),
        "revokes": int(statistics.get("revokes", 0)),
        "wait_seconds_sum": float(statistics.get("wait_seconds_sum", 0.0)),
        # Every grant was waited for (0 s or more): the agent counts one wait per grant.
        "wait_seconds_count": every_wait[0] if every_wait else int(statistics.get("grants", 0)),
        "wait_seconds_buckets": finite,
    }


def gpus_as_dicts(gpus, details=None, statistics=None) -> list:
    """Gpus' structs, each with its GpuDetails merged in and its Statistics under
    "statistics" (each when the agent has them: an older agent may not)."""
    records = [_record(gpu, names.GPU_FIELDS) for gpu in gpus]
    for record in records:
        for key, value in (details or {}).get(record["uuid"], {}).items():
            record[key] = value
        if statistics is not None:
            record["statistics"] = statistics_as_dict(statistics.get(record["uuid"]))
    return records


def clients_as_dicts(clients, details=None) -> list:
    """Clients' structs, each with its ClientDetails (user, unit, container) merged
    in, and each GPU entry with its figures there (gpu_seconds, wait_cause, ...)."""
    records = [_record(client, names.CLIENT_FIELDS) for client in clients]
    for record in records:
        own = dict((details or {}).get(record["pid"], {}))
        per_gpu = own.pop(names.CLIENT_PER_GPU_KEY, {})
        record.update(own)
        for entry in record["gpus"]:  # gpu_seconds, wait_cause, ... beside its state
            entry.update(per_gpu.get(entry["uuid"], {}))
    return records


def own_settings(gpu: dict, gpu_settings: dict) -> list:
    """The settings a GPU has of its own (its UUID's entry and its NVML index's)."""
    own = set(gpu_settings.get(gpu["uuid"], {}))
    if gpu.get("index", -1) >= 0:
        own |= set(gpu_settings.get(str(gpu["index"]), {}))
    return [key for key, _ in names.GPU_SETTINGS_FIELDS if key in own]


def status_as_dict(properties: dict) -> dict:
    anti_thrash = properties[names.PROP_ANTI_THRASH]
    # Agents from before per-GPU settings have no GpuSettings or MemoryLimit.
    gpu_settings = properties.get(names.PROP_GPU_SETTINGS, {})
    gpus = gpus_as_dicts(
        properties[names.PROP_GPUS],
        properties.get(names.PROP_GPU_DETAILS),
        properties.get(names.PROP_STATISTICS),
    )
    for gpu in gpus:
        gpu["own_settings"] = own_settings(gpu, gpu_settings)
    return {
        "time_quantum_s": properties[names.PROP_TIME_QUANTUM],
        "anti_thrash": anti_thrash,
        # An agent from before auto has no AntiThrashMode.
        "anti_thrash_mode": properties.get(
            names.PROP_ANTI_THRASH_MODE, "on" if anti_thrash else "off"
        ),
        "memory_limit_bytes": properties.get(names.PROP_MEMORY_LIMIT, 0),
        # on or off; "" from an agent before the setting.
        "fair_page": properties.get(names.PROP_FAIR_PAGE, ""),
        # "" while the agent runs by its config file (and from agents before it said).
        "config_problem": properties.get(names.PROP_CONFIG_PROBLEM, ""),
        # What the config file said that the agent does not apply (a section skipped).
        "config_warnings": properties.get(names.PROP_CONFIG_WARNINGS, []),
        "gpu_settings": gpu_settings,
        "gpus": gpus,
        "clients": clients_as_dicts(
            properties[names.PROP_CLIENTS], properties.get(names.PROP_CLIENT_DETAILS)
        ),
    }


def on_off(value: bool) -> str:
    return "on" if value else "off"


def settings_text(status: dict) -> str:
    """The node-wide settings, one line."""
    return (
        f"time quantum: {status['time_quantum_s']} s    "
        f"anti-thrash: {status.get('anti_thrash_mode') or on_off(status['anti_thrash'])}    "
        f"memory limit: {limit_text(status.get('memory_limit_bytes', 0))}"
    )


# How each setting's value reads, by the config file's key.
_VALUE_WORDS = {
    "time_quantum": lambda v: f"{v} s",
    "memory_limit": limit_text,
    "memory_cap": limit_text,
    **{key: lambda v: f"{v} ms" for key in ("idle_release_ms", "drop_grace_ms")},
    **{key: lambda v: f"{v} ms" for key in ("light_wait_ms", "min_slice_ms")},
}
RESET_HINT = "(nvsharectl reset-setting NAME [--gpu ID | --share GROUP]: back to the file's)"


def value_text(key: str, value) -> str:
    """A setting's value in words; None: a GPU's own taken away, the node's applies."""
    if value is None:
        return "the node's"
    return _VALUE_WORDS.get(key, str)(value)


def sources_lines(rows: list | None) -> list:
    """Where each value comes from (GetSettings): every value not the default, with
    the file's beside one set at run time, then the way back; [] from an agent that
    does not say."""
    if rows is None:
        return []
    shown = [row for row in rows if row["source"] != "default"]
    if not shown:
        return ["settings: all defaults (no config file, nothing set at run time)"]
    names = [
        row["key"] if row["section"] == "scheduler" else f"[{row['section']}] {row['key']}"
        for row in shown
    ]
    values = [value_text(row["key"], row.get("value")) for row in shown]
    name_width, value_width = max(map(len, names)), max(map(len, values))
    lines = ["settings: from the file or set at run time; the rest are defaults"]
    for name, value, row in zip(names, values, shown):
        source = row["source"]
        if source == "run time" and "file_value" in row:
            source += f" (file: {value_text(row['key'], row['file_value'])})"
        lines.append(f"  {name.ljust(name_width)}  {value.ljust(value_width)}  {source}")
    if any(row["source"] == "run time" for row in shown):
        lines.append(f"  {RESET_HINT}")
    return lines


def source_line(row: dict) -> str:
    """One value (a GetSettings row) and where it comes from, as reset-setting says it."""
    name = row["key"] if row["section"] == "scheduler" else f"[{row['section']}] {row['key']}"
    return f"{name} = {value_text(row['key'], row.get('value'))} ({row['source']})"


def gpu_settings_text(gpu: dict) -> str:
    """The settings a GPU runs by (GpuDetails), "(own)" where they are its own; ""
    from an agent without settings per GPU."""
    if "time_quantum_s" not in gpu:
        return ""
    own = set(gpu.get("own_settings", ()))

    def mark(key: str) -> str:
        return " (own)" if key in own else ""

    return (
        f"{gpu['time_quantum_s']} s{mark('time_quantum_s')}   "
        f"anti-thrash: {gpu['anti_thrash']}{mark('anti_thrash')}   "
        f"memory limit: {limit_text(gpu['memory_limit_bytes'])}{mark('memory_limit_bytes')}"
    )


def gpu_labels(gpus: list) -> dict:
    """What status calls each GPU (by UUID): NVML's index where the agent has an
    inventory (the number --gpu takes), else its place in the list."""
    if any(gpu.get("index", -1) >= 0 for gpu in gpus):
        return {gpu["uuid"]: str(gpu["index"]) if gpu["index"] >= 0 else "-" for gpu in gpus}
    return {gpu["uuid"]: str(i) for i, gpu in enumerate(gpus)}


def find_gpu(gpu_id: str, gpus: list) -> dict | None:
    """The GPU a --gpu id names now: by UUID, or by NVML index."""
    for gpu in gpus:
        if gpu["uuid"].lower() == gpu_id.lower() or str(gpu.get("index", -1)) == gpu_id:
            return gpu
    return None


def gpu_change_text(gpu_id: str, status: dict, width: int = WIDTH) -> str:
    """After a change of one GPU's settings: what it runs by now, as status shows it;
    for a GPU not on this node (now), what it has of its own."""
    gpu = find_gpu(gpu_id, status["gpus"])
    own = status["gpu_settings"].get(gpu_id, {})
    if gpu is not None and gpu_settings_text(gpu):
        label = gpu_labels(status["gpus"])[gpu["uuid"]]
        lines = [f"GPU {label}  {gpu['uuid']}", f"  tq:      {gpu_settings_text(gpu)}"]
    elif not own:
        lines = [f"GPU {gpu_id}: no settings of its own"]
    else:
        words = {
            "time_quantum_s": lambda v: f"tq {v} s",
            "anti_thrash": lambda v: f"anti-thrash: {v}",
            "memory_limit_bytes": lambda v: f"memory limit: {limit_text(v)}",
            "light_wait_ms": lambda v: f"light wait: {v} ms",
        }
        listed = ", ".join(words[key](value) for key, value in own.items() if key in words)
        lines = [f"GPU {gpu_id}  (not on this node now)", f"  own:     {listed}"]
    return "\n".join(fit(line, width) for line in lines)


def gpu_size_text(gpu: dict) -> str:
    """The GPU's memory: NVML's figure; without NVML (a container, CI), what its
    clients' driver told them, which anti-thrash auto counts with too, unless a
    memory limit below it is all that is known."""
    if gpu["memory_total_bytes"]:
        return size(gpu["memory_total_bytes"])
    capacity, limit = gpu.get("memory_capacity_bytes", 0), gpu.get("memory_limit_bytes", 0)
    if capacity and not (limit and capacity >= limit):
        return f"{size(capacity)} (clients' figure)"
    return "size unknown"


def allocated_on(gpu: dict, clients: list) -> int:
    """What the clients allocated on the GPU: the sum of their MEMORY column."""
    return sum(
        entry["allocated_bytes"]
        for client in clients
        for entry in client["gpus"]
        if entry["uuid"] == gpu["uuid"]
    )


def demand_text(gpu: dict, clients: list) -> str:
    """The memory the GPU's mode is judged by, told apart: what the clients allocated
    (the MEMORY column's sum) and the rest (CUDA contexts, as NVML reads them or
    estimated at 512 MiB each, and processes outside nvshare).  "" when none."""
    demand = gpu.get("memory_demand_bytes", 0)
    if not demand:
        return ""
    allocated = allocated_on(gpu, clients)
    rest = max(demand - allocated, 0)
    return f"{size(demand)} in use: {size(allocated)} allocated + {size(rest)} contexts, others"


def mode_text(gpu: dict) -> str:
    """How the GPU is scheduled now, and why (GpuDetails)."""
    mode = gpu.get("mode")
    if mode is None:
        return ""
    if gpu.get("anti_thrash") != "auto":
        return f"{mode} (anti-thrash {gpu.get('anti_thrash')})"
    capacity, demand = gpu.get("memory_capacity_bytes", 0), gpu.get("memory_demand_bytes", 0)
    if not capacity:
        return f"{mode} (auto: GPU memory size unknown)"
    verdict = "fits" if mode == "shared" else "does not fit"
    return f"{mode} (auto: memory {verdict}, {size(demand)} of {size(capacity)})"


def config_problem_lines(status: dict, width: int = WIDTH) -> list:
    """The agent could not use its config file, or skipped part of it: said first,
    whole, over as many lines as it takes (the line at fault must not be cut off),
    then a blank line."""
    problem = printable(status.get("config_problem") or "")
    said = [f"CONFIG ERROR: {problem}"] if problem else []
    said += [f"CONFIG WARNING: {printable(w)}" for w in status.get("config_warnings", ())]
    lines = []
    for sentence in said:
        # Not at hyphens: a reader (and a test) joins the lines with spaces again.
        lines += textwrap.wrap(sentence, width, subsequent_indent="  ", break_on_hyphens=False)
    return [*lines, ""] if lines else []


def status_text(status: dict, width: int = WIDTH) -> str:
    commands = {client["pid"]: printable(client["command"]) for client in status["clients"]}

    def who(pids) -> str:
        return (
            ", ".join(f"{pid} ({commands[pid]})" if commands.get(pid) else str(pid) for pid in pids)
            or "-"
        )

    lines = [*config_problem_lines(status, width), settings_text(status)]
    lines += sources_lines(status.get("settings"))
    if not status["gpus"]:
        lines.append("no GPUs")
    labels = gpu_labels(status["gpus"])
    for gpu in status["gpus"]:
        lines += [
            "",
            f"GPU {labels[gpu['uuid']]}  {gpu['uuid']}  {gpu_size_text(gpu)}",
            f"  name:    {gpu['name'] or 'unknown'}",
        ]
        if gpu_settings_text(gpu):
            lines.append(f"  tq:      {gpu_settings_text(gpu)}")
        if mode_text(gpu):
            lines.append(f"  mode:    {mode_text(gpu)}")
        if demand_text(gpu, status["clients"]):
            lines.append(f"  memory:  {demand_text(gpu, status['clients'])}")
        lines += [
            f"  holding: {who(gpu['holder_pids'])}",
            f"  waiting: {who(gpu['queue_pids'])}",
        ]
        groups = [g for g in status.get("groups", ()) if g["gpu"] == gpu["uuid"]]
        if groups:
            lines.append(f"  groups:  by {status.get('share_by', 'user')}")
            lines += groups_table(groups, width, indent="    ")
    if status.get("groups"):
        lines += ["", SHARE_NOTE]
    lines += ["", *clients_text(status["clients"], status["gpus"], width).split("\n")]
    return "\n".join(fit(line, width) for line in lines)


def who(client: dict) -> str:
    """The user's name (the uid where the node has none)."""
    return printable(client.get("user") or "") or str(client["uid"])


def origin(client: dict) -> str:
    """Where the process comes from: its container or pod, else its systemd unit."""
    unit = printable(client.get("unit") or "").removesuffix(".service")
    return printable(client.get("container") or "") or unit


def clients_text(clients: list, gpus: list, width: int = WIDTH) -> str:
    if not clients:
        return "no clients"
    index_of = gpu_labels(gpus)
    rows = [("PID", "USER", "GPU", "STATE", "MEMORY", "HELD", "COMMAND")]
    for client in clients:
        entries = client["gpus"] or [
            {"uuid": "", "state": "-", "allocated_bytes": 0, "holding_seconds": 0.0}
        ]
        for entry in entries:
            rows.append(
                (
                    str(client["pid"]),
                    who(client),
                    index_of.get(entry["uuid"], entry["uuid"][:12] or "-"),
                    entry["state"],
                    size(entry["allocated_bytes"]),
                    f"{entry['holding_seconds']:.1f}s",
                    printable(client["command"])
                    + (f" [{origin(client)}]" if origin(client) else ""),
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    lines = []
    for row in rows:
        cells = [
            row[i].rjust(widths[i]) if i in (0, 4, 5) else row[i].ljust(widths[i]) for i in range(6)
        ]
        lines.append(fit("  ".join(cells + [row[6]]), width))
    return "\n".join(lines)
