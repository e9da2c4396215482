"""One GPU's lock as a pure transition (shim/lock_machine.c), driven directly: no
threads, no agent, no sleeps; time is an argument.

shim/lock_machine.c is built alone into a small library for these tests, and its
header's declarations (between the BEGIN/END markers) are read with cffi, as the
agent reads the wire format."""

from __future__ import annotations

from pathlib import Path

import cffi
import pytest
from shim_harness import build_alone

from nvshare_agent import protocol

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "shim"
BEGIN, END = "/* BEGIN NVSHARE LOCK MACHINE */", "/* END NVSHARE LOCK MACHINE */"

EXCLUSIVE = int(protocol.GrantFlags.EXCLUSIVE)
SHARED = int(protocol.GrantFlags.SHARED)
RELEASE_WHEN_IDLE = int(protocol.GrantFlags.RELEASE_WHEN_IDLE)
WHEN_IDLE = int(protocol.DropFlags.WHEN_IDLE)
DISPLACED = int(protocol.GrantFlags.DISPLACED)


@pytest.fixture(scope="module")
def machine_lib(tmp_path_factory):
    library = tmp_path_factory.mktemp("lock_machine") / "liblock_machine.so"
    build_alone(library, SHIM / "lock_machine.c")
    header = (SHIM / "lock_machine.h").read_text()
    ffi = cffi.FFI()
    ffi.cdef(header[header.index(BEGIN) + len(BEGIN) : header.index(END)])
    return ffi, ffi.dlopen(str(library))


class Lock:
    """One machine, with events by name and the jobs of the last step as (name, ...) tuples."""

    def __init__(self, ffi, lib):
        self.ffi, self.lib = ffi, lib
        self.state = ffi.new("struct nvshare_lock_machine *")
        self.activity = 0
        self.last = None

    def step(self, kind: str, now: float = 0.0, **fields) -> list[tuple]:
        event = self.ffi.new("struct nvshare_lock_event *")
        event.kind = getattr(self.lib, f"NVSHARE_EVENT_{kind}")
        event.now_ms = now
        event.activity = self.activity
        for name, value in fields.items():
            setattr(event, name, value)
        jobs = self.ffi.new("struct nvshare_lock_jobs *")
        self.lib.nvshare_lock_machine_step(self.state, event, jobs)
        self.last = jobs
        return [self._job(jobs.job[i]) for i in range(jobs.count)]

    def _job(self, job) -> tuple:
        names = {
            getattr(self.lib, n): n.removeprefix("NVSHARE_JOB_")
            for n in dir(self.lib)
            if n.startswith("NVSHARE_JOB_")
        }
        name = names[job.kind]
        if name in ("POST_WORK", "RUN_WORK", "DRAIN"):
            work = {
                self.lib.NVSHARE_WORK_PREFETCH: "PREFETCH",
                self.lib.NVSHARE_WORK_RELEASE_IDLE: "RELEASE_IDLE",
                self.lib.NVSHARE_WORK_RELEASE_DROP: "RELEASE_DROP",
            }[job.work]
            return (name, work, job.ticket)
        if name == "SEND_RELEASED":
            return (name, job.lease, job.idle_ms)
        return (name,)

    @property
    def phase(self) -> str:
        return {0: "IDLE", 1: "WANTED", 2: "REQUESTED", 3: "HELD"}[self.state.phase]

    @property
    def gate_open(self) -> bool:
        return bool(self.state.gate_open)

    # ---- common paths

    def connected(self) -> None:
        self.step("CONNECTED")

    def granted(self, lease=7, flags=EXCLUSIVE, now=10.0, prefetch=0) -> list[tuple]:
        self.step("THREAD_WAITS", now=now - 2)
        self.step("SEND_REQUEST", now=now - 1)
        return self.step("GRANT", now=now, lease=lease, flags=flags, prefetch=prefetch)

    def ticket(self, jobs) -> int:
        return next(job[2] for job in jobs if job[0] == "POST_WORK")

    def release(self, ticket: int) -> list[tuple]:
        """The worker drains (the GPU turns out idle) and the client thread sends RELEASED."""
        self.step("TAKE_WORK")
        self.step("CLOSE_FOR_DRAIN", ticket=ticket)
        self.step("DRAINED", ticket=ticket)
        return self.step("SEND_RELEASE")


