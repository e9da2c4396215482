"""The engine: the one place that acts.  It owns the scheduling core, the clock,
and the parts that act for it, each in its own module: the ActionRunner
(action_runner.py: every action the core returns carried out, frames to shims
through their links and log lines), the timers (timers.py: the core's deadline,
keepalives, change notifications) and SettingsChanges (settings_changes.py:
validated, saved off the event loop, then applied here).  Hang-ups reach the
core here, as events after the actions being carried out.

Adapters only translate: the socket adapter (shim_connections.py) turns
frames into calls of client_* here and implements ClientLink; the D-Bus
adapter (dbus_api.py) turns property reads, writes and method calls into
snapshot() and change_settings(); the NVML adapter feeds add_gpus() and
nvml_processes().  Data flows one way: adapter -> engine -> core -> actions
-> adapters; nothing reaches back into the core from inside an adapter.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from . import protocol
from .action_runner import ActionRunner, ClientLink, gpu_name
from .actions import Grant
from .eventlog import events as log
from .fair_pages import FairPages
from .identity import ClientIdentity, identify
from .nvml import GpuInfo
from .protocol import ErrorCode, Features, MessageType
from .scheduler import Scheduler
from .settings import FairPage, Settings, SettingsError, SettingsNotSaved
from .settings_changes import SettingsChanges, describe_settings
from .settings_files import SettingsStore
from .settings_sources import SettingsOrigin, ValueSource, value_sources
from .snapshot import AgentSnapshot
from .statistics import GpuStatistics
from .timers import KEEPALIVE_S, ChangeNotifier, CoreTimer, Keepalives

# What this agent announces in WELCOME (with KEEPALIVE_S, how often a waiting
# shim hears from it).  MEMORY_CAP: a shim's caps come before its WELCOME.
AGENT_FEATURES = (
    int(Features.GPU_MEMORY)
    | int(Features.KEEPALIVE)
    | int(Features.USAGE)
    | int(Features.MEMORY_CAP)
)

_FAIR = int(Features.FAIR)
_LOCK_REQUEST = int(MessageType.LOCK_REQUEST)
_RELEASED = int(MessageType.RELEASED)


class Engine:
    def __init__(
        self,
        settings: Settings,
        store: SettingsStore,
        overrides: dict | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        origin: SettingsOrigin | None = None,
    ):
        self.loop = loop or asyncio.get_running_loop()
        self.core = Scheduler(settings, max_gpus_per_client=protocol.MAX_GPUS, format_gpu=gpu_name)
        # The rules look once per turn of the loop, over every connection's frames of
        # it (batch_done): at each frame, a crowd arriving at once made the agent fall
        # seconds behind, HELLOs unanswered and memory caps untold (issue 45).
        self.core.decide_later = True
        self._look_due = self._stopped = False
        self.links: dict[int, ClientLink] = {}
        self._last_client_id = 0
        self._gone: list[int] = []
        self.identities: dict[int, ClientIdentity] = {}
        self.timer = CoreTimer(self.loop, self._tick)
        self.keepalives = Keepalives(self.loop, self.core, self.links)
        self._notifier = ChangeNotifier(self.loop)
        self._actions = ActionRunner(
            self.links,
            self.keepalives,
            lambda: self.core.settings,
            self._look_up_identity,
            self._tell_fair_slot,
        )
        self._settings_changes = SettingsChanges(store, overrides, self.loop)
        # What the config gave at start: each value's source, and what a reset goes back to.
        self.settings_origin = origin or SettingsOrigin()
        self.fair_pages = FairPages()  # each GPU's, made at its first fair slot

    # ------------------------------------------------------------ from the socket adapter

    def client_connected(self, link: ClientLink) -> int:
        self._last_client_id += 1
        client = self._last_client_id
        self.links[client] = link
        self.core.connect(client, link.pid, link.uid, link.gid, self.loop.time())
        self.timer.arm(self.core.next_deadline())
        return client

    def client_message(self, client: int, message, now: float) -> None:
        """One decoded frame from a shim; call batch_done() after a batch.

        A client leaves self.links the moment the engine learns it is gone, and the
        core only after that (_flush_gone): a frame for a client not in self.links
        (read after its hang-up) must not reach the core, which may have forgotten it."""
        link = self.links.get(client)
        if link is None:
            if log.debug_enabled:
                log.debug("dropped frame=%s client=%d reason=gone", type(message).__name__, client)
            return
        core = self.core
        if type(message) is protocol.LockMessage:
            if message.type == _LOCK_REQUEST:
                if log.debug_enabled:
                    log.debug("request gpu=%s pid=%d", gpu_name(message.gpu), link.pid)
                actions = core.request(client, message.gpu, now)
            elif message.type == _RELEASED:
                actions = core.release(client, message.gpu, message.lease, now, message.idle_ms)
            else:
                name = MessageType(message.type).name
                self.client_failed(client, ErrorCode.PROTOCOL, f"{name} is sent by the agent only")
                return
        elif type(message) is protocol.Hello:
            link.features = message.features
            actions = core.hello(client, message.gpus, message.command, now, message.features)
            self.execute(actions)
            if link.greeted:
                # The caps before WELCOME: a shim's allocations wait for WELCOME, so the
                # first one is capped (docs/protocol.md).
                self.execute(core.memory_caps(client))
                link.send(protocol.encode_welcome(AGENT_FEATURES, int(KEEPALIVE_S * 1000)))
            return
        elif type(message) is protocol.MemoryReport:
            actions = core.memory_report(
                client, message.gpu, message.managed_bytes, message.unmanaged_bytes, now
            )
        elif type(message) is protocol.GpuUsage:
            actions = core.gpu_usage(client, message.gpu, message.busy_us, now)
        elif type(message) is protocol.GpuMemory:
            actions = core.gpu_memory(client, message.gpu, message.total_bytes, now)
        else:
            name = type(message).__name__.upper()
            self.client_failed(client, ErrorCode.PROTOCOL, f"{name} is sent by the agent only")
            return
        self.execute(actions)

    def client_failed(self, client: int, code: int, reason: str) -> None:
        """A frame the peer must not send: one log line, ERROR, close."""
        self._actions.close_client(client, code, reason)

    def client_gone(self, client: int) -> None:
        """The connection closed.  The core hears of it as an event a moment later,
        after the actions being carried out now, together with every other connection
        that closed in the same turn of the event loop (many waiters exiting at once),
        so that no grant goes to one of them in between.  Until then the client is in
        the core but not in self.links: frames for it are dropped (client_message),
        grants to it are not sent (_gone_before_grant)."""
        if self.links.pop(client, None) is None:
            return
        self.fair_pages.client_gone(client)
        self.identities.pop(client, None)
        if not self._gone:
            self.loop.call_soon(self._flush_gone)
        self._gone.append(client)

    def _flush_gone(self) -> None:
        gone, self._gone = self._gone, []
        self.execute(self.core.disconnect_many(gone, self.loop.time()))
        self.batch_done()

    def batch_done(self) -> None:
        """After a batch of frames, or any event: the rules look at the GPUs touched once
        this turn of the event loop is done (the core decides nothing before); the timer
        is re-armed and subscribers told."""
        if self._stopped:
            return
        if self.core.undecided and not self._look_due:
            self._look_due = True
            self.loop.call_soon(self._look)
        self.timer.arm(self.core.next_deadline())
        self._notifier.changed()

    def _look(self) -> None:
        self._look_due = False
        if self._stopped:
            return
        self.execute(self.core.decide_pending(self.loop.time()))
        self.batch_done()

    # ------------------------------------------------------------ from NVML

    def add_gpus(self, gpus: list[GpuInfo], also_known: tuple[bytes, ...] = ()) -> None:
        now = self.loop.time()
        for uuid in also_known:
            self.core.allow_gpu(uuid)
        for gpu in gpus:
            log.info(
                "gpu uuid=%s name=%s memory_total_bytes=%d index=%s",
                gpu_name(gpu.uuid),
                gpu.name.replace(" ", "_"),
                gpu.memory_total_bytes,
                "-" if gpu.index is None else gpu.index,
            )
            self.execute(
                self.core.add_gpu(gpu.uuid, gpu.name, gpu.memory_total_bytes, now, gpu.index)
            )
        self.batch_done()

    def inventory_missing(self) -> None:
        """NVML could not be read (or lists no GPU): GPUs come from clients only."""
        self.execute(self.core.inventory_missing())

    def nvml_processes(self, readings: dict[bytes, dict[int, int]]) -> None:
        self.execute(self.core.nvml_processes(readings, self.loop.time()))
        self.batch_done()

    # ------------------------------------------------------------ control (D-Bus)

    @property
    def settings(self) -> Settings:
        return self.core.settings

    def snapshot(self) -> AgentSnapshot:
        snapshot = self.core.snapshot(self.loop.time())
        if not self.identities:
            return snapshot
        by_pid = {self.links[c].pid: who for c, who in self.identities.items() if c in self.links}
        clients = tuple(
            dataclasses.replace(c, user=who.user, unit=who.unit, container=who.container)
            if (who := by_pid.get(c.pid)) is not None
            else c
            for c in snapshot.clients
        )
        return dataclasses.replace(snapshot, clients=clients)

    def gpu_statistics(self) -> dict[str, GpuStatistics]:
        """What was done on each GPU since the agent started, by UUID."""
        return {gpu_name(uuid): stats for uuid, stats in self._actions.statistics.items()}

    async def change_settings(self, **changes) -> Settings:
        """Validate, save, apply.  gpu_overrides, when given, replaces every GPU's
        own settings: (GPU id, GpuOverrides) pairs.  Raises SettingsError (a bad
        value) or SettingsNotSaved (the state file cannot be written), each one
        human sentence, and changes nothing then."""
        return await self.change_settings_from(lambda current: changes)

    async def change_settings_from(self, derive: Callable[[Settings], dict]) -> Settings:
        """change_settings with the changes derived from the settings as they are once
        this change's turn comes: two changes of one table (shares) made at once each
        keep the other's."""
        async with self._settings_changes.one_at_a_time:
            new = await self._settings_changes.save(self.settings, derive(self.settings))
            return self._apply(new)

    async def reset_setting(self, kind: str, entry: str | None, name: str) -> Settings:
        """Take one run-time change back (settings_sources.pin_address names it): the
        config's value applies again.  Raises SettingsNotSaved, as change_settings."""
        async with self._settings_changes.one_at_a_time:
            config = self.settings_origin.settings
            return self._apply(await self._settings_changes.reset(config, kind, entry, name))

    def _apply(self, new: Settings) -> Settings:
        before = self.settings
        if new != before:
            self.execute(self.core.change_settings(new, self.loop.time()))
            log.info("settings %s", describe_settings(new))
            if new.fair_page is not before.fair_page:
                self.fair_pages.mark_in_use(new.fair_page is FairPage.ON)
            self._reweigh_fair_slots()  # shares or share_by may have changed
        self.batch_done()
        return new

    def value_sources(self) -> list[ValueSource]:
        """Each value that runs, and where it comes from (settings_sources.py)."""
        return value_sources(self.settings_origin, self._settings_changes.overrides, self.settings)

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """callback() runs in the loop after changes, at most every CHANGE_COALESCE_S
        (timers.py).  Returns an unsubscribe function."""
        return self._notifier.subscribe(callback)

    # ------------------------------------------------------------ the parts it owns

    def execute(self, actions: list) -> None:
        """Carry out the core's actions, in order (action_runner.py)."""
        self._actions.run(actions)

    def _tell_fair_slot(self, grant: Grant) -> None:
        """Right after a grant's frame (the action runner calls it): a shim that takes one
        gets its slot in the GPU's fair page at its first grant there; where the frame
        cannot go now (frames queued before it), at a later one."""
        link = self.links.get(grant.client)
        if link is None or not link.features & _FAIR or self.settings.fair_page is FairPage.OFF:
            return
        gpu, state = self.core.gpus[grant.gpu], self.core.clients[grant.client]
        weight = self.core.shares.client_weight(gpu, state)
        given = self.fair_pages.slot_for(grant.client, grant.gpu, weight)
        if given is None:
            return
        slot, page_fd = given
        if not link.send_with_fd(protocol.encode_fair_slot(grant.gpu, slot, weight), page_fd):
            self.fair_pages.give_back(grant.client, grant.gpu)
            return
        log.info("fair slot gpu=%s pid=%d weight=%d", gpu_name(grant.gpu), grant.pid, weight)

    def _reweigh_fair_slots(self) -> None:
        """The weights in the fair pages follow the share groups': a shim reads its own
        from its slot, so a group's new weight reaches shims already holding a slot."""
        core = self.core

        def weight_of(client: int, uuid: bytes) -> int | None:
            gpu, state = core.gpus.get(uuid), core.clients.get(client)
            return None if gpu is None or state is None else core.shares.client_weight(gpu, state)

        for client, uuid, weight in self.fair_pages.reweigh(weight_of):
            link = self.links.get(client)
            pid = link.pid if link is not None else 0
            log.info("fair weight gpu=%s pid=%d weight=%d", gpu_name(uuid), pid, weight)

    def _tick(self, now: float) -> None:
        self.execute(self.core.tick(now))
        self.execute(self.core.decide_pending(now))  # at the deadline's time, not later
        self.batch_done()

    def cancel_timers(self) -> None:
        self._stopped = True  # a look already due finds nothing to arm
        self.timer.cancel()
        self.keepalives.cancel()
        self._notifier.cancel()

    def _look_up_identity(self, client: int, pid: int, uid: int) -> None:
        """User name and unit for status, read off the loop (NSS may block)."""

        def done(future: asyncio.Future[ClientIdentity]) -> None:
            if future.cancelled() or future.exception() is not None:
                return
            if client in self.links:
                who = self.identities[client] = future.result()
                self.execute(
                    self.core.identified(client, who.unit, who.container, self.loop.time())
                )
                self._reweigh_fair_slots()  # share_by = unit: its group may be another now
                self._notifier.changed()

        try:
            self.loop.run_in_executor(None, identify, pid, uid).add_done_callback(done)
        except RuntimeError:  # the loop's executor is shut down: stopping
            pass


__all__ = [
    "AGENT_FEATURES",
    "ClientLink",
    "Engine",
    "SettingsError",
    "SettingsNotSaved",
    "describe_settings",
    "gpu_name",
]
