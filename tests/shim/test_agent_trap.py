"""The suite's trap (tests/conftest.py) catches a process that asks for the node's agent:
a shimmed client started with the session's environment, no socket of its own."""

import os
import subprocess

from agent_harness import wait_until
from shim_harness import SHIM, STANDIN_BUILD


def test_a_client_with_no_socket_of_its_own_is_caught(no_process_reaches_the_node_agent):
    caught = no_process_reaches_the_node_agent
    before = len(caught)
    env = dict(os.environ, LD_PRELOAD=str(SHIM), LD_LIBRARY_PATH=str(STANDIN_BUILD))
    done = subprocess.run(
        [str(STANDIN_BUILD / "client_linked"), "--loops", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    wait_until(lambda: len(caught) > before, what="the trap to see the client")
    assert "client_linked" in caught[-1], caught
    del caught[before:]  # this test's own catch, not a leak
