"""GPUs the core learns from its clients: ids that no inventory lists (no NVML:
containers, CI) but a client names.  Bounded per uid and in all, so that a user
cannot make the agent track (and every status read list) thousands.  Part of
the scheduling core: pure, no I/O."""

from __future__ import annotations

from collections.abc import Callable

from .core_state import GpuState

# One uid may introduce this many, all uids together MAX_LEARNED_GPUS.
MAX_LEARNED_GPUS_PER_UID = 64
MAX_LEARNED_GPUS = 1024


class LearnedGpus:
    def __init__(self) -> None:
        self.also_known: set[bytes] = set()  # from the inventory but not scheduled (MIG)
        self._by_uid: dict[int, int] = {}
        self._count = 0

    def refusal(
        self, uid: int, uuid: bytes, inventory_known: bool, format_gpu: Callable[[bytes], str]
    ) -> str | None:
        """Why uid may not make the core track the GPU uuid, which it does not track
        yet; None: it may."""
        if inventory_known and uuid not in self.also_known:
            return f"GPU {format_gpu(uuid)} is not on this node"
        if self._count >= MAX_LEARNED_GPUS:
            return f"the agent already tracks {MAX_LEARNED_GPUS} GPUs it cannot see"
        if self._by_uid.get(uid, 0) >= MAX_LEARNED_GPUS_PER_UID:
            return f"uid {uid} already named {MAX_LEARNED_GPUS_PER_UID} GPUs the agent cannot see"
        return None

    def learn(self, uuid: bytes, uid: int) -> GpuState:
        """A GPU uid named first (refusal() said it may)."""
        self._by_uid[uid] = self._by_uid.get(uid, 0) + 1
        self._count += 1
        return GpuState(uuid, introduced_by=uid)

    def forget(self, gpu: GpuState) -> None:
        """The GPU no longer counts as learned: gone with its clients, or the
        inventory lists it now."""
        uid = gpu.introduced_by
        if uid is None:
            return
        gpu.introduced_by = None
        self._count -= 1
        left = self._by_uid.get(uid, 0) - 1
        if left > 0:
            self._by_uid[uid] = left
        else:
            self._by_uid.pop(uid, None)