@pytest.fixture
def lock(machine_lib):
    ffi, lib = machine_lib
    lock = Lock(ffi, lib)
    lock.connected()
    return lock


def test_a_waiting_thread_wants_the_lock_and_the_client_sends_one_request(lock):
    assert lock.step("THREAD_WAITS") == [("WAKE_CLIENT",)]
    assert lock.phase == "WANTED"
    assert lock.step("THREAD_WAITS") == [], "a second waiting thread asks nothing more"
    assert lock.step("SEND_REQUEST", now=5.0) == [("SEND_REQUEST",)]
    assert lock.phase == "REQUESTED" and lock.state.requested_at_ms == 5.0
    assert lock.step("SEND_REQUEST") == [], "one request per want"


def test_a_grant_without_prefetch_opens_the_gate_and_wakes_the_waiting_threads(lock):
    assert lock.granted(lease=7) == [("OPEN_GATE",), ("WAKE_WAITERS",)]
    assert lock.phase == "HELD" and lock.gate_open and lock.state.lease == 7


def test_a_grant_with_prefetch_opens_the_gate_only_after_the_prefetch(lock):
    jobs = lock.granted(prefetch=1)
    assert [j[:2] for j in jobs] == [("POST_WORK", "PREFETCH")]
    assert not lock.gate_open
    ticket = lock.ticket(jobs)
    assert lock.step("TAKE_WORK") == [("RUN_WORK", "PREFETCH", ticket)]
    assert lock.step("TAKE_WORK") == [], "taken once"
    # A thread arriving during the prefetch waits for this grant, it asks nothing new.
    assert lock.step("THREAD_WAITS") == []
    lock.activity = 3
    assert lock.step("PREFETCHED", now=300.0, ticket=ticket) == [
        ("OPEN_GATE",),
        ("WAKE_CLIENT",),
        ("WAKE_WAITERS",),
    ]
    assert lock.gate_open and lock.state.want_again == 0
    assert lock.state.activity_changed_at_ms == 300.0, "idle counts from the gate's opening"


def test_a_grant_soon_after_the_last_lease_ended_opens_the_gate_without_a_prefetch(lock):
    # Back from a window of light work 200 ms later: little can have been evicted, and a
    # prefetch of what stayed resident costs ~0.7 ms a GiB (H100).  After a second away
    # (another's turn), the grant prefetches again.
    def release_at(now: float, lease: int) -> None:
        ticket = lock.ticket(lock.step("DROP", now=now, lease=lease))
        lock.step("TAKE_WORK", now=now)
        lock.step("CLOSE_FOR_DRAIN", now=now, ticket=ticket)
        lock.step("DRAINED", now=now, ticket=ticket)
        assert lock.step("SEND_RELEASE", now=now)[0] == ("SEND_RELEASED", lease, 0)

    def grant_at(now: float, lease: int) -> list[tuple]:
        lock.step("THREAD_WAITS", now=now - 2)
        lock.step("SEND_REQUEST", now=now - 1)
        return lock.step(
            "GRANT", now=now, lease=lease, flags=EXCLUSIVE, prefetch=1, prefetch_after_ms=1000
        )

    assert grant_at(10.0, 7) == [("POST_WORK", "PREFETCH", lock.state.ticket)]  # the first
    lock.step("TAKE_WORK")
    lock.step("PREFETCHED", now=20.0, ticket=lock.state.ticket)
    release_at(100.0, 7)
    assert grant_at(300.0, 8)[0] == ("OPEN_GATE",)
    release_at(400.0, 8)
    assert grant_at(1400.0, 9)[0][:2] == ("POST_WORK", "PREFETCH")


