"""The fair pages' slots (agent/fair_pages.py): a sealed memfd per GPU, as the shim maps it
(struct nvshare_fair_page)."""

import fcntl
import mmap
import os

import pytest

from nvshare_agent import protocol
from nvshare_agent.fair_pages import FairPages

GPU = bytes(range(16))
STATE = protocol.derived_struct("struct nvshare_fair_state")
SLOTS_AT = protocol.ffi.offsetof("struct nvshare_fair_page", "slots")
NAMES = [name for name, _ in protocol.ffi.typeof("struct nvshare_fair_state").fields]


def slot_fields(fd: int, slot: int) -> dict:
    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as page:
        return dict(zip(NAMES, STATE.unpack_from(page, SLOTS_AT + slot * STATE.size)))


def test_a_first_grant_takes_a_slot_with_its_weight_once_and_leaving_frees_it():
    pages = FairPages()
    slot, fd = pages.slot_for(1, GPU, 3)
    assert slot == 0 and slot_fields(fd, 0)["weight"] == 3 and slot_fields(fd, 0)["in_use"] == 1
    assert pages.slot_for(1, GPU, 3) is None  # told once
    assert pages.slot_for(2, GPU, 1)[0] == 1
    pages.client_gone(1)
    assert slot_fields(fd, 0)["in_use"] == 0
    assert pages.slot_for(3, GPU, 0) == (0, fd)  # weight 0 is 1
    assert slot_fields(fd, 0)["weight"] == 1
    pages.close()


def test_a_slot_whose_frame_could_not_go_is_free_again():
    pages = FairPages()
    slot, fd = pages.slot_for(1, GPU, 2)
    pages.give_back(1, GPU)
    assert slot_fields(fd, slot)["in_use"] == 0
    assert pages.slot_for(1, GPU, 2) == (slot, fd)  # asked again at its next grant
    pages.close()


def test_nobody_can_cut_the_page_short():
    """A mapping cut short kills its readers (SIGBUS): the size is sealed."""
    pages = FairPages()
    _, fd = pages.slot_for(1, GPU, 1)
    size = os.fstat(fd).st_size
    assert size == protocol.ffi.sizeof("struct nvshare_fair_page")
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 0)
    assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK
    pages.close()
