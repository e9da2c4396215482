"""A scrape, parsed by prometheus_client's own parsers, says what `nvsharectl
status --json` says at the same moment: the real agent on a private bus, fake
shims in processes of their own (one of them another user's), a grant that was
waited for, a holder asked to drop and revoked, a standing holder and waiter.

The exporter runs as nobody: reading the agent needs nothing but the bus policy's
reads, which are open to everyone (systemd runs it as the user nvshare-metrics)."""

from __future__ import annotations

import json
import math
import os
import queue
import subprocess
import threading
import time
from collections import defaultdict

import pytest
from agent_harness import FAST_CONFIG, GPU0, AgentProcess, ShimClient
from dbus_harness import NOBODY, busctl_on_agent, nvsharectl, property_data, wait_for
from metrics_harness import exchange, get, samples
from other_users import other_user_env, python_as
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)

from nvshare_agent import protocol
from nvshare_agent.protocol import MessageType

GiB = 1 << 30
HOLDING = "nvshare_client_holding_seconds"
GPU_TIME = "nvshare_client_gpu_seconds_total"
WAITED = "nvshare_client_wait_seconds_total"
GROUP_GPU_TIME = "nvshare_share_gpu_seconds_total"
GROUP_WAITED = "nvshare_share_wait_seconds_total"

# A fake shim in a process of its own: HELLO as argv[2], a memory report of argv[3]
# bytes, a lock request; prints each frame's type as it comes, and keeps its
# connection (and any lock) until its stdin closes.
STANDING_CLIENT = """
import sys, threading
from agent_harness import GPU0, ShimClient
client = ShimClient(sys.argv[1], command=sys.argv[2])
client.report_memory(GPU0, int(sys.argv[3]))
client.request()
def frames():
    while True:
        try:
            message = client.recv(3600)
        except TimeoutError:
            continue
        if message is None:
            return
        print(type(message).__name__, getattr(message, "type", ""), flush=True)
threading.Thread(target=frames, daemon=True).start()
sys.stdin.read()
"""