def test_a_grant_soon_after_the_last_lease_prefetches_when_the_agent_says_displaced(lock):
    # Another's turn alone on the GPU came between (the agent knows, the shim cannot):
    # what it pushed to the host would come back by faults at a sixth of the speed.
    lock.granted(lease=7, now=10.0)
    ticket = lock.ticket(lock.step("DROP", now=100.0, lease=7))
    lock.step("TAKE_WORK", now=100.0)
    lock.step("CLOSE_FOR_DRAIN", now=100.0, ticket=ticket)
    lock.step("DRAINED", now=100.0, ticket=ticket)
    lock.step("SEND_RELEASE", now=100.0)
    lock.step("THREAD_WAITS", now=150.0)
    lock.step("SEND_REQUEST", now=160.0)
    jobs = lock.step(
        "GRANT",
        now=300.0,
        lease=8,
        flags=EXCLUSIVE | DISPLACED,
        prefetch=1,
        prefetch_after_ms=1000,
    )
    assert jobs[0][:2] == ("POST_WORK", "PREFETCH")


def test_a_grant_soon_after_a_revoke_still_prefetches(lock):
    # Revoked, the lease went to another holder, whose work may have evicted ours.
    lock.granted(lease=7, now=10.0)
    assert lock.step("REVOKED", now=100.0, lease=7)
    lock.step("THREAD_WAITS", now=150.0)
    lock.step("SEND_REQUEST", now=160.0)
    jobs = lock.step(
        "GRANT", now=200.0, lease=8, flags=EXCLUSIVE, prefetch=1, prefetch_after_ms=1000
    )
    assert jobs[0][:2] == ("POST_WORK", "PREFETCH")


def test_an_idle_exclusive_lock_is_released_after_idle_release_ms_without_a_passage(lock):
    lock.granted(now=0.0)
    assert lock.step("IDLE_LOOK", now=50.0, idle_release_ms=100) == []
    assert lock.last.look_in_ms == 25
    lock.activity = 1  # a launch at 60 ms
    assert lock.step("IDLE_LOOK", now=60.0, idle_release_ms=100) == []
    assert lock.step("IDLE_LOOK", now=159.0, idle_release_ms=100) == []
    jobs = lock.step("IDLE_LOOK", now=160.0, idle_release_ms=100)
    assert [j[:2] for j in jobs] == [("POST_WORK", "RELEASE_IDLE")]
    ticket = lock.ticket(jobs)
    lock.step("TAKE_WORK")
    assert lock.step("CLOSE_FOR_DRAIN", ticket=ticket) == [("CLOSE_GATE",)]
    assert lock.last.seen_activity == 1
    assert lock.step("DRAINED", ticket=ticket) == [("WAKE_CLIENT",)]
    assert lock.step("SEND_RELEASE") == [("SEND_RELEASED", 7, 100)], "idle since 60 ms"
    assert lock.phase == "IDLE" and not lock.gate_open


def test_queued_work_still_running_counts_as_a_passage(lock):
    # A thread waiting in the queue bound for its own long kernels passes no gate; the
    # idle time counts from when that work was last seen running, not from its launch.
    lock.granted(now=0.0)
    lock.activity = 1  # the last launch
    lock.step("IDLE_LOOK", now=10.0, idle_release_ms=100)
    for now in (100.0, 200.0, 400.0, 800.0):
        assert lock.step("IDLE_LOOK", now=now, idle_release_ms=100, work_pending=1) == []
    assert lock.step("IDLE_LOOK", now=899.0, idle_release_ms=100) == [], "done at 800-899 ms"
    jobs = lock.step("IDLE_LOOK", now=900.0, idle_release_ms=100)
    assert [j[:2] for j in jobs] == [("POST_WORK", "RELEASE_IDLE")]
    assert lock.release(lock.ticket(jobs)) == [("SEND_RELEASED", 7, 100)], "idle since 800 ms"


