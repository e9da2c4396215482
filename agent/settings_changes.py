"""Run-time settings changes, as the engine takes them: validated, saved to
the state file before they apply, one at a time.  The engine applies what
save() returns to the core and logs it (describe_settings)."""

from __future__ import annotations

import asyncio
from typing import Any

from .eventlog import events as log
from .settings import AntiThrash, Settings, SettingsNotSaved, gpu_override_entries
from .settings_files import SettingsStore, overrides_after, settings_over
from .settings_store import without_pin


class SettingsChanges:
    def __init__(
        self,
        store: SettingsStore,
        overrides: dict[str, Any] | None,
        loop: asyncio.AbstractEventLoop,
    ):
        self._store = store
        self._overrides = dict(overrides or {})
        self._loop = loop
        # Held from save() until the change is applied: two Sets at once must not
        # lose one's save.
        self.one_at_a_time = asyncio.Lock()

    async def save(self, current: Settings, changes: dict[str, Any]) -> Settings:
        """The settings after `changes`, saved.  gpu_overrides, when given, replaces
        every GPU's own settings: (GPU id, GpuOverrides) pairs.  Raises SettingsError
        (a bad value) or SettingsNotSaved (the state file cannot be written), each one
        human sentence, and saves nothing then."""
        if "gpu_overrides" in changes:
            changes["gpu_overrides"] = gpu_override_entries(changes["gpu_overrides"])
        new = current.replaced(**changes)
        # Save before applying: a change that only lasts until the next restart,
        # reported as done, would silently undo itself later.  Persist even an
        # unchanged node-wide value: the admin chose it explicitly.  fsync can
        # take seconds on a busy disk: not on the event loop.
        await self._save(overrides_after(self._overrides, current, new, changes))
        return new

    async def reset(self, config: Settings, kind: str, entry: str | None, name: str) -> Settings:
        """The settings once one run-time change is taken back (settings_store.without_pin):
        the config's value there again, saved.  Raises SettingsNotSaved, as save()."""
        new, overrides, _ = settings_over(
            config, without_pin(self._overrides, kind, entry, name), self._store.path
        )
        await self._save(overrides)
        return new

    @property
    def overrides(self) -> dict[str, Any]:
        """The run-time changes, as saved (settings_store.py's pins)."""
        return self._overrides

    async def _save(self, overrides: dict[str, Any]) -> None:
        try:
            await self._loop.run_in_executor(None, self._store.save_overrides, overrides)
        except OSError as e:
            reason = (
                f"settings not changed: could not save them to {self._store.path}: "
                f"{e.strerror or e}"
            )
            log.error("%s", reason)
            raise SettingsNotSaved(reason) from None
        self._overrides = overrides


def describe_settings(s: Settings) -> str:
    """The settings as one log line's key=value pairs (GPUs' own: gpu settings lines)."""
    own = ",".join(
        f"{gpu_id}:" + "+".join(f"{k}={_plain(v)}" for k, v in o.given().items())
        for gpu_id, o in s.gpu_overrides
    )
    return (
        f"time_quantum_s={s.time_quantum_s} anti_thrash={s.anti_thrash} "
        f"idle_release_ms={s.idle_release_ms} drop_grace_ms={s.drop_grace_ms} "
        f"light_wait_ms={s.light_wait_ms} min_slice_ms={s.min_slice_ms} "
        f"memory_limit_bytes={s.memory_limit_bytes} "
        f"gpu_settings={own or '-'} share_by={s.share_by} shares={_shares_text(s) or '-'} "
        f"fair_page={s.fair_page}"
    )


def _shares_text(s: Settings) -> str:
    return ",".join(
        f"{group}:" + "+".join(f"{k}={v}" for k, v in share.given().items())
        for group, share in s.shares
    )


def _plain(value: object) -> object:
    return value.value if isinstance(value, AntiThrash) else value
