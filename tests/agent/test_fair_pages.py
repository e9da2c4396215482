"""The fair pages' slots (agent/fair_pages.py): a real file beside the socket, as the shim
maps it (struct nvshare_fair_page)."""

import mmap

from nvshare_agent import protocol
from nvshare_agent.fair_pages import FairPages, page_name

GPU = bytes(range(16))
STATE = protocol.derived_struct("struct nvshare_fair_state")
SLOTS_AT = protocol.ffi.offsetof("struct nvshare_fair_page", "slots")


def slot_fields(path, slot):
    with open(path, "rb") as f:
        page = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        names = [name for name, _ in protocol.ffi.typeof("struct nvshare_fair_state").fields]
        values = STATE.unpack_from(page, SLOTS_AT + slot * STATE.size)
        return dict(zip(names, values))


def test_a_first_grant_takes_a_slot_with_its_weight_once_and_leaving_frees_it(tmp_path):
    pages = FairPages(tmp_path)
    frame = pages.frames_for(1, GPU, 3)
    assert protocol.FrameReader().feed(frame) == [protocol.FairSlot(GPU, 0, 3)]
    assert pages.frames_for(1, GPU, 3) is None  # told once
    path = tmp_path / page_name(GPU)
    assert path.stat().st_mode & 0o777 == 0o666  # every shim that reaches the socket
    assert slot_fields(path, 0)["weight"] == 3 and slot_fields(path, 0)["in_use"] == 1
    assert protocol.FrameReader().feed(pages.frames_for(2, GPU, 1))[0].slot == 1
    pages.client_gone(1)
    assert slot_fields(path, 0)["in_use"] == 0
    assert protocol.FrameReader().feed(pages.frames_for(3, GPU, 0))[0] == protocol.FairSlot(
        GPU, 0, 1
    )
    pages.close()
    assert not path.exists()


def test_without_a_directory_there_is_no_page_and_no_frame():
    assert FairPages(None).frames_for(1, GPU, 1) is None