def test_queued_work_still_running_holds_a_when_idle_drop_too(lock):
    # A yield (release once idle 2 ms) waits for the end of the work, not its last launch.
    lock.granted(now=0.0)
    lock.step("DROP", now=10.0, lease=7, flags=WHEN_IDLE, idle_ms=2)
    lock.activity = 1  # its last launch
    assert lock.step("IDLE_LOOK", now=10.0, idle_release_ms=1000) == []
    assert lock.step("IDLE_LOOK", now=50.0, idle_release_ms=1000, work_pending=1) == []
    assert lock.step("IDLE_LOOK", now=51.0, idle_release_ms=1000) == []
    jobs = lock.step("IDLE_LOOK", now=52.0, idle_release_ms=1000)
    assert lock.release(lock.ticket(jobs)) == [("SEND_RELEASED", 7, 2)]


def test_a_shared_lock_never_releases_when_idle(lock):
    lock.granted(flags=SHARED, now=0.0)
    assert lock.step("IDLE_LOOK", now=10_000.0, idle_release_ms=100) == []
    assert lock.last.look_in_ms == -1, "nothing to look at"


def test_no_idle_release_without_the_setting(lock):
    lock.granted(now=0.0)
    assert lock.step("IDLE_LOOK", now=10_000.0, idle_release_ms=0) == []
    assert lock.last.look_in_ms == -1


def test_the_idle_look_interval_is_a_quarter_of_idle_release_ms_within_1_and_250(lock):
    lock.granted(now=0.0)
    for idle_ms, interval in ((2, 1), (100, 25), (4000, 250)):
        lock.step("IDLE_LOOK", now=0.0, idle_release_ms=idle_ms)
        assert lock.last.look_in_ms == interval


def test_while_work_is_posted_the_idle_look_keeps_what_the_decision_saw(lock):
    # The worker may start late; it compares the gate's activity with what the decision saw.
    lock.granted(now=0.0)
    lock.step("IDLE_LOOK", now=200.0, idle_release_ms=100)
    lock.activity = 9
    assert lock.step("IDLE_LOOK", now=300.0, idle_release_ms=100) == []
    assert lock.state.seen_activity == 0


def test_an_idle_release_that_finds_launches_reopens_the_gate_and_keeps_the_lock(lock):
    lock.granted(now=0.0)
    ticket = lock.ticket(lock.step("IDLE_LOOK", now=200.0, idle_release_ms=100))
    lock.step("TAKE_WORK")
    lock.step("CLOSE_FOR_DRAIN", ticket=ticket)
    lock.activity = 4  # a launch got in before the gate closed
    jobs = lock.step("BUSY_AFTER_ALL", now=210.0, ticket=ticket, gate_closed=1)
    assert jobs == [("OPEN_GATE",), ("WAKE_WAITERS",), ("WAKE_CLIENT",)]
    assert lock.phase == "HELD" and lock.gate_open and lock.state.work == 0
    assert lock.state.seen_activity == 4 and lock.state.activity_changed_at_ms == 210.0


def test_queued_work_makes_an_idle_release_wait_from_when_it_is_done(lock):
    lock.granted(now=0.0)
    ticket = lock.ticket(lock.step("IDLE_LOOK", now=200.0, idle_release_ms=100))
    lock.step("TAKE_WORK")
    jobs = lock.step("BUSY_AFTER_ALL", now=230.0, ticket=ticket, gate_closed=0)
    assert jobs == [("WAKE_WAITERS",), ("WAKE_CLIENT",)]
    assert lock.gate_open and lock.state.activity_changed_at_ms == 230.0


def test_a_drop_request_drains_at_once(lock):
    lock.granted(lease=7)
    jobs = lock.step("DROP", lease=7)
    assert [j[:2] for j in jobs] == [("POST_WORK", "RELEASE_DROP")]


