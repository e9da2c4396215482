"""One shim's look at its GPU's fair page (shim/fair_share.c), driven directly: the file
built alone with a stub of what it needs and a clock the test sets (fair_look_stub.c), the
page a memfd whose other slot the test writes, as another shim would.  No sleeps."""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import threading
import time
from pathlib import Path

import cffi
import pytest
from shim_harness import build_alone

from nvshare_agent import protocol

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "shim"
MS = 1_000_000  # ns
MINE, OTHER = 0, 1
LOOK_MS = 5  # the most busy time one look counts (usage_meter.c)
HOLD_S = 10  # a held wait's longest, built so: one that ends sooner was woken
SYS_FUTEX = {"x86_64": 202, "aarch64": 98}[platform.machine()]
FUTEX_WAKE = 1  # shared, as another shim's ring is


@pytest.fixture(scope="module")
def fair_lib(tmp_path_factory):
    library = tmp_path_factory.mktemp("fair_look") / "libfair_look.so"
    stub = Path(__file__).with_name("fair_look_stub.c")
    # fair_share.c's clock: the test's
    flags = ("-Dclock_gettime=stub_clock_gettime", f"-DHOLD_MS={HOLD_S * 1000}")
    build_alone(library, SHIM / "fair_share.c", stub, flags=flags)
    ffi = cffi.FFI()
    ffi.cdef(
        """void nvshare_fair_look(int gpu, int open, int busy, double busy_ms);
        void nvshare_fair_asked(int gpu, double asked_at_ms);
        void nvshare_fair_forget_after_fork(void);
        void nvshare_fair_wait(int gpu);
        void nvshare_fair_detach_all(void);
        void stub_set_now_ns(uint64_t ns);
        void stub_attach(int gpu, unsigned slot, int fd);
        int stub_held(int gpu);"""
    )
    return ffi.dlopen(str(library))


class Page:
    """A GPU's fair page as the agent makes it, this process in slot MINE, on a clock."""

    def __init__(self, lib):
        self.lib, self.now_ms = lib, 1_000_000.0
        size = protocol.ffi.sizeof("struct nvshare_fair_page")
        fd = os.memfd_create("fair-test")
        os.ftruncate(fd, size)
        self.map = mmap.mmap(fd, size)
        self.page = protocol.ffi.from_buffer("struct nvshare_fair_page *", self.map)
        self.page.magic = protocol.MAGIC
        for slot in (MINE, OTHER):
            self.page.slots[slot].in_use = 1
            self.page.slots[slot].weight = 1
        lib.nvshare_fair_forget_after_fork()  # a fresh shim's state
        lib.stub_attach(0, MINE, fd)  # it closes the descriptor
        self.tick(0)

    def tick(self, ms: float) -> None:
        self.now_ms += ms
        self.lib.stub_set_now_ns(int(self.now_ms * MS))

    def other(self, vtime_ms: float, backlogged: bool) -> None:
        """The other process's look, now (not on the GPU: this one's time is its own)."""
        slot = self.page.slots[OTHER]
        slot.vtime_ns, slot.backlogged = int(vtime_ms * MS), int(backlogged)
        slot.seen_ns = int(self.now_ms * MS)

    def look(self, busy_ms: float) -> None:
        self.lib.nvshare_fair_look(0, 1, int(busy_ms > 0), busy_ms)

    def ring(self) -> None:
        """The other process's look that found it idle: the page's bell, as its shim rings."""
        self.page.wake_seq += 1
        address = int(protocol.ffi.cast("uintptr_t", protocol.ffi.addressof(self.page, "wake_seq")))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall(SYS_FUTEX, ctypes.c_void_p(address), FUTEX_WAKE, 2**31 - 1, None, None, 0)

    def held_wait(self) -> threading.Thread:
        """An application thread at the held gate, started; back once it waits on the bell."""
        waiter = threading.Thread(target=self.lib.nvshare_fair_wait, args=(0,), daemon=True)
        waiter.start()
        while waiter.is_alive() and self.page.wake_waiters == 0:
            time.sleep(0.001)
        return waiter

    @property
    def mine_ms(self) -> float:
        return self.page.slots[MINE].vtime_ns / MS

    def charged_till_held(self, least_ms: float) -> float:
        """Busy looks of LOOK_MS beside the other backlogged at least_ms: how much virtual
        time this one used before it was held (its credit, give or take a look)."""
        used = 0.0
        while not self.lib.stub_held(0) and used < 1000:
            self.tick(LOOK_MS)
            self.other(least_ms, backlogged=True)
            self.look(LOOK_MS)
            used += LOOK_MS
        return used


def test_a_newcomer_among_holders_all_idle_starts_level_with_the_latest(fair_lib):
    """Two trainers that do not fit together came back from every other turn with the
    virtual time of their last, and pulled everyone beside them back to it: a notebook's
    15 ms cells took p50 168 ms (H200)."""
    page = Page(fair_lib)
    page.other(vtime_ms=500, backlogged=False)  # holding, between two requests
    page.look(busy_ms=1)
    assert page.mine_ms == pytest.approx(501, abs=0.01)