class StandingClient:
    def __init__(self, socket_path, command: str, memory: int, user: list | None = None):
        argv = ["-c", STANDING_CLIENT, str(socket_path), command, str(memory)]
        self.process = subprocess.Popen(
            python_as(user or [], *argv),
            env=other_user_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put("")  # it exited

    def wait_for_grant(self, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no grant within {timeout:g} s") from None
            if not line:
                raise AssertionError(f"client exited with {self.process.wait()} before a grant")
            if line.split() == ["LockMessage", str(int(MessageType.LOCK_GRANT))]:
                return

    def stop(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


@pytest.fixture
def fast_agent(world_dir, bus):
    """The real agent on the private bus, with quick turns: a 1 s quantum, 300 ms to
    answer a drop request before the lock is revoked."""
    agent = AgentProcess(world_dir / "agent", config=FAST_CONFIG, bus=bus.address).start()
    (world_dir / "agent").chmod(0o755)
    wait_for(bus.name_has_owner, "the agent on the bus")
    yield agent
    assert agent.stop() == 0, agent.log()


def expected_samples(status: dict) -> dict:
    """What a scrape must hold, derived from `nvsharectl status --json` by the rules
    of docs/metrics.md (the test's own reading of them, not the exporter's code)."""
    want: dict = {}

    def put(name, labels, value):
        want[(name, frozenset(labels.items()))] = float(value)

    put("nvshare_agent_up", {}, 1)
    put(
        "nvshare_config_error",
        {"problem": status["config_problem"]},
        bool(status["config_problem"]),
    )
    put("nvshare_time_quantum_seconds", {}, status["time_quantum_s"])
    for setting in ("on", "off", "auto"):
        put("nvshare_anti_thrash", {"setting": setting}, setting == status["anti_thrash_mode"])
    for gpu in status["gpus"]:
        on = {"gpu": gpu["uuid"]}
        put("nvshare_gpu_info", {**on, "name": gpu["name"]}, 1)
        if gpu["memory_total_bytes"]:
            put("nvshare_gpu_memory_total_bytes", on, gpu["memory_total_bytes"])
        for mode in ("exclusive", "shared"):
            put("nvshare_gpu_mode", {**on, "mode": mode}, gpu["mode"] == mode)
        if gpu["memory_capacity_bytes"]:
            put("nvshare_gpu_memory_capacity_bytes", on, gpu["memory_capacity_bytes"])
        put("nvshare_gpu_memory_demand_bytes", on, gpu["memory_demand_bytes"])
        put("nvshare_gpu_holders", on, len(gpu["holder_pids"]))
        put("nvshare_gpu_queue_length", on, len(gpu["queue_pids"]))
        statistics = gpu["statistics"]
        for counter in ("grants", "drops", "revokes"):
            put(f"nvshare_{counter}_total", on, statistics[counter])
        for bound, count in statistics["wait_seconds_buckets"]:
            put("nvshare_lock_wait_seconds_bucket", {**on, "le": bound}, count)
        put(
            "nvshare_lock_wait_seconds_bucket",
            {**on, "le": math.inf},
            statistics["wait_seconds_count"],
        )
        put("nvshare_lock_wait_seconds_count", on, statistics["wait_seconds_count"])
        put("nvshare_lock_wait_seconds_sum", on, statistics["wait_seconds_sum"])
    put("nvshare_clients", {}, len(status["clients"]))
    memory, holding, states = defaultdict(int), defaultdict(float), defaultdict(int)
    for client in status["clients"]:
        identity = {
            key: str(client[key]) for key in ("pid", "uid", "user", "command", "unit", "container")
        }
        put("nvshare_client_info", identity, 1)
        for entry in client["gpus"]:
            labels = (entry["uuid"], str(client["pid"]), client["user"], client["command"])
            memory[labels] += entry["allocated_bytes"]
            holding[labels] = max(holding[labels], entry["holding_seconds"])
            for state in ("idle", "waiting", "holding", "draining"):
                states[(*labels, state)] += entry["state"] == state
    names = ("gpu", "pid", "user", "command")
    for labels, value in memory.items():
        put("nvshare_client_memory_bytes", dict(zip(names, labels)), value)
    for labels, value in holding.items():
        put(HOLDING, dict(zip(names, labels)), value)
    for labels, value in states.items():
        put("nvshare_client_state", dict(zip((*names, "state"), labels)), value)
    # GPU time and waits are per process (status merges them into each connection of
    # it): once per process and GPU, under its first connection's command.
    gpu_time, waited = defaultdict(float), defaultdict(float)
    counted = set()
    for client in status["clients"]:
        who = (client["user"], client["unit"], client["container"])
        for entry in client["gpus"]:
            if (client["pid"], entry["uuid"]) in counted:
                continue
            counted.add((client["pid"], entry["uuid"]))
            gpu_time[(entry["uuid"], str(client["pid"]), *who, client["command"])] += entry[
                "gpu_seconds"
            ]
            for cause, seconds in entry["waited_s"].items():
                waited[(entry["uuid"], str(client["pid"]), *who, cause)] += seconds
    usage = ("gpu", "pid", "user", "unit", "pod")
    for labels, value in gpu_time.items():
        put(GPU_TIME, dict(zip((*usage, "command"), labels)), value)
    for labels, value in waited.items():
        put(WAITED, dict(zip((*usage, "cause"), labels)), value)
    for group in status.get("groups", []):
        on = {"gpu": group["gpu"], "group": group["group"]}
        put("nvshare_share_weight", on, group["weight"])
        put("nvshare_share_memory_cap_bytes", on, group["memory_cap_bytes"])
        put("nvshare_share_use", on, group["use"])
        put("nvshare_share_of_gpu_time", on, group["share"])
        put(GROUP_GPU_TIME, on, group["gpu_seconds"])
        for cause, seconds in group["waited_s"].items():
            put(GROUP_WAITED, {**on, "cause": cause}, seconds)
    return want


def waiter_status_cause(status: dict, pid: int) -> str:
    (entry,) = next(client["gpus"] for client in status["clients"] if client["pid"] == pid)
    assert entry["state"] == "waiting" and entry["wait_cause"], entry
    return entry["wait_cause"]


def scrape(bus, accept: str = "") -> str:
    answer = exchange(
        python_as(NOBODY, "-m", "nvshare_metrics", "--bus", bus.address),
        get(accept=accept),
        env=other_user_env(),
    )
    assert answer.status == 200 and answer.returncode == 0, answer
    assert answer.log == "", answer.log  # a good scrape logs nothing (without --debug)
    return answer.body.decode()


# What moves while nothing else does: a holder's time and GPU time, a waiter's wait,
# a share group's GPU time, waits, use and share.
GROWING = (HOLDING, GPU_TIME, WAITED, GROUP_GPU_TIME, GROUP_WAITED)
MOVING = (*GROWING, "nvshare_share_use", "nvshare_share_of_gpu_time")


def without(found: dict, name: str) -> dict:
    """found less the samples that move with time (HOLDING, the GPU time and waits,
    and the groups' use and share)."""
    assert name == HOLDING
    return {key: value for key, value in found.items() if key[0] not in MOVING}


def test_a_scrape_equals_nvsharectl_status_json_of_the_same_moment(fast_agent, bus):
    uuid = protocol.format_uuid(GPU0)
    me = os.getpid()
    # A wait, a drop and a revoke: `first` holds, `second` waits; after the 1 s
    # quantum `first` is asked to drop, ignores it and is revoked 300 ms later;
    # `second` gets the GPU after ~1.3 s and releases it.  Both stay connected:
    # connections of this one process, each with its own command.
    first = ShimClient(fast_agent.socket_path, command='first "quoted" \\ one')
    second = ShimClient(fast_agent.socket_path, command="second")
    first.report_memory(GPU0, 2 * GiB)
    first.request()
    first.wait_grant()
    second.request()
    first.expect(MessageType.DROP_REQUEST, timeout=10)
    first.expect(MessageType.REVOKED, timeout=10)
    second.release(second.wait_grant(timeout=10))
    # A third connection that says the same as `second`: one process's samples
    # with equal labels, which the exporter must add up, not repeat.
    twin = ShimClient(fast_agent.socket_path, command="second")
    twin.report_memory(GPU0, GiB // 2)

    # Then a holder and a waiter that stay: the holder nobody's, the waiter root's,
    # each a process of its own, under a quantum long enough not to end in the test.
    busctl_on_agent(bus.address, "set-property", "TimeQuantum", "u", "3600")
    holder = StandingClient(fast_agent.socket_path, "holder", 3 * GiB, user=NOBODY)
    waiter = None
    try:
        holder.wait_for_grant()
        waiter = StandingClient(fast_agent.socket_path, "waiter", 1 * GiB)
        wait_for(
            lambda: any(
                gpu[4] == [waiter.process.pid] for gpu in property_data(bus.address, "Gpus")
            ),
            "the waiter in the queue",
        )

        # A quiet moment: two scrapes around the status agree (the holding time
        # grows, nothing else changes), so the status between them is comparable.
        before = samples(scrape(bus))
        result = nvsharectl(bus.address, "status", "--json")
        after = samples(scrape(bus))
        assert result.returncode == 0, result.stderr
        status = json.loads(result.stdout)
        assert without(before, HOLDING) == without(after, HOLDING)

        expected = expected_samples(status)
        assert without(before, HOLDING) == without(expected, HOLDING)
        assert set(before) == set(expected)
        for key, value in expected.items():
            if key[0] in GROWING:
                assert before[key] <= value <= after[key], key

        # What happened, read from the scrape itself.
        on = frozenset({("gpu", uuid)})
        assert before[("nvshare_grants_total", on)] == 3  # first, second, holder
        assert before[("nvshare_drops_total", on)] == 1
        assert before[("nvshare_revokes_total", on)] == 1
        assert before[("nvshare_lock_wait_seconds_count", on)] == 3
        waited_long = frozenset({("gpu", uuid), ("le", 1.0)})
        assert before[("nvshare_lock_wait_seconds_bucket", waited_long)] == 2  # second waited
        # second waited first's quantum and grace (1.3 s) less the moments between
        # first's grant and its own request (under load, a few milliseconds).
        assert before[("nvshare_lock_wait_seconds_sum", on)] >= 1.2
        assert before[("nvshare_gpu_holders", on)] == 1
        assert before[("nvshare_gpu_queue_length", on)] == 1
        holder_labels = frozenset(
            {
                ("gpu", uuid),
                ("pid", str(holder.process.pid)),
                ("user", "nobody"),
                ("command", "holder"),
            }
        )
        assert before[("nvshare_client_memory_bytes", holder_labels)] == 3 * GiB
        assert before[("nvshare_client_state", holder_labels | {("state", "holding")})] == 1
        # This process's two connections are one process's series, summed.
        mine = {("gpu", uuid), ("pid", str(me)), ("user", "root")}
        first_labels = frozenset(mine | {("command", 'first "quoted" \\ one')})
        assert before[("nvshare_client_memory_bytes", first_labels)] == 2 * GiB
        assert before[("nvshare_client_state", first_labels | {("state", "idle")})] == 1
        twins = frozenset(mine | {("command", "second")})
        assert before[("nvshare_client_memory_bytes", twins)] == GiB // 2
        assert before[("nvshare_client_state", twins | {("state", "idle")})] == 2
        assert before[("nvshare_clients", frozenset())] == 5

        # Who used the GPU and who waited, and why: the holder's GPU time is
        # at least its turn so far; the waiter waits its turn (anti-thrash on).
        holder_usage = {("gpu", uuid), ("pid", str(holder.process.pid)), ("user", "nobody")}
        (gpu_time,) = [
            value
            for (name, labels), value in before.items()
            if name == GPU_TIME and holder_usage | {("command", "holder")} <= labels
        ]
        assert gpu_time > 0
        waiter_wait = {("gpu", uuid), ("pid", str(waiter.process.pid)), ("user", "root")}
        causes = {
            dict(labels)["cause"]: value
            for (name, labels), value in before.items()
            if name == WAITED and waiter_wait <= labels
        }
        assert list(causes) == [waiter_status_cause(status, waiter.process.pid)]
        assert next(iter(causes.values())) > 0

        # The OpenMetrics text that Prometheus asks for holds the same samples.
        openmetrics = samples(
            scrape(bus, "application/openmetrics-text;version=1.0.0"), openmetrics_families
        )
        assert without(openmetrics, HOLDING) == without(before, HOLDING)
    finally:
        holder.stop()
        if waiter is not None:
            waiter.stop()
        for client in (first, second, twin):
            client.close()
    assert fast_agent.alive()


def test_scrapes_while_clients_come_and_go_leave_the_agent_serving(fast_agent, bus):
    # Many scrapes of an agent whose state changes under them: each one parses,
    # and the counters never go down.
    grants_seen = []
    clients = []
    try:
        for round_number in range(4):
            clients.append(ShimClient(fast_agent.socket_path, command=f"c{round_number}"))
            clients[-1].request()
            clients[-1].release(clients[-1].wait_grant(timeout=10))
            found = samples(scrape(bus))
            grants_seen.append(
                sum(v for (name, _), v in found.items() if name == "nvshare_grants_total")
            )
    finally:
        for client in clients:
            client.close()
    assert grants_seen == sorted(grants_seen) and grants_seen[-1] == 4
    assert fast_agent.alive()