def test_a_drop_during_the_prefetch_keeps_the_gate_closed_and_drains(lock):
    ticket = lock.ticket(lock.granted(lease=7, prefetch=1))
    lock.step("TAKE_WORK")
    assert lock.step("DROP", lease=7) == [], "the running prefetch ends in the release"
    jobs = lock.step("PREFETCHED", ticket=ticket)
    assert jobs == [("DRAIN", "RELEASE_DROP", ticket), ("WAKE_WAITERS",)]
    assert not lock.gate_open


def test_a_drop_during_an_idle_release_that_finds_work_goes_on_as_a_drop(lock):
    lock.granted(lease=7, now=0.0)
    ticket = lock.ticket(lock.step("IDLE_LOOK", now=200.0, idle_release_ms=100))
    lock.step("TAKE_WORK")
    lock.step("DROP", lease=7)
    jobs = lock.step("BUSY_AFTER_ALL", ticket=ticket, gate_closed=0)
    assert ("DRAIN", "RELEASE_DROP", ticket) in jobs and ("WAKE_CLIENT",) not in jobs


def test_a_stale_drop_is_ignored(lock):
    lock.granted(lease=7)
    assert lock.step("DROP", lease=6) == [] and lock.last.stale


def test_a_grant_not_asked_for_is_given_back_and_a_duplicate_ignored(lock):
    assert lock.step("GRANT", lease=3) == [("SEND_RELEASED", 3, 0)] and lock.last.stale
    lock.granted(lease=7)
    assert lock.step("GRANT", lease=7) == [] and lock.last.stale
    assert lock.step("GRANT", lease=8) == [("SEND_RELEASED", 8, 0)]


def test_a_revoked_lock_closes_the_gate_and_a_thread_that_came_meanwhile_asks_again(lock):
    lock.granted(lease=7)
    ticket = lock.ticket(lock.step("DROP", lease=7))
    lock.step("TAKE_WORK")
    lock.step("CLOSE_FOR_DRAIN", ticket=ticket)
    lock.step("THREAD_WAITS")
    assert lock.state.want_again == 1
    assert lock.step("REVOKED", lease=7) == [("WAKE_CLIENT",), ("WAKE_WAITERS",)]
    assert lock.phase == "WANTED" and not lock.gate_open
    # The old worker's result names work the lock no longer has: dropped.
    assert lock.step("DRAINED", ticket=ticket) == [] and lock.last.stale
    assert lock.step("SEND_RELEASE") == []


def test_a_thread_arriving_during_a_release_asks_again_right_after_released(lock):
    lock.granted(lease=7)
    ticket = lock.ticket(lock.step("DROP", lease=7))
    lock.step("TAKE_WORK")
    lock.step("CLOSE_FOR_DRAIN", ticket=ticket)
    lock.step("THREAD_WAITS")
    lock.step("DRAINED", ticket=ticket)
    assert lock.step("SEND_RELEASE") == [("SEND_RELEASED", 7, 0), ("WAKE_CLIENT",)]
    assert lock.phase == "WANTED"


def test_losing_the_agent_opens_the_gate_and_forgets_the_lease_but_not_the_tickets(lock):
    ticket = lock.ticket(lock.granted(lease=7, prefetch=1))
    assert lock.step("AGENT_LOST") == [("OPEN_GATE",), ("WAKE_WAITERS",)]
    assert lock.phase == "IDLE" and lock.gate_open
    assert lock.step("PREFETCHED", ticket=ticket) == [("WAKE_WAITERS",)] and lock.last.stale
    assert lock.step("THREAD_WAITS") == [], "unscheduled: the gate is open"
    lock.connected()
    assert not lock.gate_open
    later = lock.ticket(lock.granted(lease=9, prefetch=1))
    assert later != ticket and later != 0


def test_connecting_keeps_a_thread_that_already_waits(lock):
    lock.step("AGENT_LOST")
    lock.connected()
    lock.step("THREAD_WAITS")
    assert lock.step("CONNECTED") == [("WAKE_WAITERS",)]
    assert lock.phase == "WANTED"