def test_with_others_backlogged_a_newcomer_starts_level_with_the_least(fair_lib):
    page = Page(fair_lib)
    page.other(vtime_ms=300, backlogged=True)
    page.look(busy_ms=1)
    assert page.mine_ms == pytest.approx(301, abs=0.01)


def away_and_back(page, asked_after):
    """Busy beside the other, away 100 ms while the other's virtual time runs on 200 ms,
    asking again for the GPU asked_after of the way through the gap (None: never), back."""
    page.other(vtime_ms=1000, backlogged=True)
    page.look(busy_ms=1)
    page.tick(1)
    page.look(busy_ms=0)  # idle; the least then 1000
    went_idle_ms = page.now_ms
    if asked_after is not None:
        page.lib.nvshare_fair_asked(0, went_idle_ms + 100 * asked_after)
    page.tick(100)
    page.other(vtime_ms=1200, backlogged=True)
    page.look(busy_ms=0.1)


@pytest.mark.parametrize(
    "asked_after, credit_ms",
    # 30: BURST_CREDIT_MS, the floor; -0.01: asked as its lease ended, before it looked idle
    [(None, 200), (1.0, 200), (0.5, 100), (0.0, 30), (-0.01, 30)],
)
def test_the_credit_is_what_the_least_ran_on_before_it_asked_again(
    fair_lib, asked_after, credit_ms
):
    """From then on it wanted the GPU: waiting for a turn, its grant's prefetch."""
    page = Page(fair_lib)
    away_and_back(page, asked_after)
    assert page.charged_till_held(least_ms=1200) == pytest.approx(credit_ms, abs=LOOK_MS + 1)


def test_a_request_counts_once_the_next_time_back_from_idle_has_all(fair_lib):
    page = Page(fair_lib)
    away_and_back(page, asked_after=0.0)  # the floor, as above
    page.charged_till_held(least_ms=1200)
    page.tick(1)
    page.other(vtime_ms=1200, backlogged=True)
    page.look(busy_ms=0)  # idle again, in the same lease; the least then 1200
    page.tick(100)
    page.other(vtime_ms=1300, backlogged=True)
    page.look(busy_ms=0.1)
    assert page.charged_till_held(least_ms=1300) == pytest.approx(100, abs=LOOK_MS + 1)


def held_behind_the_other(fair_lib) -> Page:
    page = Page(fair_lib)
    page.charged_till_held(least_ms=1000)  # past its 30 ms floor beside the other: held
    assert fair_lib.stub_held(0)
    return page


def test_a_held_thread_goes_on_when_the_one_it_waited_for_goes_idle(fair_lib):
    """Not at its own next look: the GPU sat idle a look in each gap of the one ahead
    (policy_sim: up to 4 % of a mix's time while held work waited)."""
    page = held_behind_the_other(fair_lib)
    waiter = page.held_wait()
    page.ring()  # the other ran on, still backlogged and behind: wait again
    time.sleep(0.05)
    deadline = time.monotonic() + HOLD_S / 2  # a loaded box may not have run it yet
    while page.page.wake_waiters != 1 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert waiter.is_alive() and page.page.wake_waiters == 1
    page.other(vtime_ms=1000, backlogged=False)
    page.ring()
    waiter.join(HOLD_S / 2)
    assert not waiter.is_alive() and page.page.wake_waiters == 0
    assert not fair_lib.stub_held(0)  # its next launches go straight on


def test_a_held_thread_that_finds_the_other_idle_already_does_not_wait(fair_lib):
    page = held_behind_the_other(fair_lib)
    page.other(vtime_ms=1000, backlogged=False)
    started = time.monotonic()
    fair_lib.nvshare_fair_wait(0)
    assert time.monotonic() - started < HOLD_S / 2 and page.page.wake_waiters == 0


def test_going_idle_rings_the_bell_once(fair_lib):
    page = Page(fair_lib)
    page.other(vtime_ms=0, backlogged=True)
    page.look(busy_ms=1)
    rung = page.page.wake_seq
    page.tick(1)
    page.look(busy_ms=0)
    page.tick(1)
    page.look(busy_ms=0)
    assert page.page.wake_seq == rung + 1


def mappings_of_the_page() -> int:
    return Path("/proc/self/maps").read_text().count("fair-test")


def test_letting_the_page_go_wakes_a_held_thread_before_unmapping_it(fair_lib):
    """A held application thread reads the page: it must be out before the page goes."""
    page = held_behind_the_other(fair_lib)
    waiter = page.held_wait()
    mapped = mappings_of_the_page()  # the shim's, and the test's of each page so far
    fair_lib.nvshare_fair_detach_all()
    waiter.join(HOLD_S / 2)
    assert not waiter.is_alive() and not fair_lib.stub_held(0)
    assert mappings_of_the_page() == mapped - 1  # the shim's gone once it was out
    fair_lib.nvshare_fair_wait(0)  # no page, no hold: straight through
