"""A process that never uses CUDA sees nothing of the shim; bad settings warn once."""

import re
import subprocess
import sys

import pytest
from agent_harness import ShimClient
from shim_harness import SHIM, STANDIN_BUILD, clean_env, without_node_preload

NONCUDA = STANDIN_BUILD / "noncuda"
BAD_SETTINGS = {
    "NVSHARE_DEBUG": "verbose",
    "NVSHARE_MAX_QUEUED_MS": "-5",
    "NVSHARE_PREFETCH": "maybe",
    "NVSHARE_ENABLE_SINGLE_OVERSUB": "2",
}


def no_client_connected(world, agent) -> bool:
    """True when no shim connected; a marker connection first flushes the agent's log past our runs."""
    with ShimClient(world.socket_path, command="marker"):
        agent.wait_for_log(r"INFO connect pid=\d+ .*command=marker")
    return not re.search(r"INFO connect pid=\d+ .*command=(?!marker)", agent.log())


def run(argv, env):
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def report(stdout: str) -> dict:
    lines = stdout.splitlines()
    env = sorted(
        line for line in lines if line.startswith("env ") and not line.startswith("env LD_PRELOAD=")
    )
    fields = dict(
        line.split("=", 1) for line in lines if not line.startswith("env ") and "=" in line
    )
    return {**fields, "env": env}


@pytest.mark.parametrize(
    "settings", [{"NVSHARE_DEBUG": "1"}, BAD_SETTINGS], ids=["debug", "bad-settings"]
)
def test_non_cuda_program_is_untouched(world, agent, settings):
    env = clean_env(NVSHARE_SOCKET=world.socket_path, LD_LIBRARY_PATH=STANDIN_BUILD, **settings)
    # The plain run has no shim at all, also on a node with nvshare installed.
    alone = without_node_preload()
    plain = run([*alone, NONCUDA], env)
    preloaded = run([*alone, NONCUDA], dict(env, LD_PRELOAD=str(SHIM)))
    assert plain.returncode == preloaded.returncode == 0
    assert preloaded.stderr == "", "the shim wrote something in a non-CUDA process"
    before, after = report(plain.stdout), report(preloaded.stdout)
    assert after["libnvshare"] == "1", "the preload did not happen at all"
    assert after["libcuda"] == "0", "the shim loaded libcuda in a process that never used CUDA"
    assert after["threads"] == before["threads"] == "1"
    assert after["cuInit_found"] == before["cuInit_found"] == "0", (
        "a probe for CUDA found the shim's cuInit"
    )
    assert after["fds"] == before["fds"]
    assert after["env"] == before["env"]
    assert no_client_connected(world, agent)


@pytest.mark.parametrize(
    "argv", [["/bin/true"], [sys.executable, "-c", "pass"]], ids=["true", "python"]
)
def test_common_programs_are_silent_under_the_preload(world, agent, argv):
    env = clean_env(NVSHARE_SOCKET=world.socket_path, NVSHARE_DEBUG="1", LD_PRELOAD=str(SHIM))
    done = run(argv, env)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert no_client_connected(world, agent)


def test_bad_settings_warn_once_each_and_defaults_apply(world, agent):
    # One copy of the shim: an installed one beside it would read the same variables.
    client = world.client("linked", "--loops", 2, prefix=without_node_preload(), **BAD_SETTINGS)
    client.finish_ok()
    warnings = client.warnings()
    for name in BAD_SETTINGS:
        named = [w for w in warnings if name in w]
        assert len(named) == 1, f"{name}: expected one warning\n{client.stderr}"
    assert len(warnings) == len(BAD_SETTINGS), client.stderr
    assert not [line for line in client.stderr.splitlines() if not line.startswith("[nvshare] ")], (
        client.stderr
    )


def test_hello_names_the_process(world, agent):
    client = world.client("procaddr", "--loops", 1)
    client.finish_ok()
    agent.wait_for_log(rf"connect pid={client.pid} .*command=client_procaddr\b")