# ---- RELEASED.idle_ms, shared leases released when idle, WHEN_IDLE drop requests


def idle_release(lock, now: float, idle_release_ms: int = 100) -> list[tuple]:
    """One idle look at now; the release it decides, carried out."""
    jobs = lock.step("IDLE_LOOK", now=now, idle_release_ms=idle_release_ms)
    posted = [j for j in jobs if j[0] == "POST_WORK"]
    assert [j[1] for j in posted] == ["RELEASE_IDLE"], jobs
    return lock.release(lock.ticket(jobs))


def test_released_after_an_idle_release_carries_the_idle_time(lock):
    lock.granted(lease=7, now=0.0)
    lock.activity = 1
    lock.step("IDLE_LOOK", now=20.0, idle_release_ms=100)  # the last passage, seen at 20 ms
    assert lock.step("IDLE_LOOK", now=119.0, idle_release_ms=100) == []
    assert idle_release(lock, now=145.0) == [("SEND_RELEASED", 7, 125)]


def test_released_after_a_drop_of_a_busy_gpu_carries_no_idle_time(lock):
    lock.granted(lease=7, now=0.0)
    ticket = lock.ticket(lock.step("DROP", now=5.0, lease=7))
    assert lock.release(ticket) == [("SEND_RELEASED", 7, 0)]


def test_an_idle_release_that_turns_into_a_drop_carries_no_idle_time(lock):
    lock.granted(lease=7, now=0.0)
    ticket = lock.ticket(lock.step("IDLE_LOOK", now=200.0, idle_release_ms=100))
    lock.step("TAKE_WORK")
    lock.step("DROP", lease=7)
    lock.step("BUSY_AFTER_ALL", ticket=ticket, gate_closed=0)  # queued work: busy after all
    lock.step("CLOSE_FOR_DRAIN", ticket=ticket)
    lock.step("DRAINED", ticket=ticket)
    assert lock.step("SEND_RELEASE") == [("SEND_RELEASED", 7, 0)]


def test_a_shared_lease_granted_release_when_idle_is_released_when_idle(lock):
    lock.granted(lease=7, flags=SHARED | RELEASE_WHEN_IDLE, now=0.0)
    assert lock.step("IDLE_LOOK", now=99.0, idle_release_ms=100) == []
    assert lock.last.look_in_ms == 25
    assert idle_release(lock, now=100.0) == [("SEND_RELEASED", 7, 100)]


SHORT_QUEUE = int(protocol.GrantFlags.SHORT_QUEUE)


def test_the_queue_is_kept_short_for_a_yield_only_where_light_work_may_cut_in(lock):
    lib = lock.lib
    lock.granted(lease=7, flags=SHARED | RELEASE_WHEN_IDLE, now=0.0)  # everyone fits
    lock.step("DROP", now=10.0, lease=7, flags=WHEN_IDLE, idle_ms=50)  # a yield to busy work
    assert lib.nvshare_lock_queue_length(lock.state) == lib.NVSHARE_QUEUE_AS_SET
    assert idle_release(lock, now=60.0, idle_release_ms=1000) == [("SEND_RELEASED", 7, 60)]
    lock.granted(lease=8, flags=SHARED | RELEASE_WHEN_IDLE | SHORT_QUEUE, now=100.0)
    assert lib.nvshare_lock_queue_length(lock.state) == lib.NVSHARE_QUEUE_SHORT
    lock.step("DROP", now=110.0, lease=8, flags=WHEN_IDLE, idle_ms=50)
    assert lib.nvshare_lock_queue_length(lock.state) == lib.NVSHARE_QUEUE_SHORTEST


def test_a_when_idle_drop_does_not_drain_at_once(lock):
    lock.granted(lease=7, now=0.0)
    assert lock.step("DROP", now=10.0, lease=7, flags=WHEN_IDLE, idle_ms=300) == []
    assert lock.phase == "HELD" and lock.gate_open and lock.state.work == 0


