"""Several CUDA contexts in one process, a destroyed context and cudaDeviceReset,
under the shim on a real GPU.  The CPU twin is tests/shim/test_contexts.py (the module
names differ: pytest imports test modules by their basename)."""

import pathlib
import re
import subprocess

import pytest

HERE = pathlib.Path(__file__).parent


@pytest.fixture(scope="module")
def contexts_program(cuda_program):
    return cuda_program("contexts")


def run(binary, env, *args, timeout=120):
    done = subprocess.run(
        [str(binary), *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout
    )
    assert done.returncode == 0 and "result=ok" in done.stdout, done.stdout + done.stderr[-4000:]
    return done


def test_release_waits_for_a_context_that_was_not_used_last(
    start_agent, shim_env, contexts_program
):
    # A spins 3 s; B runs last; the idle release (1 s after B's last launch) must wait for A:
    # the shim asks every context before it calls the process idle, and holds on while A
    # spins (or drains it); either way the GPU is let go only once A is done.
    agent = start_agent(idle_release_ms=1000)
    done = run(contexts_program, shim_env(agent, NVSHARE_DEBUG=1), "two", 3000, 4000)
    releases = [
        (float(held), float(drain))
        for held, drain in re.findall(
            r"release gpu=0 lease=\d+ reason=\w+ held_ms=([\d.]+) drain_ms=([\d.]+)",
            done.stderr,
        )
    ]
    assert releases, done.stderr[-4000:]
    held_ms, drain_ms = releases[0]
    assert held_ms >= 3000, (
        f"released {held_ms} ms after the grant (drain {drain_ms} ms), while A still spun\n"
        f"{done.stderr[-4000:]}"
    )


def test_destroyed_context_and_device_reset_leave_the_shim_sound(
    start_agent, shim_env, contexts_program
):
    # 300 launches a context: the queue bound records events in each, which the driver then
    # frees with the context (using a freed event and stream killed a probe on the H100).
    agent = start_agent(idle_release_ms=500)
    done = run(contexts_program, shim_env(agent, NVSHARE_DEBUG=1), "lifecycle", 300)
    assert "primary context reset gpu=0 result=0" in done.stderr, done.stderr[-4000:]
    # The reset and the destroy; the application's release leaves the runtime's reference.
    assert done.stderr.count("context gone") == 2, done.stderr[-4000:]
    assert "primary context release gpu=0 result=0 still_active=1" in done.stderr, done.stderr[
        -4000:
    ]
    # At least the 1 MiB left behind in the destroyed context (the runtime may add its own).
    assert re.search(r"forgot \d+ allocations of a destroyed context", done.stderr), done.stderr[
        -4000:
    ]
    assert "[nvshare] warning" not in done.stderr, done.stderr[-4000:]
    assert len(agent.events("grant")) >= 2, agent.log()  # granted again after the idle release
