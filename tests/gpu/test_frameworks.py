"""JAX, CuPy and Triton under the shim on a real GPU: their memory becomes managed, their
own launch paths wait for the lock, and they compute the same bits as without the shim;
CuPy's Python host callbacks run while processes take turns.

JAX runs with XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async (frameworks.py's default): XLA's own
allocator maps CUDA virtual memory, which the shim passes through unmanaged, with a warning
that names that setting."""

import importlib.util
import pathlib
import sys

import pytest
from json_program import run_json_program, run_side_by_side

HERE = pathlib.Path(__file__).parent
FRAMEWORKS = ["jax", "cupy", "triton"]


def needs(framework):
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed")


def workload(framework, *args):
    return [sys.executable, str(HERE / "frameworks.py"), framework, *args]


def run_workload(framework, env, *args):
    return run_json_program(workload(framework, *args), env)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_framework_is_managed_gated_and_matches_plain_run(framework, start_agent, shim_env):
    needs(framework)
    plain, _ = run_workload(framework, None, "--steps", "10")
    agent = start_agent(idle_release_ms=300)
    shared, stderr = run_workload(
        framework, shim_env(agent, NVSHARE_DEBUG=1), "--steps", "10", "--idle-gap", "1.5"
    )
    assert not plain["managed"]
    assert shared["managed"], stderr[-2000:]
    assert shared["values"] == plain["values"]
    assert shared["checksum"] == plain["checksum"]
    # Each phase follows an idle release and asks again: compute, the framework's launches
    # alone, the read-back.  Had its launches bypassed the shim, the middle phase would not.
    assert len(agent.events("grant")) >= 3, agent.log()
    assert len(agent.events("release")) >= 2, agent.log()
    assert "cannot be made managed" not in stderr, stderr[-2000:]


def test_jax_default_allocator_is_passed_through_with_a_warning_naming_the_fix(
    start_agent, shim_env
):
    needs("jax")
    plain, _ = run_workload("jax", None, "--steps", "5", "--jax-allocator", "default")
    agent = start_agent()
    shared, stderr = run_workload(
        "jax", shim_env(agent), "--steps", "5", "--jax-allocator", "default"
    )
    assert not shared["managed"]
    assert shared["values"] == plain["values"]
    warnings = [line for line in stderr.splitlines() if line.startswith("[nvshare] warning:")]
    assert len(warnings) == 1 and "XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async" in warnings[0], stderr[
        -2000:
    ]


def test_two_jax_processes_alternate_and_compute_as_alone(start_agent, shim_env):
    """Each step also calls back into Python (jax.debug.callback), as notebooks' jax.debug.print does."""
    needs("jax")
    plain, _ = run_workload("jax", None, "--steps", "10", "--jax-callback")
    agent = start_agent(time_quantum_s=1, anti_thrash=True)
    pids, results = run_side_by_side(
        workload("jax", "--seconds", "8", "--jax-callback"), shim_env(agent)
    )
    grants = [event["pid"] for event in agent.events("grant")]
    assert set(grants) == {str(pid) for pid in pids}, agent.log()
    assert sum(1 for a, b in zip(grants, grants[1:]) if a != b) >= 3, agent.log()
    for result in results:
        assert result["managed"]
        assert result["steps"] >= 10
        assert result["values"][:10] == plain["values"][:10]
        assert result["callbacks"] == result["steps"] + 1  # the launch-only phase's step too


@pytest.mark.parametrize("api", ["launch_host_func", "add_callback"])
def test_cupy_python_host_callbacks_run_while_two_processes_alternate(api, start_agent, shim_env):
    """Each step queues a Python callback (it needs the GIL) behind its kernels, and a drop's
    release waits for all queued work: that finishes only because CuPy does not hold the GIL
    while a launch waits at the gate."""
    needs("cupy")
    program = [sys.executable, str(HERE / "host_callbacks.py"), api]
    plain, _ = run_json_program(program)
    agent = start_agent(time_quantum_s=1, anti_thrash=True, idle_release_ms=300)
    _, results = run_side_by_side(program, shim_env(agent), timeout=120)
    for shared in results:
        assert shared["callbacks"] == shared["steps"] and shared["in_order"]
        assert shared["checksum"] == plain["checksum"]
    assert len(agent.events("drop")) >= 3, agent.log()
    assert agent.events("revoke") == [], agent.log()
