"""Where each setting's value comes from: the built-in default, the config file (or
its last good copy, while the file is broken), or a change made at run time.

Pure: it compares the settings the config gives (SettingsOrigin, fixed at start)
with the run-time changes saved in the state file (the "pins" of
settings_store.py) and the settings now.  A run-time change outlives an edit of
the file, by design (settings_files.py); so status shows, value by value, where
it comes from and how to go back to the file's (ResetSetting on D-Bus,
`nvsharectl reset-setting`).  Settings are named as the config file names them:
a section ("scheduler", "gpu:ID", "share:GROUP") and a key ("time_quantum").
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .config_file import CONFIG_KEYS, GPU_CONFIG_KEYS, SHARE_CONFIG_KEYS
from .settings import (
    Settings,
    SettingsError,
    gpu_sort_key,
    parse_gpu_id,
    parse_share_group,
)
from .settings_store import GPUS_KEY, SHARES_KEY
from .text import excerpt

SCHEDULER = "scheduler"
GPU_PREFIX = "gpu:"
SHARE_PREFIX = "share:"


class Source(str, enum.Enum):
    DEFAULT = "default"
    FILE = "file"
    LAST_GOOD = "last good file"  # the file is broken: its last good copy's value
    RUN_TIME = "run time"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class SettingsOrigin:
    """The settings the config gives (defaults where it says nothing), which
    node-wide fields it sets itself, and whether that is the file or its last
    good copy; warnings about it (sections skipped) for status."""

    settings: Settings = field(default_factory=Settings)
    node_keys: frozenset[str] = frozenset()
    source: Source = Source.FILE
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class ValueSource:
    """One value that runs: where it comes from, and what the file (or the
    default) would give instead.  value None: a GPU's own value taken away at run
    time (the node's applies); file_value None: the file gives none."""

    section: str
    key: str
    value: Any
    source: Source
    file_value: Any

    def reset_command(self) -> str:
        """The nvsharectl command that goes back to the file's value; "" when it is."""
        if self.source is not Source.RUN_TIME:
            return ""
        where = ""
        if self.section.startswith(GPU_PREFIX):
            where = f" --gpu {self.section.removeprefix(GPU_PREFIX)}"
        elif self.section.startswith(SHARE_PREFIX):
            where = f" --share {self.section.removeprefix(SHARE_PREFIX)}"
        return f"nvsharectl reset-setting {self.key}{where}"


def _keys_of(section: str) -> dict[str, str]:
    if section.startswith(GPU_PREFIX):
        return GPU_CONFIG_KEYS
    if section.startswith(SHARE_PREFIX):
        return SHARE_CONFIG_KEYS
    return CONFIG_KEYS


def value_sources(
    origin: SettingsOrigin, overrides: dict[str, Any], now: Settings
) -> list[ValueSource]:
    """Every node-wide value; each value a GPU or a share group has of its own, or
    had in the file and lost at run time."""
    base = origin.settings
    file_source = origin.source
    rows = []
    for key, name in CONFIG_KEYS.items():
        if name in overrides:
            source = Source.RUN_TIME
        elif name in origin.node_keys:
            source = file_source
        else:
            source = Source.DEFAULT
        rows.append(ValueSource(SCHEDULER, key, getattr(now, name), source, getattr(base, name)))
    rows += _entries(
        GPU_PREFIX,
        GPU_CONFIG_KEYS,
        {gpu_id: own.given() for gpu_id, own in base.gpu_overrides},
        {gpu_id: own.given() for gpu_id, own in now.gpu_overrides},
        overrides.get(GPUS_KEY, {}),
        file_source,
        gpu_sort_key,
    )
    rows += _entries(
        SHARE_PREFIX,
        SHARE_CONFIG_KEYS,
        {group: share.given() for group, share in base.shares},
        {group: share.given() for group, share in now.shares},
        overrides.get(SHARES_KEY, {}),
        file_source,
        str,
    )
    return rows


def _entries(
    prefix: str,
    keys: dict[str, str],
    in_file: dict[str, dict[str, Any]],
    now: dict[str, dict[str, Any]],
    pins: dict[str, dict[str, Any]],
    file_source: Source,
    order: Callable[[str], Any],
) -> list[ValueSource]:
    rows = []
    for entry in sorted(in_file.keys() | now.keys() | pins.keys(), key=order):
        for key, name in keys.items():
            file_value = in_file.get(entry, {}).get(name)
            value = now.get(entry, {}).get(name)
            pinned = name in pins.get(entry, {})
            if value is None and (file_value is None or not pinned):
                continue
            source = Source.RUN_TIME if pinned else file_source
            rows.append(ValueSource(prefix + entry, key, value, source, file_value))
    return rows


def pin_address(
    section: str, key: str, uid_of: Callable[[str], int | None] | None = None
) -> tuple[str, str | None, str]:
    """Where a setting, named as the config file names it, is pinned in the state
    file: (kind: "scheduler", GPUS_KEY or SHARES_KEY; the GPU's or group's id,
    canonical; the field).  SettingsError, one sentence, for what names none."""
    section = section.strip() if isinstance(section, str) else section
    if not isinstance(section, str) or not (
        section == SCHEDULER or section.startswith((GPU_PREFIX, SHARE_PREFIX))
    ):
        raise SettingsError(
            f"a settings section is scheduler, gpu:ID or share:GROUP, got {excerpt(section)}"
        )
    keys = _keys_of(section)
    name = keys.get(key.strip().lower().replace("-", "_")) if isinstance(key, str) else None
    if name is None:
        raise SettingsError(f"[{section}] has no setting {excerpt(key)} (known: {', '.join(keys)})")
    if section.startswith(GPU_PREFIX):
        return GPUS_KEY, parse_gpu_id(section.removeprefix(GPU_PREFIX)), name
    if section.startswith(SHARE_PREFIX):
        return SHARES_KEY, parse_share_group(section.removeprefix(SHARE_PREFIX), uid_of), name
    return SCHEDULER, None, name


def shadowed_by_run_time(rows: Iterable[ValueSource]) -> list[str]:
    """A sentence for each value set at run time that differs from what the file
    gives: said at start, where an admin who edited the file may look."""
    return [
        f"[{row.section}] {row.key} = {_word(row.value)} was set at run time and wins over "
        f"the config's {_word(row.file_value)} ({row.reset_command()} goes back to it)"
        for row in rows
        if row.source is Source.RUN_TIME
        and row.file_value is not None
        and row.value != row.file_value
    ]


def run_time_values(rows: Iterable[ValueSource]) -> str:
    """The values set at run time, "key = value, ...": for the config problem's line."""
    return ", ".join(
        f"{'' if row.section == SCHEDULER else f'[{row.section}] '}{row.key} = {_word(row.value)}"
        for row in rows
        if row.source is Source.RUN_TIME
    )


def _word(value: Any) -> str:
    if value is None:
        return "(the node's)"
    return str(value.value if isinstance(value, enum.Enum) else value)
