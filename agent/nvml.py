"""The NVML adapter: which GPUs this node has (UUID, name, total memory), and
how much memory each process holds on them.

NVML is read in a child process (`python -m nvshare_agent.nvml_reader`), never in the
agent: nvmlInit maps about 20 MB that nvmlShutdown never gives back (measured
on the H100 node), and a wedged driver can hang nvmlInit, which would
otherwise hang the agent with it.  The child prints JSON lines: one with the
inventory, or with --watch SECONDS one per reading of the processes, until the
agent stops it (or goes away: its next write then fails and it exits).

Without NVML (CI, containers without the driver) there is no inventory, the
agent learns GPUs from its clients' HELLO frames, and anti-thrash auto counts
only what its clients report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

from .protocol import parse_uuid

READ_TIMEOUT_S = 60.0
# How often the processes' memory is read for anti-thrash auto.  NVML's
# process query costs ~1 ms per GPU in the child; memory that others allocate
# outside nvshare changes slowly.
WATCH_INTERVAL_S = 2.0
# A reading line is a few hundred bytes per process: cap what one line may be.
MAX_LINE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class GpuInfo:
    uuid: bytes
    name: str
    memory_total_bytes: int
    # NVML's number for it (nvidia-smi's): what settings by index ([gpu:1]) mean.
    index: int | None = None


@dataclass(frozen=True, slots=True)
class NodeInventory:
    gpus: list[GpuInfo]
    # MIG instances: ids a client may name (the driver enumerates them as
    # devices), not GPUs of their own here.
    mig_uuids: tuple[bytes, ...]
    problem: str | None


def _child_environment() -> dict:
    # The child must import this package the way the agent did, whatever put it on sys.path.
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


async def _start_reader(*options: str, **pipes) -> asyncio.subprocess.Process:
    """The reader child (`python -m nvshare_agent.nvml_reader OPTIONS`), started whole.

    create_subprocess_exec cancelled half way (a SIGTERM while it connects the
    pipes) kills the child through subprocess.Popen, whose poll() may reap it
    behind asyncio's child watcher (see _stop_reader).  So the start runs to its
    end, shielded, and a cancellation then stops the child before it goes on."""
    starting = asyncio.ensure_future(
        asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            f"{__package__}.nvml_reader",
            *options,
            stdin=asyncio.subprocess.DEVNULL,
            env=_child_environment(),
            **pipes,
        )
    )
    try:
        return await asyncio.shield(starting)
    except asyncio.CancelledError:
        with contextlib.suppress(OSError):  # no child: nothing to stop
            await _stop_reader(await asyncio.shield(starting))
        raise


async def _stop_reader(child: asyncio.subprocess.Process) -> None:
    """Kills the reader, if it runs, and waits until asyncio's watcher has reaped it.

    os.kill, not child.kill(): Popen.send_signal first polls, a waitpid of its own
    that races the watcher's thread for a child that has just exited (systemd
    signals the reader with the agent when it stops the unit); when it wins, the
    watcher logs "Unknown child process pid" and the exit status is lost.  The pid
    is ours until the watcher reaps it, which it reports (returncode) at once."""
    if child.returncode is None:
        try:
            os.kill(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # reaped a moment ago; the report is on its way
    await child.wait()


async def read_node(timeout_s: float = READ_TIMEOUT_S) -> NodeInventory:
    """The inventory, or an empty one with a one-line reason when NVML is not usable."""
    try:
        child = await _start_reader(stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    except OSError as e:
        return NodeInventory([], (), f"could not start the NVML reader: {e}")
    try:
        # asyncio.timeout, not wait_for: 3.11's wait_for swallows a cancellation
        # that comes in the loop turn the reader answers (dbus_connection.py).
        async with asyncio.timeout(timeout_s):
            out, err = await child.communicate()
    except TimeoutError:
        return NodeInventory([], (), f"NVML did not answer within {timeout_s:g} s")
    finally:
        await _stop_reader(child)  # timed out, or the agent is stopping
    try:
        answer = json.loads(out.decode().strip().splitlines()[-1])
        gpus = [
            GpuInfo(
                raw,
                g["name"],
                int(g["memory_total_bytes"]),
                None if g.get("index") is None else int(g["index"]),
            )
            for g in answer["gpus"]
            if (raw := _raw_uuid(g["uuid"])) is not None
        ]
        mig = tuple(raw for u in answer.get("mig", ()) if (raw := _raw_uuid(u)) is not None)
        return NodeInventory(gpus, mig, answer["problem"])
    except (ValueError, LookupError, TypeError):
        last = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        return NodeInventory([], (), f"NVML reader failed (exit status {child.returncode}): {last}")


async def read_inventory(timeout_s: float = READ_TIMEOUT_S) -> tuple[list[GpuInfo], str | None]:
    """Returns (GPUs, None), or ([], one-line reason) when NVML is not usable."""
    node = await read_node(timeout_s)
    return node.gpus, node.problem


async def watch_processes(
    interval_s: float = WATCH_INTERVAL_S,
) -> AsyncIterator[dict[bytes, dict[int, int]]]:
    """Every interval_s, each GPU's processes: uuid -> {pid: bytes}.  Ends (with a
    one-line reason in the exception) when NVML cannot be read."""
    child = await _start_reader(
        "--watch",
        str(interval_s),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        limit=MAX_LINE_BYTES,
    )
    assert child.stdout is not None  # stdout=PIPE
    try:
        while True:
            line = await child.stdout.readline()
            if not line:
                raise RuntimeError(f"the NVML reader stopped (exit status {await child.wait()})")
            answer = json.loads(line)
            if answer.get("problem"):
                raise RuntimeError(answer["problem"])
            yield {
                raw: {int(pid): int(used) for pid, used in rows}
                for uuid, rows in answer["processes"].items()
                if (raw := _raw_uuid(uuid)) is not None
            }
    finally:
        await _stop_reader(child)


def _raw_uuid(text: str) -> bytes | None:
    """NVML's "GPU-<hex>" or "MIG-<hex>" as the 16 bytes a shim sends."""
    try:
        return parse_uuid(text.removeprefix("MIG-"))
    except ValueError:
        return None  # an old driver's "MIG-GPU-.../n/m" form names no single id
