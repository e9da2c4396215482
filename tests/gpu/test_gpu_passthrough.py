"""Memory the shim passes through on a real GPU: VMM memory stays counted until the
driver frees it (handle released and mapping gone, in either order), and an IPC handle
opened twice is one mapping, counted once.  The CPU twins are in tests/shim/test_memory.py.
Under the shim cuMemGetInfo reports the GPU's total less what the process holds, so its
figures move by exactly what the shim counts."""

import os
import pathlib
import subprocess

import pytest

HERE = pathlib.Path(__file__).parent


@pytest.fixture(scope="module")
def passthrough_program(cuda_program):
    return cuda_program("passthrough")


def fields_of(done) -> dict:
    assert done.returncode == 0 and "result=ok" in done.stdout, done.stdout + done.stderr[-4000:]
    return dict(pair.split("=", 1) for pair in done.stdout.split() if "=" in pair)


def run(binary, env, *args) -> dict:
    return fields_of(
        subprocess.run([str(binary), *args], capture_output=True, text=True, env=env, timeout=120)
    )


@pytest.mark.parametrize("order", ["unmap_first", "release_first"])
def test_vmm_memory_counts_until_the_driver_frees_it(
    start_agent, shim_env, passthrough_program, order
):
    plain = run(passthrough_program, dict(os.environ), "vmm", order)
    assert plain["value"] == "7"
    agent = start_agent()
    shimmed = run(passthrough_program, shim_env(agent), "vmm", order)
    size = int(shimmed["bytes"])
    assert shimmed["value"] == "7"
    assert int(shimmed["free_before"]) - int(shimmed["free_mapped"]) == size, shimmed
    assert shimmed["free_after"] == shimmed["free_before"], shimmed


def test_an_ipc_handle_opened_twice_is_counted_once(start_agent, shim_env, passthrough_program):
    # The exporter runs without the shim: the shim's managed memory has no IPC handle.
    exporter = subprocess.Popen(
        [str(passthrough_program), "export"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        handle = exporter.stdout.readline().strip().split("=", 1)[1]
        plain = run(passthrough_program, dict(os.environ), "import", handle)
        agent = start_agent()
        shimmed = run(passthrough_program, shim_env(agent), "import", handle)
    finally:
        exporter.communicate("done\n", timeout=60)
    assert plain["same_mapping"] == shimmed["same_mapping"] == "1", (plain, shimmed)
    assert int(shimmed["free_before"]) - int(shimmed["free_open"]) == 64 << 20, shimmed
    assert shimmed["free_after"] == shimmed["free_before"], shimmed
