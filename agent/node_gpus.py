"""The node's GPUs, for the scheduling core: those the inventory (NVML) lists and those
clients named, who may name which, the settings each runs by and the switch it goes
through when they change, and whether its memory fits.  Pure, no I/O.  The scheduler
(scheduler.py) holds one and has the rules look at each GPU these touch: nothing here
grants or decides."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from . import memory_fit
from .actions import Action, ModeChanged, Refuse, SendSettings
from .core_state import EXCLUSIVE, SHARED, ClientState, GpuState
from .gpu_settings import GpuSettingsBook, ModeSwitch
from .learned_gpus import LearnedGpus
from .leases import DropReason, Leases
from .settings import NO_OVERRIDES, AntiThrash, Settings

# Byte counts are u64 wherever they go (the wire, D-Bus 't'); two u64 fields
# of one report can add up to more, which no one could show.
MAX_BYTES = 2**64 - 1


class NodeGpus:
    def __init__(
        self,
        settings: Settings,
        gpus: dict[bytes, GpuState],
        clients: dict[int, ClientState],
        leases: Leases,
        max_gpus_per_client: int,
        format_gpu: Callable[[bytes], str],
    ):
        self.settings = settings  # node-wide, with each GPU's own (GpuSettingsBook)
        self._book = GpuSettingsBook(settings)
        self.gpus, self._clients, self._leases = gpus, clients, leases
        self.max_gpus_per_client = max_gpus_per_client
        self._format_gpu = format_gpu  # only for refusals: the core keeps raw ids
        self.inventory_known = False
        self._inventory_missing = False  # NVML could not be read: none will come
        self._next_index = 0
        self._learned = LearnedGpus()

    # ------------------------------------------------------------ inventory

    def add(
        self,
        uuid: bytes,
        name: str,
        memory_total_bytes: int,
        now: float,
        index: int | None,
        actions: list[Action],
    ) -> GpuState:
        """A GPU the node has (from NVML); kept even when no client uses it.  index:
        NVML's number for it; by default the next one (the engine adds GPUs in
        NVML's order)."""
        gpu = self.gpus.get(uuid)
        if index is None:
            index = self._next_index if gpu is None or gpu.index is None else gpu.index
        self._next_index = max(self._next_index, index + 1)
        if gpu is None:
            gpu = self.gpus[uuid] = GpuState(uuid, index=index)
            self.settle(gpu, now, actions, fresh=True)
        else:
            self._learned.forget(gpu)
            gpu.index = index
            self.settle(gpu, now, actions)  # it may have settings by index
        gpu.name, gpu.memory_total_bytes, gpu.from_inventory = name, memory_total_bytes, True
        self.inventory_known = True
        self.refit(gpu, now, actions, "inventory")
        return gpu

    def inventory_missing(self, actions: list[Action]) -> None:
        """NVML could not be read: GPUs come from clients only, and none has an index."""
        self._inventory_missing = True
        self._note_unused_index_settings(actions)

    def allow(self, uuid: bytes) -> None:
        """An id the inventory knows but does not schedule on its own (a MIG instance):
        clients may name it."""
        self._learned.also_known.add(uuid)

    def forget_learned(self, gpu: GpuState) -> None:
        """A GPU learned from clients only, its last client gone."""
        self._learned.forget(gpu)

    # ------------------------------------------------------------ who may name which GPU

    def use(
        self, client: int, state: ClientState, uuid: bytes, actions: list[Action]
    ) -> Refuse | None:
        """The client names a GPU it had not named (HELLO, a request, a report): a refusal,
        or it is the GPU's user from now on (learned from it where the inventory does not
        list it)."""
        if len(state.gpus) >= self.max_gpus_per_client:
            return Refuse(client, f"more than {self.max_gpus_per_client} GPUs on one connection")
        gpu = self.gpus.get(uuid)
        if gpu is None:
            refusal = self._learned.refusal(state.uid, uuid, self.inventory_known, self._format_gpu)
            if refusal:
                return Refuse(client, refusal)
            gpu = self.gpus[uuid] = self._learned.learn(uuid, state.uid)
            self.settle(gpu, 0.0, actions, fresh=True)
        state.gpus[uuid] = None
        gpu.users.add(client)
        return None

    # ------------------------------------------------------------ each GPU's settings

    def change_settings(self, settings: Settings, actions: list[Action]) -> None:
        """New settings, node-wide and per GPU; the scheduler then settles each GPU."""
        previous, self.settings = self.settings, settings
        self._book.replace(settings)
        if _wire_settings(previous) != _wire_settings(settings):
            actions.append(SendSettings(None, settings))  # the node-wide ones: for every shim
        self._note_unused_index_settings(actions)

    def settle(self, gpu: GpuState, now: float, actions: list[Action], fresh: bool = False) -> None:
        """Bring the GPU's own settings up to date (gpu_settings.py), switching its mode
        as a node-wide change switches every GPU's (docs/scheduling.md, "On and off").
        fresh: a GPU just added, with no lease or waiter yet."""
        settled = self._book.settle(gpu, self.settings, fresh)
        if settled.applied is not None:
            actions.append(settled.applied)
        if settled.switch is ModeSwitch.TO_OFF:
            for held in gpu.holders.values():
                held.drop_requested_at = None  # nothing to make room for any more
        elif settled.switch is ModeSwitch.TO_ON:
            # Shared holders must all leave before anyone holds exclusively; a lone
            # exclusive holder (granted before anti-thrash went off) keeps its lease.
            holders = gpu.holders
            if len(holders) != 1 or next(iter(holders.values())).mode != EXCLUSIVE:
                self._leases.ask_each_to_drop(gpu, now, actions, DropReason.ANTI_THRASH_ON)
        elif settled.switch is ModeSwitch.OFF_TO_AUTO:
            # Leases of "off" are shared and never given back when idle: have
            # them asked again, so they get leases of auto's kind.
            self._leases.ask_each_to_drop(gpu, now, actions, DropReason.ANTI_THRASH_AUTO)
        if settled.refit:
            self.refit(gpu, now, actions, "settings", always_log=True)

    def _note_unused_index_settings(self, actions: list[Action]) -> None:
        unused = self._book.unused_index_settings(
            self.settings, self._inventory_missing, self.inventory_known
        )
        if unused is not None:
            actions.append(unused)

    # ------------------------------------------------------------ memory (auto)

    def refit(
        self,
        gpu: GpuState,
        now: float,
        actions: list[Action],
        reason: str,
        always_log: bool = False,
    ) -> None:
        """Recompute the GPU's demand and capacity, and whether its memory fits."""
        capacity = memory_fit.capacity(memory_fit.own_total(gpu), gpu.settings.memory_limit_bytes)
        demand = memory_fit.demand_of(gpu, self._clients, gpu.users)  # everyone at once
        demand = min(demand, MAX_BYTES)
        fits = memory_fit.fits(gpu.fits, demand, capacity)
        gpu.demand_bytes, gpu.capacity_bytes = demand, capacity
        changed = fits != gpu.fits
        gpu.fits = fits
        if gpu.settings.anti_thrash is not AntiThrash.AUTO:
            return
        if changed or always_log:
            mode = SHARED if fits else EXCLUSIVE
            actions.append(ModeChanged(gpu.uuid, mode, demand, capacity, reason))


def _wire_settings(settings: Settings) -> Settings:
    """What SETTINGS tells every shim: the node-wide settings, less what only the
    agent reads (the GPUs' own, the share groups)."""
    return dataclasses.replace(settings.for_gpu(NO_OVERRIDES), shares=())
