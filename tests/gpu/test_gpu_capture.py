"""Stream capture beside the shim's own work, on a real GPU: another thread's launches
during a global-mode capture (the process gets the GPU, prefetches and bounds its queue
while the capture is open) leave the capture intact, a capture ended by another
thread ends for its own thread too, so does one whose stream is destroyed or whose
device is reset, and one left open by an exited thread is not inherited by the next
thread.  The CPU twin is tests/shim/test_capture.py."""

import os
import pathlib
import re
import subprocess

import pytest

HERE = pathlib.Path(__file__).parent
CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908


@pytest.fixture(scope="module")
def capture_program(cuda_program):
    return cuda_program("capture")


def run(binary, env, *args):
    done = subprocess.run(
        [str(binary), *map(str, args)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0 and "result=ok" in done.stdout, done.stdout + done.stderr[-4000:]
    fields = dict(pair.split("=", 1) for pair in done.stdout.split() if "=" in pair)
    return fields, done.stderr


def during_capture(stderr: str) -> str:
    return stderr.split("capture: begun\n", 1)[1].split("capture: ending\n", 1)[0]


def test_launches_beside_a_global_capture_leave_it_intact(start_agent, shim_env, capture_program):
    plain, _ = run(capture_program, dict(os.environ), "beside", 2000)
    agent = start_agent()
    shimmed, stderr = run(capture_program, shim_env(agent, NVSHARE_DEBUG=1), "beside", 2000)
    assert (
        plain
        == shimmed
        == {
            "result": "ok",
            "status_before_end": "1",
            "end": "0",
            "counted": "2000",
            "graph_counted": "2",
        }
    ), (plain, shimmed)
    # The premise: the grant and its prefetch came while the capture was open.
    during = during_capture(stderr)
    assert re.search(r"grant gpu=0 ", during) and re.search(
        r"prefetch gpu=0 allocations=[1-9]", during
    ), stderr[-4000:]
    assert "[nvshare] warning" not in stderr, stderr[-4000:]


@pytest.mark.parametrize(
    "mode,end", [("relaxed", 0), ("global", CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD)]
)
def test_a_capture_ended_by_another_thread_ends_for_its_own_thread(
    start_agent, shim_env, capture_program, mode, end
):
    plain, _ = run(capture_program, dict(os.environ), "ended_elsewhere", mode)
    agent = start_agent()
    shimmed, stderr = run(
        capture_program, shim_env(agent, NVSHARE_DEBUG=1), "ended_elsewhere", mode
    )
    assert (plain["end"], plain["status_after_end"], plain["managed"], plain["counted"]) == (
        str(end),
        "0",
        "0",
        "42",
    )
    assert (shimmed["end"], shimmed["status_after_end"], shimmed["counted"]) == (
        str(end),
        "0",
        "42",
    )
    # Capturing no more: the stream-ordered allocation is converted, the work after it waits for the lock.
    assert shimmed["managed"] == "1", stderr[-4000:]
    assert "grant gpu=0 " not in during_capture(stderr), "the captured launch asked for the GPU"
    assert re.search(r"grant gpu=0 ", stderr.split("capture: ending\n", 1)[1]), stderr[-4000:]


def test_a_capture_left_open_by_an_exited_thread_leaves_the_next_thread_gated(
    start_agent, shim_env, capture_program
):
    # The exited thread's capture (thread-local mode) stays open; the next thread, given its
    # pthread_t by glibc, began none: the driver lets it allocate, and under the shim its
    # allocation is converted and its work waits for the lock.
    plain, _ = run(capture_program, dict(os.environ), "left_open")
    agent = start_agent()
    shimmed, stderr = run(capture_program, shim_env(agent, NVSHARE_DEBUG=1), "left_open")
    assert plain == {
        "result": "ok",
        "reused": "1",
        "status_left_open": "1",
        "managed": "0",
        "counted": "42",
    }, plain
    assert shimmed == {**plain, "managed": "1"}, (shimmed, stderr[-4000:])
    assert re.search(r"grant gpu=0 ", stderr.split("capture: left open\n", 1)[1]), stderr[-4000:]


@pytest.mark.parametrize("how", ["destroy", "reset"])
def test_a_capture_the_driver_ends_ends_for_its_thread(start_agent, shim_env, capture_program, how):
    # Destroying the capturing stream, or cudaDeviceReset, ends the capture (the device
    # synchronises again afterwards); the thread's work is converted and gated again.
    plain, _ = run(capture_program, dict(os.environ), "ended_by", how)
    agent = start_agent()
    shimmed, stderr = run(capture_program, shim_env(agent, NVSHARE_DEBUG=1), "ended_by", how)
    assert plain == {"result": "ok", "sync_after": "0", "managed": "0", "counted": "42"}, plain
    assert shimmed == {**plain, "managed": "1"}, (shimmed, stderr[-4000:])
    assert "grant gpu=0 " not in during_capture(stderr), "the captured launch asked for the GPU"
    assert re.search(r"grant gpu=0 ", stderr.split("capture: ending\n", 1)[1]), stderr[-4000:]


@pytest.mark.parametrize("mode", ["relaxed", "global"])
def test_another_threads_work_into_a_capture_does_not_ask_for_the_gpu(
    start_agent, shim_env, capture_program, mode
):
    # A second thread's memset and kernel into the capturing stream only add graph nodes.
    plain, _ = run(capture_program, dict(os.environ), "into_other", mode)
    agent = start_agent()
    shimmed, stderr = run(capture_program, shim_env(agent, NVSHARE_DEBUG=1), "into_other", mode)
    assert plain == shimmed == {"result": "ok", "end": "0", "graph_counted": "1"}, (plain, shimmed)
    assert "request gpu=0" not in during_capture(stderr), stderr[-4000:]
