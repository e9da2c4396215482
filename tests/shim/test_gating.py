"""Every GPU call waits for the lock; idle clients release early; drop requests and
revocations are handled.  Ordering is read from the stand-in's call log (one
O_APPEND line per call, so file order is time order) and the agent's log."""

import os
import re
import time

import pytest
from agent_harness import ShimClient, wait_until
from shim_harness import STANDIN_GPU

from nvshare_agent import protocol

GPU = protocol.parse_uuid(STANDIN_GPU)


def agent_time(stamp: str) -> float:
    """The agent's local-time stamp (ms, truncated) as epoch seconds."""
    whole, millis = stamp.split(".")
    return time.mktime(time.strptime(whole, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000


def release_times(agent, pid: int) -> list[float]:
    return [
        agent_time(m)
        for m in re.findall(
            rf"^(\S+ \S+) INFO release gpu={STANDIN_GPU} pid={pid}\b", agent.log(), re.M
        )
    ]


def assert_kernels_never_overlap(calls) -> None:
    """Exclusive: no process starts a kernel while another's is running."""
    running: dict[int, int] = {}
    for c in calls:
        if c.function == "@kernel_start":
            others = [pid for pid, n in running.items() if n > 0 and pid != c.pid]
            assert not others, f"pid {c.pid} started a kernel while {others} had kernels running"
            running[c.pid] = running.get(c.pid, 0) + 1
        elif c.function == "@kernel_done":
            running[c.pid] -= 1


def grants(agent) -> list[int]:
    """pids in the order the agent granted the stand-in GPU."""
    return [int(m) for m in re.findall(rf"grant gpu={STANDIN_GPU} pid=(\d+)", agent.log())]


@pytest.mark.parametrize(
    "name,args",
    [("linked", ()), ("dlsym", ()), ("procaddr", ()), ("procaddr", ("--per-thread",))],
    ids=["linked", "dlsym", "procaddr", "procaddr-per-thread"],
)
def test_no_gpu_work_reaches_the_driver_before_the_grant(world, agent, name, args):
    with ShimClient(world.socket_path, gpus=(GPU,), command="holder") as holder:
        holder.request(GPU)
        grant = holder.wait_grant(GPU)
        client = world.client(name, "--loops", 2, "--stream", *args)
        agent.wait_for_log(rf"request gpu={STANDIN_GPU} pid={client.pid}\b")
        # Queued behind the holder: the client must not run anything on the GPU.
        time.sleep(0.5)
        assert client.running(), client.describe()
        early = [c for c in world.calls(client.pid) if c.gated]
        assert early == [], f"GPU work before the grant: {early[:3]}"
        released_at = time.time()
        holder.release(grant)
        client.finish_ok()
    gated = [c for c in world.calls(client.pid) if c.gated]
    launches = [c for c in gated if c.function.startswith(("cuLaunch", "cuGraphLaunch"))]
    assert len(launches) == 2 * (4 + 1), (
        "every launch (kernel, Ex, cooperative, graph) reached the driver"
    )
    assert all(c.t >= released_at for c in gated), "a gated call ran before the holder released"
    if "--per-thread" in args:
        assert {c.function for c in launches} >= {
            "cuLaunchKernel_ptsz",
            "cuLaunchKernelEx_ptsz",
            "cuLaunchCooperativeKernel_ptsz",
            "cuGraphLaunch_ptsz",
        }
    agent.wait_for_log(rf"grant gpu={STANDIN_GPU} pid={client.pid}\b")
    assert grants(agent)[:2] == [os.getpid(), client.pid], "holder first, then the client"


def test_second_client_waits_until_the_first_releases(world, agent):
    # Kernels long enough that the first client holds the GPU for a while.
    first = world.client("linked", "--loops", 1, "--launches", 6, kernel_us=100_000)
    agent.wait_for_log(rf"grant gpu={STANDIN_GPU} pid={first.pid}\b")
    second = world.client("dlsym", "--loops", 1, "--launches", 2, kernel_us=1000)
    first.finish_ok()
    second.finish_ok()
    world.settled(agent, first, second)
    assert grants(agent)[:2] == [first.pid, second.pid]
    first_release = release_times(agent, first.pid)[0]
    second_work = [c.t for c in world.calls(second.pid) if c.gated]
    assert second_work and min(second_work) >= first_release, (
        "the second client ran before the first released"
    )
    assert_kernels_never_overlap(world.calls())


def test_idle_client_releases_early_and_asks_again(world, agent):
    client = world.client("procaddr", "--loops", 3, "--sleep-ms", 700, kernel_us=20_000)
    client.finish_ok()
    log = world.settled(agent, client)
    early = re.findall(
        # An agent that reads RELEASED.idle_ms logs it; a drop or a disconnect says its reason.
        rf"release gpu={STANDIN_GPU} pid={client.pid} lease=\d+ held_ms=[\d.]+(?: idle_ms=\d+)?\s*$",
        log,
        re.M,
    )
    assert len(early) >= 2, f"expected an idle release after each burst:\n{log}"
    assert grants(agent).count(client.pid) >= 3
    # Released only with nothing in flight: no kernel spans a release (agent stamps are ms, truncated).
    kernels = world.kernel_runs(client.pid)
    for released in release_times(agent, client.pid):
        spanning = [k for k in kernels if k[0] < released - 0.002 and k[1] > released + 0.002]
        assert not spanning, f"released at {released:.3f} with a kernel running {spanning}"


def test_idle_release_lets_another_process_in_between_bursts(world, agent):
    client = world.client("linked", "--loops", 2, "--sleep-ms", 3000)
    agent.wait_for_log(rf"release gpu={STANDIN_GPU} pid={client.pid}\b")
    with ShimClient(world.socket_path, gpus=(GPU,), command="other") as other:
        other.request(GPU)
        grant = other.wait_grant(GPU, timeout=2.0)  # no need to wait for the client's exit
        assert client.running()
        other.release(grant)
    client.finish_ok()


# FAST_CONFIG with another idle release; every grant's prefetch is made slow (STANDIN_PREFETCH_US),
# as a large working set's is (8 GiB: ~170 ms on the H100).
SLOW_PREFETCH_CONFIG = """\
[scheduler]
time_quantum = 1
anti_thrash = on
idle_release_ms = {idle_ms}
drop_grace_ms = 300
"""


@pytest.mark.slow  # several seconds: make check runs it, check-fast does not
def test_the_idle_release_counts_from_the_gate_opening_not_from_the_grant(world):
    # A 300 ms prefetch, a 100 ms idle release: counted from the grant, the lock was released
    # as idle the moment the gate opened, unless the woken thread got through first; it then
    # asked again, and the process paid a second prefetch for one burst of work.
    agent = world.start_agent(config=SLOW_PREFETCH_CONFIG.format(idle_ms=100))
    client = world.client(
        "linked",
        "--loops",
        6,
        "--sleep-ms",
        400,
        STANDIN_PREFETCH_US=300_000,
        NVSHARE_DEBUG=1,
        NVSHARE_PREFETCH_AFTER_MS=0,
    )
    client.finish_ok()
    world.settled(agent, client)
    assert grants(agent).count(client.pid) == 6, agent.log()
    held = [
        float(ms)
        for ms in re.findall(r"release gpu=0 lease=\d+ reason=idle held_ms=([\d.]+)", client.stderr)
    ]
    # After every burst but the last (the process exits holding the lock).
    assert len(held) == 5 and min(held) >= 300 + 100, client.stderr


@pytest.mark.slow  # several seconds: make check runs it, check-fast does not
def test_a_thread_that_waited_through_the_grant_prefetch_asks_for_the_gpu_once(world):
    # The prefetch (1.2 s) outlasts the waiting thread's timed wait (1 s), which wakes to find
    # the lock held and the gate still closed, as during a release.  Taken for one, that asked
    # for the GPU again at the next (idle) release, with no thread waiting.
    agent = world.start_agent(config=SLOW_PREFETCH_CONFIG.format(idle_ms=1000))
    with ShimClient(world.socket_path, gpus=(GPU,), command="holder") as holder:
        holder.request(GPU)
        grant = holder.wait_grant(GPU)
        client = world.client(
            "linked", "--loops", 1, "--linger-ms", 3000, STANDIN_PREFETCH_US=1_200_000
        )
        agent.wait_for_log(rf"request gpu={STANDIN_GPU} pid={client.pid}\b")
        holder.release(grant)
        client.finish_ok()
    log = world.settled(agent, client)
    assert grants(agent).count(client.pid) == 1, log


PATIENT_IDLE_CONFIG = """\
[scheduler]
time_quantum = 60
anti_thrash = on
idle_release_ms = 1000
drop_grace_ms = 20000
"""


@pytest.mark.slow
def test_an_idle_release_carried_out_late_is_dropped_when_launches_came_since_it_was_decided(world):
    # The idle release is decided ~1 s after burst A; its worker first takes the contexts
    # mutex, which another thread's cuCtxDestroy holds from 0.8 s to 3.8 s.  Burst B
    # launches from 1.7 s to 3.7 s.  The worker used to compare the gate's activity with
    # what the client thread had seen at its latest look (during B), so it released the
    # GPU as idle at 3.8 s, mid-work; it must compare with what the decision saw.
    agent = world.start_agent(config=PATIENT_IDLE_CONFIG)
    client = world.client("late_idle", 800, 1700, 3700, 2500, STANDIN_CTX_DESTROY_US=3_000_000)
    seen = {
        key: float(value)
        for key, value in client.finish_ok().items()
        if key in ("a", "last_launch", "destroy_started", "destroy_done")
    }
    log = world.settled(agent, client)
    # The scene happened as planned: the destroy held the mutexes across burst B.
    assert (
        seen["destroy_started"] < seen["a"] + 1.0 and seen["destroy_done"] > seen["last_launch"]
    ), seen
    releases = [t for t in release_times(agent, client.pid) if t > seen["a"]]
    assert releases, log
    # The agent's stamps are truncated to the millisecond.
    assert releases[0] - seen["last_launch"] >= 1.0 - 0.01, (
        f"released {releases[0] - seen['last_launch']:.3f} s after the last launch\n{log}"
    )


@pytest.mark.slow  # several seconds: make check runs it, check-fast does not
def test_two_busy_clients_alternate_on_drop_requests(world, agent):
    # TQ 1 s.  Short kernels keep each client's gate busy (the shim's queue bound
    # spreads the launches over the burst), so neither goes idle: only drop
    # requests can move the GPU between them.
    busy = ("--duration-ms", 3500, "--launches", 96)
    a = world.client("linked", *busy, kernel_us=2000)
    b = world.client("procaddr", *busy, kernel_us=2000)
    a.finish_ok()
    b.finish_ok()
    log = world.settled(agent, a, b)
    order = [pid for pid in grants(agent) if pid in (a.pid, b.pid)]
    switches = sum(1 for x, y in zip(order, order[1:]) if x != y)
    assert switches >= 2, f"grants did not alternate: {order}\n{log}"
    drops = re.findall(rf"drop gpu={STANDIN_GPU} pid=(\d+)", log)
    assert {int(p) for p in drops} == {a.pid, b.pid}, f"expected drop requests to both:\n{log}"
    assert "revoke" not in log, "a busy but well-behaved client was revoked"
    assert_kernels_never_overlap(world.calls())


@pytest.mark.slow  # several seconds: make check runs it, check-fast does not
def test_many_launching_threads_never_slip_past_a_release(world, agent):
    # Four threads per client launch at once while drop requests move the GPU.
    # Client a's launches spend 5 ms in the driver before their kernel (1 ms) is
    # queued, so one of its threads is inside at nearly every release of a and
    # little is queued: if the release did not wait for that thread, its kernel
    # would be queued after the release and run beside b's, which launches fast.
    busy = ("--duration-ms", 3000, "--threads", 3)
    a = world.client(
        "linked", *busy, "--launches", 24, "--loops", 6, kernel_us=1000, STANDIN_LAUNCH_US="5000"
    )
    b = world.client("procaddr", *busy, "--launches", 48, "--loops", 12, kernel_us=1000)
    assert a.finish_ok()["threads"] == "3" and b.finish_ok()["threads"] == "3"
    log = world.settled(agent, a, b)
    drops = re.findall(rf"drop gpu={STANDIN_GPU} pid=(\d+)", log)
    assert {int(p) for p in drops} == {a.pid, b.pid}, f"expected drop requests to both:\n{log}"
    gated_threads = {(c.pid, c.tid) for c in world.calls() if c.gated}
    assert len(gated_threads) == 8, "every thread of both clients launched"
    assert_kernels_never_overlap(world.calls())


@pytest.mark.slow  # several seconds: make check runs it, check-fast does not
def test_revoked_client_keeps_running(world, agent):
    # Each kernel takes 1.5 s: far past the 300 ms drop grace, so the lock is revoked.
    client = world.client(
        "dlsym", "--loops", 1, "--launches", 3, "--launch", "kernel", kernel_us=1_500_000
    )
    agent.wait_for_log(rf"grant gpu={STANDIN_GPU} pid={client.pid}\b")
    with ShimClient(world.socket_path, gpus=(GPU,), command="rival") as rival:
        rival.request(GPU)
        agent.wait_for_log(rf"revoke gpu={STANDIN_GPU} pid={client.pid}\b")
        rival.release(rival.wait_grant(GPU))
    client.finish_ok()
    assert client.warnings() == [] or all("revok" in w for w in client.warnings()), client.stderr


def test_anti_thrash_off_lets_clients_run_together(world):
    agent = world.start_agent(
        config="[scheduler]\ntime_quantum = 1\nanti_thrash = off\nidle_release_ms = 100\n"
    )
    # Each burst: 6 kernels of 100 ms, so runs of the two clients certainly overlap.
    a = world.client("linked", "--loops", 2, "--launches", 6, kernel_us=100_000)
    b = world.client("dlsym", "--loops", 2, "--launches", 6, kernel_us=100_000)
    a.finish_ok()
    b.finish_ok()
    world.settled(agent, a, b)
    for pid in (a.pid, b.pid):
        agent.wait_for_log(rf"grant gpu={STANDIN_GPU} pid={pid} lease=\d+ mode=shared")
    assert "mode=exclusive" not in agent.log()
    running, overlapped = {}, False
    for c in world.calls():
        if c.function == "@kernel_start":
            overlapped |= any(n > 0 for pid, n in running.items() if pid != c.pid)
            running[c.pid] = running.get(c.pid, 0) + 1
        elif c.function == "@kernel_done":
            running[c.pid] -= 1
    assert overlapped, (
        "with anti-thrash off the two clients' kernels should have run at the same time"
    )


def test_threads_wait_for_the_grant_without_blocking_other_driver_calls(world, agent):
    with ShimClient(world.socket_path, gpus=(GPU,), command="holder") as holder:
        holder.request(GPU)
        grant = holder.wait_grant(GPU)
        client = world.client("linked", "--threads", 3, "--side-thread", "--loops", 2, "--stream")
        agent.wait_for_log(rf"request gpu={STANDIN_GPU} pid={client.pid}\b")
        waiting_since = time.time()
        # While four threads wait for the GPU, a fifth keeps allocating and freeing.
        wait_until(
            lambda: (
                len(
                    [c for c in world.calls(client.pid, "cuMemAllocManaged") if c.t > waiting_since]
                )
                >= 5
            ),
            what="allocations on the side thread while the others wait for the GPU",
        )
        assert not [c for c in world.calls(client.pid) if c.gated], "GPU work before the grant"
        released_at = time.time()
        holder.release(grant)
        result = client.finish_ok()
    assert result["threads"] == "3" and int(result["side_allocations"]) >= 5
    gated = [c for c in world.calls(client.pid) if c.gated]
    assert len({c.tid for c in gated}) == 4, "every working thread ran GPU work"
    assert min(c.t for c in gated) >= released_at


def test_gpus_are_gated_independently(world, agent):
    gpu0, gpu1 = STANDIN_GPU, STANDIN_GPU[:-2] + "01"
    with ShimClient(world.socket_path, gpus=(GPU,), command="holder") as holder:
        holder.request(GPU)
        holder.wait_grant(GPU)
        # GPU 0 stays held throughout: a client of GPU 1 must not wait for it.
        on_gpu1 = world.client("linked", "--device", 1, "--loops", 2, STANDIN_DEVICE_COUNT=2)
        on_gpu1.finish_ok()
        on_gpu0 = world.client("dlsym", "--device", 0, "--loops", 1, STANDIN_DEVICE_COUNT=2)
        agent.wait_for_log(rf"request gpu={gpu0} pid={on_gpu0.pid}\b")
        assert on_gpu0.running() and not [c for c in world.calls(on_gpu0.pid) if c.gated]
    on_gpu0.finish_ok()  # the holder's disconnect freed GPU 0
    agent.wait_for_log(rf"grant gpu={gpu1} pid={on_gpu1.pid}\b")
    assert not re.search(rf"grant gpu={gpu0} pid={on_gpu1.pid}\b", agent.log()), (
        "GPU 1's client locked GPU 0"
    )
    agent.wait_for_log(rf"grant gpu={gpu0} pid={on_gpu0.pid}\b")


def test_a_thread_cancelled_while_it_waits_at_the_gate_leaves_the_process_working(world, agent):
    # pthread_cond_timedwait is a cancellation point: a thread cancelled there must not
    # leave the client mutex locked, or the process's next GPU call hangs for good.
    holder = world.client(
        "linked",
        "--loops",
        1,
        "--launches",
        20,
        "--stream",
        "--launch",
        "kernel",
        kernel_us=100_000,
    )
    agent.wait_for_log(rf"grant gpu={STANDIN_GPU} pid={holder.pid}\b")
    world.client("cancel").finish_ok(timeout=60)
    holder.finish_ok()


@pytest.mark.slow  # several seconds: make check runs it, check-fast does not
def test_a_thread_cancelled_while_it_destroys_a_context_leaves_the_process_working(world, agent):
    # The shim holds every GPU's contexts mutex across cuCtxDestroy, and the driver may reach
    # a cancellation point in it (the stand-in sleeps there); so may the shim's debug log.
    # A thread cancelled there left the mutexes locked: the next context call hung.
    world.client(
        "cancel", "--in-destroy", STANDIN_CTX_DESTROY_US=2_000_000, NVSHARE_DEBUG=1
    ).finish_ok(timeout=60)
