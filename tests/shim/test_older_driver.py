"""A driver older than the program: the functions it lacks bind to the shim's
exports, whose hooks must answer CUDA_ERROR_NOT_FOUND instead of calling a
function that is not there (before every hook checked, the shim crashed here
with SIGSEGV; without the shim the program stops at a symbol lookup error)."""

from __future__ import annotations

import subprocess

from shim_harness import SHIM, STANDIN_BUILD, clean_env

CUDA_ERROR_NOT_FOUND = 500


def test_calls_an_older_driver_lacks_answer_not_found():
    env = clean_env(
        LD_LIBRARY_PATH=str(STANDIN_BUILD / "old"),
        LD_PRELOAD=str(SHIM),
        NVSHARE_SOCKET="/nonexistent/nvshare.sock",
    )
    done = subprocess.run(
        [str(STANDIN_BUILD / "client_old_driver")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip().splitlines()[-1].split()
    assert line[0] == "client=old_driver"
    results = dict(word.split("=") for word in line[1:])
    assert len(results) == 9
    assert results == {call: str(CUDA_ERROR_NOT_FOUND) for call in results}, results
