"""The settings each GPU runs by, and the switch it goes through when they
change.  A GPU runs by the node-wide settings with what it sets for itself over
them: by NVML index and, over that, by UUID.  Part of the scheduling core: pure,
no I/O.  The scheduler (scheduler.py) settles a GPU's settings here when the GPU
appears, when settings change and when the inventory gives the GPU its index,
and carries out the switch this returns with the rules' own moves
(docs/scheduling.md, "On and off")."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .actions import GpuSettingsApplied, IndexSettingsUnused
from .core_state import GpuState
from .settings import NO_OVERRIDES, AntiThrash, GpuOverrides, Settings


class ModeSwitch(enum.Enum):
    """What a GPU's leases need when its anti-thrash mode changes, as when a
    node-wide change switches every GPU's."""

    NONE = "none"
    TO_OFF = "to off"  # pending drop requests lapse: nothing to make room for any more
    TO_ON = "to on"  # shared holders are asked to drop; exclusive once the GPU is free
    OFF_TO_AUTO = "off to auto"  # leases of off, shared and never given back, asked again


@dataclass(frozen=True, slots=True)
class Settled:
    applied: GpuSettingsApplied | None  # its own settings changed: the engine logs them
    switch: ModeSwitch
    refit: bool  # auto now, or auto with another memory limit: its memory fit anew


class GpuSettingsBook:
    """Each GPU's own settings, looked up by NVML index and by UUID."""

    def __init__(self, settings: Settings) -> None:
        self._own_by_key = settings.gpu_overrides_by_key()
        self._told_unused: set[str] = set()  # index-keyed GPU settings said to apply to nothing

    def replace(self, settings: Settings) -> None:
        self._own_by_key = settings.gpu_overrides_by_key()

    def own(self, gpu: GpuState) -> GpuOverrides:
        """What the GPU sets for itself: by NVML index, and by UUID over that."""
        by_key = self._own_by_key
        if not by_key:
            return NO_OVERRIDES
        by_uuid = by_key.get(gpu.uuid)
        by_index = by_key.get(gpu.index) if gpu.index is not None else None
        if by_uuid is None:
            return by_index or NO_OVERRIDES
        return by_uuid.over(by_index)

    def settle(self, gpu: GpuState, node: Settings, fresh: bool) -> Settled:
        """Bring gpu.own and gpu.settings up to date with the node's settings `node`.
        fresh: a GPU just added, with no lease or waiter yet (no switch)."""
        own = self.own(gpu)
        new = node.for_gpu(own)
        previous, own_before = gpu.settings, gpu.own
        gpu.own, gpu.settings = own, new
        applied = None
        if own != own_before:
            applied = GpuSettingsApplied(gpu.uuid, gpu.index, new, tuple(own.given()))
        if fresh or new == previous:
            return Settled(applied, ModeSwitch.NONE, refit=False)
        was, mode = previous.anti_thrash, new.anti_thrash
        switch = ModeSwitch.NONE
        if mode is AntiThrash.OFF and was is not AntiThrash.OFF:
            switch = ModeSwitch.TO_OFF
        elif mode is AntiThrash.ON and was is not AntiThrash.ON:
            switch = ModeSwitch.TO_ON
        elif mode is AntiThrash.AUTO and was is AntiThrash.OFF:
            switch = ModeSwitch.OFF_TO_AUTO
        refit = mode is AntiThrash.AUTO and (
            was is not AntiThrash.AUTO or previous.memory_limit_bytes != new.memory_limit_bytes
        )
        return Settled(applied, switch, refit)

    def unused_index_settings(
        self, settings: Settings, inventory_missing: bool, inventory_known: bool
    ) -> IndexSettingsUnused | None:
        """Settings for GPUs by NVML index with no inventory to look the index up
        in apply to no GPU: say so, once for each such id."""
        if not inventory_missing or inventory_known:
            return None
        by_index = tuple(gpu_id for gpu_id, _ in settings.gpu_overrides if gpu_id.isdigit())
        if not set(by_index) - self._told_unused:
            return None
        self._told_unused.update(by_index)
        return IndexSettingsUnused(by_index)
