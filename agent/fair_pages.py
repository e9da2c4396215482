"""Each GPU's fair page (struct nvshare_fair_page, shim/nvshare_protocol.h): a file beside
the socket that the shims holding that GPU map shared, each writing its own slot: whether
it has work, and its GPU time over its weight.  A shim holds its launches while another
with work is owed more (shim/fair_share.c); docs/scheduling.md, "Side by side".

Here the slots are handed out (a FAIR_SLOT frame, at a client's first grant on a GPU) and
taken back when the client leaves.  The agent writes only a slot's weight and in_use; the
files go when the agent stops.  No page (no socket path, a directory not writable): the
shims run side by side as the driver interleaves them, as before the page."""

from __future__ import annotations

import mmap
import os
import sys
from pathlib import Path

from . import protocol
from .eventlog import events as log

_PAGE_BYTES = protocol.ffi.sizeof("struct nvshare_fair_page")
_SLOTS = len(protocol.ffi.new("struct nvshare_fair_page *").slots)
_STATE = protocol.derived_struct("struct nvshare_fair_state")
_SLOTS_AT = protocol.ffi.offsetof("struct nvshare_fair_page", "slots")
_WEIGHT_AT = protocol.ffi.offsetof("struct nvshare_fair_state", "weight")
_IN_USE_AT = protocol.ffi.offsetof("struct nvshare_fair_state", "in_use")


def page_name(gpu: bytes) -> str:
    """The page's file name beside the socket (the shim builds the same)."""
    return "fair-" + gpu.hex()


class FairPages:
    def __init__(self, directory: Path | None):
        self._directory = directory
        self._pages: dict[bytes, mmap.mmap | None] = {}  # None: could not be made
        self._slots: dict[tuple[int, bytes], int] = {}  # (client, GPU) -> slot

    def slot_for(self, client: int, gpu: bytes, weight: int) -> int | None:
        """client's slot on gpu, a new one at its first grant there (then to be told to
        its shim: returned once); None when told already, or no page or slot is free."""
        if (client, gpu) in self._slots:
            return None
        page = self._page(gpu)
        if page is None:
            return None
        taken = set(slot for (_, g), slot in self._slots.items() if g == gpu)
        free = next((s for s in range(_SLOTS) if s not in taken), None)
        if free is None:
            return None  # that many processes on one GPU: the rest interleave
        at = _SLOTS_AT + free * _STATE.size
        page[at : at + _STATE.size] = bytes(_STATE.size)  # a new vtime, nothing backlogged
        page[at + _WEIGHT_AT : at + _WEIGHT_AT + 4] = max(1, weight).to_bytes(4, sys.byteorder)
        page[at + _IN_USE_AT : at + _IN_USE_AT + 4] = (1).to_bytes(4, sys.byteorder)
        self._slots[(client, gpu)] = free
        return free

    def frames_for(self, client: int, gpu: bytes, weight: int) -> bytes | None:
        """The FAIR_SLOT frame to send client at a grant on gpu, or None."""
        slot = self.slot_for(client, gpu, weight)
        return None if slot is None else protocol.encode_fair_slot(gpu, slot, max(1, weight))

    def client_gone(self, client: int) -> None:
        """Its slots are zeroed: not backlogged, free for the next."""
        for (owner, gpu), slot in [item for item in self._slots.items() if item[0][0] == client]:
            del self._slots[(owner, gpu)]
            page = self._pages.get(gpu)
            if page is not None:
                at = _SLOTS_AT + slot * _STATE.size
                page[at : at + _STATE.size] = bytes(_STATE.size)

    def close(self) -> None:
        for gpu, page in self._pages.items():
            if page is None:
                continue
            page.close()
            try:
                os.unlink(self._directory / page_name(gpu))  # type: ignore[operator]
            except OSError:
                pass
        self._pages.clear()
        self._slots.clear()

    def _page(self, gpu: bytes) -> mmap.mmap | None:
        if gpu in self._pages:
            return self._pages[gpu]
        page = None
        if self._directory is not None:
            path = self._directory / page_name(gpu)
            try:
                # Made afresh (an old agent's slots mean nothing now), readable and
                # writable by every shim that may reach the socket beside it.
                fd = os.open(path.with_suffix(".new"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666)
                try:
                    os.fchmod(fd, 0o666)
                    os.ftruncate(fd, _PAGE_BYTES)
                    page = mmap.mmap(fd, _PAGE_BYTES)
                finally:
                    os.close(fd)
                page[0:4] = protocol.MAGIC.to_bytes(4, sys.byteorder)
                os.replace(path.with_suffix(".new"), path)
            except OSError as error:
                log.warning("fair page for gpu=%s not made: %s", gpu.hex(), error)
                page = None
        self._pages[gpu] = page
        return page
