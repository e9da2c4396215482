"""The agent's state as Prometheus metric families, and their exposition.

The input is what `nvsharectl status --json` prints (nvshare_cli.render's
status dict, read over D-Bus once per scrape); prometheus_client writes the
text, so escaping, number formatting and the OpenMetrics variant are its.
docs/metrics.md describes every family below; a test checks that it names
each one the exporter can write.

Label values come from the agent as they are: a command line is whatever the
client process said it was (the agent makes it printable), a user name is what
the node's user database says.  prometheus_client escapes them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

CLIENT_LABELS = ("gpu", "pid", "user", "command")
# Who a process is, for the counters of what it did: its unit and pod too, so
# that a dashboard can add them up by either ("pod": the agent's "container").
USAGE_LABELS = ("gpu", "pid", "user", "unit", "pod")
# A share group on a GPU: "user:1000", "unit:NAME.service", "pod:UID" or "process:PID".
GROUP_LABELS = ("gpu", "group")
CLIENT_STATES = ("idle", "waiting", "holding", "draining")
GPU_MODES = ("exclusive", "shared")
ANTI_THRASH_SETTINGS = ("on", "off", "auto")

# Every family the exporter can write, as the text format names them (an info
# family gets "_info", a counter's samples "_total").
FAMILY_NAMES = (
    "nvshare_agent_up",
    "nvshare_config_error",
    "nvshare_time_quantum_seconds",
    "nvshare_anti_thrash",
    "nvshare_gpu_info",
    "nvshare_gpu_memory_total_bytes",
    "nvshare_gpu_mode",
    "nvshare_gpu_memory_capacity_bytes",
    "nvshare_gpu_memory_demand_bytes",
    "nvshare_gpu_holders",
    "nvshare_gpu_queue_length",
    "nvshare_grants",
    "nvshare_drops",
    "nvshare_revokes",
    "nvshare_lock_wait_seconds",
    "nvshare_clients",
    "nvshare_client_info",
    "nvshare_client_memory_bytes",
    "nvshare_client_holding_seconds",
    "nvshare_client_state",
    "nvshare_client_gpu_seconds",
    "nvshare_client_wait_seconds",
    "nvshare_share_weight",
    "nvshare_share_memory_cap_bytes",
    "nvshare_share_use",
    "nvshare_share_of_gpu_time",
    "nvshare_share_gpu_seconds",
    "nvshare_share_wait_seconds",
)


_Family = TypeVar("_Family", GaugeMetricFamily, CounterMetricFamily)


class _Series:
    """Samples of one family by label values.  Two connections of one process
    (a second copy of the shim, or a process that opens them on purpose) would
    otherwise give two samples with the same labels, which makes the whole
    scrape invalid: they are combined instead."""

    def __init__(self, combine: Callable[[float, float], float] = lambda a, b: a + b):
        self.values: dict[tuple[str, ...], float] = {}
        self._combine = combine

    def add(self, labels: Iterable[object], value: float) -> None:
        key = tuple(str(label) for label in labels)
        self.values[key] = (
            self._combine(self.values[key], value) if key in self.values else float(value)
        )

    def into(self, family: _Family) -> _Family:
        for labels, value in self.values.items():
            family.add_metric(labels, value)
        return family


def agent_families(status: dict | None) -> Iterator[Metric]:
    """The families for one reading of the agent; status None: it did not answer."""
    yield GaugeMetricFamily(
        "nvshare_agent_up",
        "1 if the nvshare agent answered on D-Bus for this scrape, 0 if not (then nothing else).",
        value=0 if status is None else 1,
    )
    if status is None:
        return
    problem = status.get("config_problem", "")
    config = GaugeMetricFamily(
        "nvshare_config_error",
        "1 if the agent could not use its config file when it started (problem says what is "
        "wrong, and on which line, and what it serves with instead), 0 if it runs by it.",
        labels=["problem"],
    )
    config.add_metric([problem], 1 if problem else 0)
    yield config
    yield GaugeMetricFamily(
        "nvshare_time_quantum_seconds",
        "How long a holder keeps a GPU while others wait.",
        value=status["time_quantum_s"],
    )
    setting = GaugeMetricFamily(
        "nvshare_anti_thrash",
        "1 for the anti-thrash setting in force (on, off or auto), 0 for the others.",
        labels=["setting"],
    )
    for name in ANTI_THRASH_SETTINGS:
        setting.add_metric([name], 1 if status["anti_thrash_mode"] == name else 0)
    yield setting
    yield from _gpu_families(status["gpus"])
    yield from _client_families(status["clients"])
    yield from _group_families(status.get("groups", []))


def _group_families(groups: list[dict]) -> Iterator[Metric]:
    """Share groups on each GPU (docs/scheduling.md "Shares")."""
    labels = list(GROUP_LABELS)
    families = {
        "weight": GaugeMetricFamily(
            "nvshare_share_weight", "A share group's weight (default 1).", labels=labels
        ),
        "memory_cap_bytes": GaugeMetricFamily(
            "nvshare_share_memory_cap_bytes",
            "A share group's memory cap on the GPU; 0: none.",
            labels=labels,
        ),
        "use": GaugeMetricFamily(
            "nvshare_share_use",
            "A share group's clients' recent use of the GPU together (GPU time, ~10 s).",
            labels=labels,
        ),
        "share": GaugeMetricFamily(
            "nvshare_share_of_gpu_time",
            "A share group's share of the GPU's time over the last minute (0..1).",
            labels=labels,
        ),
    }
    gpu_time = CounterMetricFamily(
        "nvshare_share_gpu_seconds",
        "GPU time a share group's processes have used on the GPU, as their shims measure it, "
        "those that have gone included (the series goes on when a process disconnects).",
        labels=labels,
    )
    waited = CounterMetricFamily(
        "nvshare_share_wait_seconds",
        "Seconds a share group's processes have waited for the GPU, by why they waited "
        "(memory, turn, latency work, share), those that have gone and the waits under way "
        "included.",
        labels=[*labels, "cause"],
    )
    for group in groups:
        on = [group["gpu"], group["group"]]
        for key, family in families.items():
            family.add_metric(on, group[key])
        if "gpu_seconds" not in group:
            continue  # an agent from before the groups' counters
        gpu_time.add_metric(on, group["gpu_seconds"])
        for cause, seconds in group.get("waited_s", {}).items():
            waited.add_metric([*on, cause], seconds)
    yield from families.values()
    yield gpu_time
    yield waited


def _gpu_families(gpus: list[dict]) -> Iterator[Metric]:
    info = InfoMetricFamily("nvshare_gpu", "A GPU the agent schedules, by UUID.", labels=["gpu"])
    total = _gauge("nvshare_gpu_memory_total_bytes", "GPU memory as NVML reports it.")
    mode = GaugeMetricFamily(
        "nvshare_gpu_mode",
        "1 for how the GPU is scheduled now (exclusive: one turn at a time; shared: light work "
        "beside one turn), 0 for the other.",
        labels=["gpu", "mode"],
    )
    capacity = _gauge(
        "nvshare_gpu_memory_capacity_bytes", "GPU memory that anti-thrash auto counts with."
    )
    demand = _gauge(
        "nvshare_gpu_memory_demand_bytes",
        "GPU memory its clients (and other processes, by NVML) need, as anti-thrash auto sees it.",
    )
    holders = _gauge("nvshare_gpu_holders", "Processes holding the GPU's lock now.")
    queue = _gauge("nvshare_gpu_queue_length", "Processes waiting for the GPU's lock now.")
    grants = _counter("nvshare_grants", "Lock grants since the agent started.")
    drops = _counter(
        "nvshare_drops",
        "Requests to a holder to release the lock at once (its turn is over) since the agent "
        "started.",
    )
    revokes = _counter(
        "nvshare_revokes",
        "Locks taken back from holders that did not release in time since the agent started.",
    )
    waits = HistogramMetricFamily(
        "nvshare_lock_wait_seconds",
        "How long each grant was waited for, since the agent started.",
        labels=["gpu"],
    )
    for gpu in gpus:
        uuid = gpu["uuid"]
        info.add_metric([uuid], {"name": gpu["name"]})
        # 0 is the agent's "unknown": absent is what Prometheus means by that.
        if gpu["memory_total_bytes"]:
            total.add_metric([uuid], gpu["memory_total_bytes"])
        if "mode" in gpu:  # GpuDetails: an agent from before them has none
            for name in GPU_MODES:
                mode.add_metric([uuid, name], 1 if gpu["mode"] == name else 0)
            if gpu["memory_capacity_bytes"]:
                capacity.add_metric([uuid], gpu["memory_capacity_bytes"])
            demand.add_metric([uuid], gpu["memory_demand_bytes"])
        holders.add_metric([uuid], len(gpu["holder_pids"]))
        queue.add_metric([uuid], len(gpu["queue_pids"]))
        statistics = gpu.get("statistics")
        if statistics is None:
            continue
        grants.add_metric([uuid], statistics["grants"])
        drops.add_metric([uuid], statistics["drops"])
        revokes.add_metric([uuid], statistics["revokes"])
        buckets = [
            (floatToGoString(bound), count) for bound, count in statistics["wait_seconds_buckets"]
        ]
        buckets.append((floatToGoString(math.inf), statistics["wait_seconds_count"]))
        waits.add_metric([uuid], buckets, statistics["wait_seconds_sum"])
    yield from (info, total, mode, capacity, demand, holders, queue, grants, drops, revokes, waits)


def _client_families(clients: list[dict]) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "nvshare_clients", "Processes connected to the agent.", value=len(clients)
    )
    info = InfoMetricFamily(
        "nvshare_client",
        "A process connected to the agent: its uid and user, command line, systemd unit and "
        "container or pod (empty where the node cannot tell).",
        labels=["pid", "uid", "user", "command", "unit", "container"],
    )
    seen_info: set[tuple[str, ...]] = set()
    memory = _Series()
    holding = _Series(max)
    states = _Series()
    gpu_time = _Series()
    waited = _Series()
    # gpu_seconds and waited_s are per process already (ClientDetails adds up its
    # connections): taken once per process and GPU, not once per connection.
    counted: set[tuple[object, str]] = set()
    for client in clients:
        identity = [client["pid"], client["uid"], client.get("user", ""), client["command"]]
        identity += [client.get("unit", ""), client.get("container", "")]
        key = tuple(str(value) for value in identity)
        if key not in seen_info:
            seen_info.add(key)
            info.add_metric(key, {})
        user = client.get("user", "")
        for entry in client["gpus"]:
            labels = [entry["uuid"], client["pid"], user, client["command"]]
            memory.add(labels, entry["allocated_bytes"])
            holding.add(labels, entry["holding_seconds"])
            for state in CLIENT_STATES:
                states.add([*labels, state], 1 if entry["state"] == state else 0)
            if "gpu_seconds" not in entry or (client["pid"], entry["uuid"]) in counted:
                continue  # an agent from before it said, or this process counted already
            counted.add((client["pid"], entry["uuid"]))
            usage = [entry["uuid"], client["pid"], user, client.get("unit", "")]
            usage.append(client.get("container", ""))
            gpu_time.add([*usage, client["command"]], entry["gpu_seconds"])
            for cause, seconds in entry.get("waited_s", {}).items():
                waited.add([*usage, cause], seconds)
    yield info
    yield memory.into(
        GaugeMetricFamily(
            "nvshare_client_memory_bytes",
            "GPU memory the process has allocated on the GPU (managed and not).",
            labels=list(CLIENT_LABELS),
        )
    )
    yield holding.into(
        GaugeMetricFamily(
            "nvshare_client_holding_seconds",
            "How long the process has held the GPU in its current turn (0 when not holding).",
            labels=list(CLIENT_LABELS),
        )
    )
    yield states.into(
        GaugeMetricFamily(
            "nvshare_client_state",
            "1 for the process's state on the GPU (idle, waiting, holding or draining), 0 for the "
            "others; more than 1 only for a process with several connections.",
            labels=[*CLIENT_LABELS, "state"],
        )
    )
    yield gpu_time.into(
        CounterMetricFamily(
            "nvshare_client_gpu_seconds",
            "GPU time the process has used on the GPU since it connected, as the shim measures "
            "it (its series ends when the process disconnects).",
            labels=[*USAGE_LABELS, "command"],
        )
    )
    yield waited.into(
        CounterMetricFamily(
            "nvshare_client_wait_seconds",
            "Seconds the process has waited for the GPU since it connected, by why it waited "
            "(memory, turn, latency work, share), the wait under way included.",
            labels=[*USAGE_LABELS, "cause"],
        )
    )


def _gauge(name: str, documentation: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=["gpu"])


def _counter(name: str, documentation: str) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, labels=["gpu"])


class _Reading(Collector):
    """A collector over one reading: the registry asks it once, for this scrape."""

    def __init__(self, status: dict | None):
        self._status = status

    def collect(self) -> Iterator[Metric]:
        return agent_families(self._status)


def exposition(status: dict | None, accept: str = "") -> tuple[bytes, str]:
    """(body, Content-Type) for one scrape: the OpenMetrics text when the scraper
    asks for it in `accept` (Prometheus does), else the classic text format 0.0.4,
    as prometheus_client's own HTTP handler chooses."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Reading(status))
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type