def test_a_when_idle_drop_releases_once_idle_for_its_time_before_idle_release_ms(lock):
    lock.granted(lease=7, now=0.0)
    lock.step("DROP", now=10.0, lease=7, flags=WHEN_IDLE, idle_ms=300)
    assert lock.step("IDLE_LOOK", now=299.0, idle_release_ms=10_000) == []
    assert lock.last.look_in_ms == 75, "looks as often as the shorter limit asks"
    assert idle_release(lock, now=300.0, idle_release_ms=10_000) == [("SEND_RELEASED", 7, 300)]


def test_a_when_idle_drop_never_makes_the_idle_release_later(lock):
    lock.granted(lease=7, now=0.0)
    lock.step("DROP", now=10.0, lease=7, flags=WHEN_IDLE, idle_ms=5000)
    assert idle_release(lock, now=100.0, idle_release_ms=100) == [("SEND_RELEASED", 7, 100)]


def test_a_when_idle_drop_applies_without_idle_release_ms_and_to_a_plain_shared_lease(lock):
    lock.granted(lease=7, flags=SHARED, now=0.0)
    lock.step("DROP", now=10.0, lease=7, flags=WHEN_IDLE, idle_ms=200)
    assert idle_release(lock, now=200.0, idle_release_ms=0) == [("SEND_RELEASED", 7, 200)]


def test_a_busy_holder_keeps_the_gpu_after_a_when_idle_drop_until_it_is_idle(lock):
    lock.granted(lease=7, now=0.0)
    lock.step("DROP", now=1.0, lease=7, flags=WHEN_IDLE, idle_ms=200)
    for now in range(50, 2000, 50):  # a passage between every two looks
        lock.activity += 1
        assert lock.step("IDLE_LOOK", now=float(now), idle_release_ms=10_000) == []
    assert lock.step("IDLE_LOOK", now=2100.0, idle_release_ms=10_000) == []
    assert idle_release(lock, now=2150.0, idle_release_ms=10_000) == [("SEND_RELEASED", 7, 200)]


def test_queued_work_still_counts_as_busy_after_a_when_idle_drop(lock):
    lock.granted(lease=7, now=0.0)
    lock.step("DROP", now=1.0, lease=7, flags=WHEN_IDLE, idle_ms=200)
    ticket = lock.ticket(lock.step("IDLE_LOOK", now=200.0, idle_release_ms=10_000))
    lock.step("TAKE_WORK")
    lock.step("BUSY_AFTER_ALL", now=900.0, ticket=ticket, gate_closed=0)
    assert lock.phase == "HELD" and lock.state.activity_changed_at_ms == 900.0
    assert lock.step("IDLE_LOOK", now=1099.0, idle_release_ms=10_000) == []
    assert idle_release(lock, now=1100.0, idle_release_ms=10_000) == [("SEND_RELEASED", 7, 200)]


def test_a_plain_drop_after_a_when_idle_one_drains_at_once(lock):
    lock.granted(lease=7, now=0.0)
    lock.step("DROP", now=1.0, lease=7, flags=WHEN_IDLE, idle_ms=5000)
    jobs = lock.step("DROP", now=2.0, lease=7)
    assert [j[:2] for j in jobs] == [("POST_WORK", "RELEASE_DROP")]


def test_the_when_idle_limit_is_forgotten_with_its_lease(lock):
    lock.granted(lease=7, now=0.0)
    lock.step("DROP", now=1.0, lease=7, flags=WHEN_IDLE, idle_ms=50)
    assert lock.step("DROP", now=2.0, lease=6, flags=WHEN_IDLE, idle_ms=10) == []
    assert lock.last.stale, "a stale lease's limit is not taken"
    idle_release(lock, now=60.0, idle_release_ms=10_000)
    lock.granted(lease=8, now=100.0)
    assert lock.step("IDLE_LOOK", now=5000.0, idle_release_ms=10_000) == []
