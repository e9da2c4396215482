"""One shim's look at its GPU's fair page (shim/fair_share.c), driven directly: the file
built alone with a stub of what it needs (fair_look_stub.c), the page a memfd this test
writes the other slots of, as the other shims would."""

from __future__ import annotations

import mmap
import os
import subprocess
import time
from pathlib import Path

import cffi
import pytest

from nvshare_agent import protocol

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "shim"
MS = 1_000_000  # ns
MINE, OTHER = 0, 1


@pytest.fixture(scope="module")
def fair_lib(tmp_path_factory):
    library = tmp_path_factory.mktemp("fair_look") / "libfair_look.so"
    subprocess.run(
        ["gcc", "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared"]
        + ["-include", str(SHIM / "glibc_baseline.h"), f"-I{SHIM}"]
        + [str(SHIM / "fair_share.c"), str(Path(__file__).with_name("fair_look_stub.c"))]
        + ["-o", str(library)],
        check=True,
    )
    ffi = cffi.FFI()
    ffi.cdef(
        """void nvshare_fair_look(int gpu, int open, int busy, double busy_ms);
        void nvshare_fair_granted(int gpu, double waited_ms);
        void nvshare_fair_forget_after_fork(void);
        void stub_attach(int gpu, unsigned slot, int fd);
        int stub_held(int gpu);"""
    )
    return ffi.dlopen(str(library))


class Page:
    """A GPU's fair page as the agent makes it, this process in slot MINE."""

    def __init__(self, lib):
        self.lib = lib
        fd = os.memfd_create("fair-test")
        os.ftruncate(fd, protocol.ffi.sizeof("struct nvshare_fair_page"))
        self.map = mmap.mmap(fd, protocol.ffi.sizeof("struct nvshare_fair_page"))
        self.page = protocol.ffi.from_buffer("struct nvshare_fair_page *", self.map)
        self.page.magic = protocol.MAGIC
        for slot in (MINE, OTHER):
            self.page.slots[slot].in_use = 1
            self.page.slots[slot].weight = 1
        lib.nvshare_fair_forget_after_fork()  # a fresh shim's state
        lib.stub_attach(0, MINE, fd)  # it closes the descriptor

    def other(self, vtime_ms: float, backlogged: bool) -> None:
        """The other process's look: fresh now."""
        slot = self.page.slots[OTHER]
        slot.vtime_ns, slot.backlogged = int(vtime_ms * MS), int(backlogged)
        slot.seen_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)

    def look(self, busy_ms: float) -> None:
        self.lib.nvshare_fair_look(0, 1, int(busy_ms > 0), busy_ms)

    @property
    def mine_ms(self) -> float:
        return self.page.slots[MINE].vtime_ns / MS


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


def back_after(lib, waited_ms):
    """Busy beside OTHER, idle 15 ms while OTHER runs on 200 ms of virtual time, back
    (granted after waited_ms), then 40 ms charged: held, or not?"""
    page = Page(lib)
    page.other(vtime_ms=1000, backlogged=True)
    page.look(busy_ms=1)
    page.look(busy_ms=0)  # idle, the least then 1000
    time.sleep(0.015)  # past IDLE_MS: back from idle, not from a short gap
    page.other(vtime_ms=1200, backlogged=True)
    if waited_ms:
        lib.nvshare_fair_granted(0, waited_ms)
    page.look(busy_ms=0.1)
    page.other(vtime_ms=1200, backlogged=True)
    page.look(busy_ms=80)  # 40 ms charged beside OTHER: past the 30 ms floor
    return lib.stub_held(0)


def test_back_from_idle_a_credit_of_what_the_others_ran_meanwhile(fair_lib):
    assert back_after(fair_lib, waited_ms=0) == 0


def test_time_waited_for_a_grant_earns_no_credit(fair_lib):
    """It wanted the GPU then: only the floor (BURST_CREDIT_MS), so it is held."""
    assert back_after(fair_lib, waited_ms=1000) == 1
