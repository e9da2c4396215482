#!/usr/bin/env python3
"""Agent lock-handoff benchmark: no GPU needed.

Starts the agent (`python -m nvshare_agent`, anti-thrash on, default INFO logging
into a file as under journald) on a temporary socket, then for each N in
--clients runs N client processes that cycle request -> grant -> release as
fast as they can on one GPU.  Clients are separate processes with blocking
sockets speaking nvshare_agent.protocol.

Handoff latency: one holder's RELEASED sent -> the next client's LOCK_GRANT
received (leases are numbered in grant order, so release of lease L pairs with
the grant of lease L+1; CLOCK_MONOTONIC is shared by all processes).
Finally it connects --idle-clients clients (each says hello and queues for the
GPU) and reads the agent's VmRSS, and again after --churn connections have come and
gone in two halves (growth over the second half would be a leak).

    .venv/bin/python bench/agent_bench.py                 # 10 and 100 clients; RSS at 1,000, and after
    #                                                       20,000 come and go
    .venv/bin/python bench/agent_bench.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import queue
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nvshare_agent import protocol
from nvshare_agent.protocol import MessageType

GPU = protocol.parse_uuid("GPU-00000000-0000-4000-8000-0000000be0c4")
CONFIG = "[scheduler]\ntime_quantum = 86400\nanti_thrash = on\n"


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


class BlockingClient:
    def __init__(self, path: str, command: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.reader = protocol.FrameReader()
        self.inbox: list = []
        self.sock.sendall(protocol.encode_hello([GPU], command))
        assert isinstance(self.next(), protocol.WireSettings)

    def next(self):
        while not self.inbox:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("agent closed the connection")
            self.inbox.extend(self.reader.feed(data))
        return self.inbox.pop(0)

    def next_grant(self) -> protocol.LockMessage:
        """The next LOCK_GRANT, past the frames that do not concern the lock: the agent's
        WELCOME after SETTINGS, a waiting client's KEEPALIVE, MEMORY_CAP (minimal_relay
        sends none of them)."""
        while True:
            message = self.next()
            if type(message) is protocol.LockMessage:
                if message.type == MessageType.LOCK_GRANT:
                    return message
                raise RuntimeError(f"expected LOCK_GRANT, got {MessageType(message.type).name}")
            if type(message) is protocol.Error:
                raise RuntimeError(f"agent error {message.code}: {message.text}")


def cycling_client(path: str, index: int, ready, go, stop_at_holder, results) -> None:
    client = BlockingClient(path, f"bench{index}")
    request = protocol.encode_lock(MessageType.LOCK_REQUEST, GPU)
    grants, releases = [], []
    ready.put(index)
    go.wait()
    stop_at = stop_at_holder.value
    sock = client.sock
    while now_ns() < stop_at:
        sock.sendall(request)
        grant = client.next_grant()
        received = now_ns()
        release = protocol.encode_lock(MessageType.RELEASED, GPU, grant.lease)
        sent = now_ns()
        sock.sendall(release)
        grants.append((grant.lease, received))
        releases.append((grant.lease, sent))
    sock.close()
    results.put((grants, releases))


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (fields 14 and 15 of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def next_result(results, procs: list, deadline: float):
    """One client's results; a client that died (its traceback is on stderr) stops the
    bench at once instead of at the deadline."""
    while time.monotonic() < deadline:
        try:
            return results.get(timeout=0.5)
        except queue.Empty:
            failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if failed:
                sys.exit(f"agent_bench: a client failed (exit code {failed[0]})")
    sys.exit("agent_bench: the clients did not finish in time")


def run_cycle(path: str, clients: int, seconds: float, agent_pid: int) -> dict:
    ctx = mp.get_context("fork")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    stop_at = ctx.Value("q", 0)
    procs = [
        ctx.Process(target=cycling_client, args=(path, i, ready, go, stop_at, results))
        for i in range(clients)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=60)
    cpu_before = cpu_seconds(agent_pid)
    start = now_ns()
    stop_at.value = start + int(seconds * 1e9)
    go.set()
    grant_at, release_at = {}, {}
    deadline = time.monotonic() + seconds + 60
    for _ in procs:
        grants, releases = next_result(results, procs, deadline)
        grant_at.update(grants)
        release_at.update(releases)
    agent_cpu = cpu_seconds(agent_pid) - cpu_before
    for p in procs:
        p.join()
    latencies = sorted(
        grant_at[lease + 1] - sent for lease, sent in release_at.items() if lease + 1 in grant_at
    )
    times = sorted(grant_at.values())
    span = (times[-1] - times[0]) / 1e9
    return {
        "clients": clients,
        "handoffs": len(latencies),
        "handoffs_per_s": round(len(latencies) / span),
        "p50_us": round(latencies[len(latencies) // 2] / 1e3, 1),
        "p99_us": round(latencies[int(len(latencies) * 0.99)] / 1e3, 1),
        "mean_us": round(statistics.fmean(latencies) / 1e3, 1),
        "agent_cpu_us_per_handoff": round(agent_cpu / max(1, len(latencies)) * 1e6, 1),
    }


def rss_with_idle_clients(path: str, agent_pid: int, clients: int) -> dict:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    before = rss_bytes(agent_pid)
    held = []
    request = protocol.encode_lock(MessageType.LOCK_REQUEST, GPU)
    for i in range(clients):
        c = BlockingClient(path, f"idle{i}")
        c.sock.sendall(request)  # one holder, the rest queued: the state a busy node keeps
        held.append(c)
    held[0].next_grant()  # the first one's grant: the agent has seen them all by now
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and f"idle{clients - 1}" not in open(LOG_PATH).read():
        time.sleep(0.05)
    after = rss_bytes(agent_pid)
    for c in held:
        c.sock.close()
    return {
        "clients": clients,
        "rss_before_mb": round(before / 2**20, 1),
        "rss_mb": round(after / 2**20, 1),
    }


def rss_after_churn(path: str, agent_pid: int, connections: int) -> dict:
    """Connections that come and go (hello, request, grant, release, close), in two equal batches:
    an agent that keeps anything per connection grows between the first batch and the second."""
    request = protocol.encode_lock(MessageType.LOCK_REQUEST, GPU)
    rss = [rss_bytes(agent_pid)]
    started = time.monotonic()
    for _ in range(2):
        for i in range(connections // 2):
            client = BlockingClient(path, f"churn{i}")
            client.sock.sendall(request)
            grant = client.next_grant()
            client.sock.sendall(protocol.encode_lock(MessageType.RELEASED, GPU, grant.lease))
            client.sock.close()
        time.sleep(0.5)  # the agent sees the last ones go
        rss.append(rss_bytes(agent_pid))
    return {
        "connections": connections // 2 * 2,
        "per_s": round(connections / (time.monotonic() - started)),
        "rss_mb": [round(value / 2**20, 1) for value in rss],
        "growth_second_batch_kb": round((rss[2] - rss[1]) / 1024),
    }


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


LOG_PATH = ""


def main() -> int:
    global LOG_PATH
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100])
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="measuring time per client count"
    )
    parser.add_argument("--idle-clients", type=int, default=1000)
    parser.add_argument(
        "--churn",
        type=int,
        default=20000,
        help="connections that come and go, for the agent's RSS after them (0: skip)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="run the clients against bench/minimal_relay.py instead of the agent: the floor "
        "this machine and these clients allow",
    )
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="interpreter command line for the server, e.g. 'python3 -S' to leave out the start-up "
        "hooks (.pth files) of a crowded site-packages",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="agent on the first CPU, clients on the others (less preemption noise)",
    )
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="nvshare-bench-"))
    sock_path = workdir / "scheduler.sock"
    (workdir / "nvshare.conf").write_text(CONFIG)
    LOG_PATH = str(workdir / "agent.log")
    with open(LOG_PATH, "wb") as log:
        server = (
            [str(Path(__file__).with_name("minimal_relay.py"))]
            if args.baseline
            else ["-m", "nvshare_agent"]
        )
        agent = subprocess.Popen(
            [
                *shlex.split(args.python),
                *server,
                "--socket",
                str(sock_path),
                "--bus",
                "none",
                "--state-dir",
                str(workdir / "state"),
                "--config",
                str(workdir / "nvshare.conf"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    cpus = sorted(os.sched_getaffinity(0))
    if args.pin and len(cpus) > 1:
        os.sched_setaffinity(agent.pid, {cpus[0]})
        os.sched_setaffinity(0, set(cpus[1:]))  # inherited by the forked clients
    try:
        deadline = time.monotonic() + 30
        while not sock_path.exists():
            if agent.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"agent did not start; log in {LOG_PATH}")
            time.sleep(0.05)
        results = {
            "date": time.strftime("%Y-%m-%d"),
            "machine": machine(),
            "cycles": [],
            "server": "minimal_relay" if args.baseline else "nvshare-agent",
        }
        for n in args.clients:
            r = run_cycle(str(sock_path), n, args.seconds, agent.pid)
            results["cycles"].append(r)
            print(
                f"{n:5d} clients: handoff p50 {r['p50_us']:7.1f} us  p99 {r['p99_us']:7.1f} us  "
                f"{r['handoffs_per_s']:6d} handoffs/s  ({r['handoffs']} handoffs, "
                f"agent CPU {r['agent_cpu_us_per_handoff']} us each)",
                flush=True,
            )
        if args.idle_clients:
            r = rss_with_idle_clients(str(sock_path), agent.pid, args.idle_clients)
            results["rss"] = r
            print(
                f"{r['clients']:5d} clients connected: agent RSS {r['rss_mb']} MB "
                f"(idle: {r['rss_before_mb']} MB)"
            )
        if args.churn:
            r = rss_after_churn(str(sock_path), agent.pid, args.churn)
            results["churn"] = r
            print(
                f"{r['connections']:5d} connections came and went ({r['per_s']}/s): agent RSS "
                f"{' -> '.join(str(v) for v in r['rss_mb'])} MB, second half "
                f"{r['growth_second_batch_kb']:+d} KiB"
            )
        if args.json:
            args.json.write_text(json.dumps(results, indent=2) + "\n")
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(30)
    # Kept when anything failed: its agent.log says why.  CI runs this on every push.
    shutil.rmtree(workdir)
    return 0


def machine() -> str:
    model = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    system = f"{platform.system()} {platform.release()}"
    return f"{model}, {os.cpu_count()} CPUs, {system}, Python {platform.python_version()}"


if __name__ == "__main__":
    sys.exit(main())
