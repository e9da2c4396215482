"""Stream capture beside the shim's own work.  The stand-in applies the capture rules
driver 580 applied on the H100 (tests/standin/standin_capture.c): a synchronising or
querying call from a thread in global mode invalidates another thread's global-mode
capture.  The shim's own calls (a grant's prefetch, the queue bound's event queries and
waits) must never be that call; a capture ended by another thread ends for the
thread that began it too; and one left open by an exited thread is not inherited by
the next thread given its pthread_t."""

import re
import time

import pytest
from agent_harness import ShimClient, wait_until
from shim_harness import STANDIN_GPU

from nvshare_agent import protocol

GPU = protocol.parse_uuid(STANDIN_GPU)


def between(calls, first: str, last: str):
    """The calls after the first call named first and before the first named last."""
    names = [c.function for c in calls]
    return calls[names.index(first) + 1 : names.index(last)]


@pytest.mark.parametrize("prefetch", ["1", "0"], ids=["prefetch", "no-prefetch"])
def test_launches_beside_a_global_capture_leave_it_intact(world, agent, prefetch):
    # 200 launches from a second thread while the main thread captures: the process gets
    # the GPU (a grant, with its prefetch unless NVSHARE_PREFETCH=0) and the queue bound
    # marks and waits, all while the capture is open.
    client = world.client("capture", "beside", 200, kernel_us=200, NVSHARE_PREFETCH=prefetch)
    result = client.finish_ok()
    calls = world.calls(client.pid)
    during = between(calls, "cuStreamBeginCapture_v2", "cuStreamEndCapture")
    expected = {"cuEventQuery", "cuEventSynchronize"} | (
        {"cuMemPrefetchAsync_v2"} if prefetch == "1" else set()
    )
    shims_own = {c.function for c in during} & {
        "cuMemPrefetchAsync_v2",
        "cuEventQuery",
        "cuEventSynchronize",
    }
    assert shims_own == expected, (
        "the test did not make the shim prefetch, query and wait during the capture"
    )
    invalidated = [c.fields for c in calls if c.function == "@capture_invalidated"]
    assert invalidated == [], f"the shim invalidated the application's capture: {invalidated}"
    assert (result["status_before_end"], result["end"]) == ("1", "0")
    assert result["counted"] == "200"
    agent.wait_for_log(rf"grant gpu={STANDIN_GPU} pid={client.pid}\b")


def run_behind_a_holder(world, agent, *client_args):
    """Runs the client while another process holds the GPU, which it gives back once the
    client has asked for it.  Returns the result, the client's calls, and when the GPU was
    given back: gated calls before then (other than captured ones) passed without the lock."""
    with ShimClient(world.socket_path, gpus=(GPU,), command="holder") as holder:
        holder.request(GPU)
        grant = holder.wait_grant(GPU)
        client = world.client(*client_args)
        request = re.compile(rf"request gpu={STANDIN_GPU} pid={client.pid}\b")
        wait_until(
            lambda: request.search(agent.log()) or not client.running(), what="the client's request"
        )
        assert client.running(), (
            f"the client ran to its end without asking for the GPU\n{client.describe()}"
        )
        time.sleep(0.3)
        assert client.running(), client.describe()
        released_at = time.time()
        holder.release(grant)
        result = client.finish_ok()
    calls = world.calls(client.pid)
    early = [c for c in calls if c.gated and c.fields.get("captured") != "1" and c.t < released_at]
    assert early == [], f"GPU work before the grant: {early[:3]}"
    return result, calls


def assert_work_after_the_capture_was_converted(result, calls):
    """The client captured one launch (which passed the gate); its stream-ordered allocation
    after the capture was converted, and its kernel counted 41 + 1 there."""
    assert result["managed"] == "1", (
        "a stream-ordered allocation after the capture was not converted"
    )
    assert result["counted"] == "42"
    assert len([c for c in calls if c.gated and c.fields.get("captured") == "1"]) == 1


@pytest.mark.parametrize("mode,end", [("relaxed", "0"), ("global", "908")])
def test_a_capture_ended_by_another_thread_leaves_its_thread_gated_again(world, agent, mode, end):
    # 908: CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, which ends the capture all the same.
    # The launch into the capture passes without the lock; the work after it waits.
    result, calls = run_behind_a_holder(world, agent, "capture", "ended_elsewhere", mode)
    assert (result["end"], result["status_after_end"]) == (end, "0")
    assert_work_after_the_capture_was_converted(result, calls)


def test_a_capture_left_open_by_an_exited_thread_leaves_the_next_thread_gated(world, agent):
    # glibc gives the exited thread's pthread_t to the next thread: that thread began no
    # capture, so its work waits for the lock and its stream-ordered allocation is managed.
    result, calls = run_behind_a_holder(world, agent, "capture", "left_open")
    assert result["reused"] == "1"
    assert_work_after_the_capture_was_converted(result, calls)


@pytest.mark.parametrize("how", ["destroy", "reset"])
def test_a_capture_the_driver_ends_leaves_its_thread_gated_again(world, agent, how):
    # Destroying the capturing stream, or resetting its context, ends the capture (driver
    # 580 on the H100: cuCtxSynchronize succeeds afterwards).
    result, calls = run_behind_a_holder(world, agent, "capture", "ended_by", how)
    assert result["sync_after"] == "0"
    assert_work_after_the_capture_was_converted(result, calls)


@pytest.mark.parametrize("mode", ["relaxed", "global"])
def test_another_threads_work_into_a_capture_passes_the_gate(world, agent, mode):
    # A second thread's launch and memset into the capturing stream only add graph nodes:
    # they must not wait for the GPU (before, they did: a drop arriving meanwhile waited for
    # a capture whose end waited for them, then invalidated it).  Another process holds
    # the GPU throughout, so anything gated would hang here.
    with ShimClient(world.socket_path, gpus=(GPU,), command="holder") as holder:
        holder.request(GPU)
        holder.wait_grant(GPU)
        client = world.client("capture", "into_other", mode)
        result = client.finish_ok()
    assert (result["launched"], result["set"], result["end"]) == ("0", "0", "0")
    calls = world.calls(client.pid)
    captured = [c.function for c in calls if c.fields.get("captured") == "1"]
    assert captured == ["cuLaunchKernel", "cuLaunchKernel", "cuMemsetD32Async"], captured
    assert not re.search(rf"request gpu={STANDIN_GPU} pid={client.pid}\b", agent.log())
