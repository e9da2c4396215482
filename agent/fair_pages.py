"""Each GPU's fair page (struct nvshare_fair_page, shim/nvshare_protocol.h): shared memory
that the shims holding that GPU map, each writing its own slot: whether it has work, and
its GPU time over its weight.  A shim holds its launches while another with work is owed
more (shim/fair_share.c); docs/scheduling.md, "Side by side".

The page is a memfd with its size sealed, handed to each shim with its FAIR_SLOT frame
(SCM_RIGHTS), at its first grant on the GPU: no file that others could open or cut short
(a mapping cut short kills its readers with SIGBUS), and nothing to mount into a container
beside the socket.  The agent writes only a slot's weight (again whenever its client's
weight changes: the shim reads it at each look) and in_use, and zeroes a slot when its
client leaves.  Switched off (the setting fair_page), it marks every slot not in use, and
hands out no more."""

from __future__ import annotations

import fcntl
import mmap
import os
import sys
from collections.abc import Callable

from . import protocol
from .eventlog import events as log

_PAGE_BYTES = protocol.ffi.sizeof("struct nvshare_fair_page")
_SLOTS = len(protocol.ffi.new("struct nvshare_fair_page *").slots)
_STATE = protocol.derived_struct("struct nvshare_fair_state")
_SLOTS_AT = protocol.ffi.offsetof("struct nvshare_fair_page", "slots")
_WEIGHT_AT = protocol.ffi.offsetof("struct nvshare_fair_state", "weight")
_IN_USE_AT = protocol.ffi.offsetof("struct nvshare_fair_state", "in_use")
# Its size fixed for good: a shim's mapping can never be cut short.
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class FairPages:
    def __init__(self) -> None:
        self._pages: dict[bytes, tuple[int, mmap.mmap] | None] = {}  # None: could not be made
        self._slots: dict[tuple[int, bytes], int] = {}  # (client, GPU) -> slot

    def slot_for(self, client: int, gpu: bytes, weight: int) -> tuple[int, int] | None:
        """A new slot for client on gpu, its weight written: (slot, the page's descriptor
        to send with FAIR_SLOT); None when it has one, or no page or slot is free."""
        if (client, gpu) in self._slots:
            return None
        made = self._page(gpu)
        if made is None:
            return None
        fd, _ = made
        taken = set(slot for (_, g), slot in self._slots.items() if g == gpu)
        free = next((s for s in range(_SLOTS) if s not in taken), None)
        if free is None:
            return None  # that many processes on one GPU: the rest interleave
        self._clear(gpu, free)  # nothing backlogged
        self._write(gpu, free, _WEIGHT_AT, max(1, weight))
        self._write(gpu, free, _IN_USE_AT, 1)
        self._slots[(client, gpu)] = free
        return free, fd

    def give_back(self, client: int, gpu: bytes) -> None:
        """client's slot on gpu was not told (its frame could not go): free again."""
        slot = self._slots.pop((client, gpu), None)
        if slot is not None:
            self._clear(gpu, slot)

    def mark_in_use(self, in_use: bool) -> None:
        """Every slot given out marked in use, or not (the setting fair_page).  A shim
        waits only for slots in use: marked not, nobody is held any more.  The slots stay
        given all the same (their shims still write them), so that none is handed to a
        second shim, and are marked in use again when the page is switched back on."""
        for (_, gpu), slot in self._slots.items():
            self._write(gpu, slot, _IN_USE_AT, int(in_use))

    def reweigh(
        self, weight_of: Callable[[int, bytes], int | None]
    ) -> list[tuple[int, bytes, int]]:
        """Each slot given out with its client's weight now, weight_of(client, GPU) (None:
        leave it), written where it changed: a share group's weight, share_by or the
        client's group changed.  The shim reads its weight from its slot at each look.
        Returns (client, GPU, weight) for each slot rewritten."""
        rewritten = []
        for (client, gpu), slot in self._slots.items():
            weight = weight_of(client, gpu)
            if weight is None:
                continue
            weight = max(1, weight)
            if self._read(gpu, slot, _WEIGHT_AT) != weight:
                self._write(gpu, slot, _WEIGHT_AT, weight)
                rewritten.append((client, gpu, weight))
        return rewritten

    def client_gone(self, client: int) -> None:
        """Its slots are zeroed: not backlogged, free for the next."""
        for owner, gpu in [key for key in self._slots if key[0] == client]:
            self.give_back(owner, gpu)

    def close(self) -> None:
        for made in self._pages.values():
            if made is not None:
                made[1].close()
                os.close(made[0])
        self._pages.clear()
        self._slots.clear()

    def _read(self, gpu: bytes, slot: int, field_at: int) -> int | None:
        made = self._pages.get(gpu)
        if made is None:
            return None
        at = _slot_at(slot) + field_at
        return int.from_bytes(made[1][at : at + 4], sys.byteorder)

    def _write(self, gpu: bytes, slot: int, field_at: int, value: int) -> None:
        """One of the agent's u32 fields of a slot (weight, in_use)."""
        made = self._pages.get(gpu)
        if made is not None:
            at = _slot_at(slot) + field_at
            made[1][at : at + 4] = value.to_bytes(4, sys.byteorder)

    def _clear(self, gpu: bytes, slot: int) -> None:
        """A slot zeroed: not in use, nothing backlogged."""
        made = self._pages.get(gpu)
        if made is not None:
            at = _slot_at(slot)
            made[1][at : at + _STATE.size] = bytes(_STATE.size)

    def _page(self, gpu: bytes) -> tuple[int, mmap.mmap] | None:
        if gpu in self._pages:
            return self._pages[gpu]
        made = None
        try:
            fd = os.memfd_create(f"nvshare-fair-{gpu.hex()}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            try:
                os.ftruncate(fd, _PAGE_BYTES)
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
                page = mmap.mmap(fd, _PAGE_BYTES)
            except OSError:
                os.close(fd)
                raise
            page[0:4] = protocol.MAGIC.to_bytes(4, sys.byteorder)
            made = (fd, page)
        except OSError as error:
            log.warning("fair page for gpu=%s not made: %s", gpu.hex(), error)
        self._pages[gpu] = made
        return made


def _slot_at(slot: int) -> int:
    """Where a slot starts in its page."""
    return _SLOTS_AT + slot * _STATE.size
