"""The run-time changes' state file: <state dir>/settings.json, and the last good
copy of the config file beside it.

Only the settings changed at run time are saved (per GPU and key for a GPU's
own, per group and key for a share: "pins"), so that an admin's later edit of
the config file still applies to everything else.  A change is saved before it
applies (settings_changes.py); a broken file is a warning, never a failure.
"""

from __future__ import annotations

import enum
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .config_file import ConfigFile, one_line, parse_config_file, read_small_file
from .settings import (
    ANTI_THRASH_WORDS,
    GPU_SETTING_FIELDS,
    SHARE_FIELDS,
    AntiThrash,
    GpuOverrideEntries,
    GpuOverrides,
    Settings,
    SettingsError,
    Share,
    ShareEntries,
    check_setting,
    gpu_sort_key,
    parse_fair_page,
    parse_gpu_id,
    parse_share_by,
    parse_share_group,
    share_entries,
)
from .text import excerpt

DEFAULT_STATE_DIR = Path("/var/lib/nvshare")
STATE_FILE_NAME = "settings.json"
# A copy of the config file as it was when last read and found good: what the
# agent serves with when the file is broken (settings_files.settings_at_start).
LAST_GOOD_CONFIG_NAME = "last-good.conf"

# Per GPU, what was changed at run time: GPU id -> field -> value, or None where
# the GPU's own value was taken away (the node-wide value applies, whatever the
# config file sets for it).  Saved under GPUS_KEY beside the node-wide fields.
GpuPins = dict[str, dict[str, Any]]
GPUS_KEY = "gpus"
# Per share group, likewise: group -> field -> value, or None where reset.
SharePins = dict[str, dict[str, Any]]
SHARES_KEY = "shares"


def _share_pins(path: Path, saved: object) -> tuple[SharePins, str | None]:
    """The saved share changes, checked; a broken entry leaves out that group's."""
    if saved is None:
        return {}, None
    if not isinstance(saved, dict):
        return {}, f"ignoring saved shares in {path}: not a JSON object"
    pins: SharePins = {}
    broken: list[str] = []
    for group, fields in saved.items():
        try:
            if parse_share_group(group) != group or not isinstance(fields, dict):
                raise SettingsError(f"share {excerpt(group)}: not a saved share")
            for name, value in fields.items():
                if name not in SHARE_FIELDS:
                    raise SettingsError(f"share {group}: unknown setting {excerpt(name)}")
                if value is not None:
                    check_setting(name, value)
            pins[group] = dict(fields)
        except SettingsError as e:
            broken.append(one_line(e)[:200])
    if not broken:
        return pins, None
    return pins, f"ignoring saved shares in {path}: {broken[0]}; the config's values apply"


def with_share_pins(entries: ShareEntries, pins: SharePins) -> ShareEntries:
    """The config's shares with the run-time changes over them, key by key."""
    merged = {group: share.given() for group, share in entries}
    for group, changed in pins.items():
        values = merged.setdefault(group, {})
        for name, value in changed.items():
            if value is None:
                values.pop(name, None)
            else:
                values[name] = value
    return share_entries((group, Share(**values)) for group, values in merged.items())


class SettingsStore:
    """The run-time overrides, one JSON object in <state_dir>/settings.json:
    node-wide fields, and under "gpus" each GPU's changed fields (GpuPins)."""

    PERSISTED_FIELDS = (
        "time_quantum_s",
        "anti_thrash",
        "memory_limit_bytes",
        "share_by",
        "fair_page",
    )

    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / STATE_FILE_NAME
        self.last_good_config_path = Path(state_dir) / LAST_GOOD_CONFIG_NAME

    def load_overrides(self) -> tuple[dict[str, Any], str | None]:
        """Returns (overrides, warning). A broken file is a warning, not a failure:
        the daemon must come up, and the config file still gives sane values.
        A broken GPU entry leaves out that GPU's saved settings only."""
        try:
            data = json.loads(read_small_file(self.path))
        except FileNotFoundError:
            return {}, None
        except RecursionError:  # [[[...]]] nested past the parser's depth
            return {}, f"ignoring saved settings {self.path}: nested too deeply"
        except Exception as e:  # OSError, ValueError, or anything else json may raise
            return {}, f"ignoring saved settings {self.path}: {one_line(e)}"
        if not isinstance(data, dict):
            return {}, f"ignoring saved settings {self.path}: not a JSON object"
        overrides = {k: data[k] for k in self.PERSISTED_FIELDS if k in data}
        saved = overrides.get("anti_thrash")
        if isinstance(saved, bool):  # saved before anti-thrash had a third value
            overrides["anti_thrash"] = AntiThrash.ON if saved else AntiThrash.OFF
        elif isinstance(saved, str):
            overrides["anti_thrash"] = ANTI_THRASH_WORDS.get(saved, saved)
        try:
            if isinstance(overrides.get("share_by"), str):
                overrides["share_by"] = parse_share_by(overrides["share_by"])
            if isinstance(overrides.get("fair_page"), str):
                overrides["fair_page"] = parse_fair_page(overrides["fair_page"])
        except SettingsError as e:
            return {}, f"ignoring saved settings {self.path}: {one_line(e)[:200]}"
        try:
            Settings().replaced(**overrides)
        except (SettingsError, RecursionError) as e:
            # The message quotes the value, which may be a 60 kB list: keep it a line.
            return {}, f"ignoring saved settings {self.path}: {one_line(e)[:200]}"
        pins, warning = self._gpu_pins(data.get(GPUS_KEY))
        if pins:
            overrides[GPUS_KEY] = pins
        share_pins, share_warning = _share_pins(self.path, data.get(SHARES_KEY))
        if share_pins:
            overrides[SHARES_KEY] = share_pins
        if share_warning:
            warning = f"{warning}; {share_warning}" if warning else share_warning
        return overrides, warning

    def _gpu_pins(self, saved: object) -> tuple[GpuPins, str | None]:
        if saved is None:
            return {}, None
        if not isinstance(saved, dict):
            return {}, f"ignoring saved GPU settings in {self.path}: not a JSON object"
        pins: GpuPins = {}
        broken: list[str] = []
        for text, fields in saved.items():
            try:
                gpu_id, entry = _gpu_pin(text, fields)
                if gpu_id in pins:
                    raise SettingsError(f"GPU {gpu_id} is saved twice")
                pins[gpu_id] = entry
            except (SettingsError, RecursionError) as e:
                broken.append(one_line(e)[:200])
        if not broken:
            return pins, None
        more = f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""
        return pins, (
            f"ignoring saved settings of a GPU in {self.path}: {broken[0]}{more}; "
            "the config's values apply"
        )

    def save_overrides(self, overrides: dict[str, Any]) -> None:
        """Write atomically (temp file, fsync, rename, fsync dir): a crash leaves old or new."""
        _write_atomically(self.path, json.dumps(_plain(overrides), sort_keys=True) + "\n")

    # ------------------------------------------------------------ the last good config

    def keep_good_config(self, text: str | None) -> str | None:
        """Keep the config file's text, just found good, as the last good one (no file:
        the defaults were good, and no copy is kept).  Returns a warning when it cannot."""
        path = self.last_good_config_path
        try:
            if text is None:
                path.unlink(missing_ok=True)
            elif _text_or_none(path) != text:
                _write_atomically(path, text)
        except OSError as e:
            return f"cannot keep the config as the last good one in {path}: {e.strerror or e}"
        return None

    def last_good_config(self) -> tuple[ConfigFile | None, str]:
        """The last good config (None: there is none, the defaults apply), and words
        for where the settings come from."""
        path = self.last_good_config_path
        try:
            text = _text_or_none(path)
            if text is not None:
                return parse_config_file(text, path), f"the last good config (a copy in {path})"
        except (OSError, ValueError) as e:  # SettingsError is a ValueError
            return None, f"the built-in defaults (the last good copy is unusable: {e})"
        return None, "the built-in defaults (no config was good before)"


def _text_or_none(path: Path) -> str | None:
    try:
        return read_small_file(path)
    except FileNotFoundError:
        return None


def _write_atomically(path: Path, text: str) -> None:
    """temp file, fsync, rename, fsync dir: a crash leaves the old file or the new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _plain(value: Any) -> Any:
    """JSON's types: enums as their text, dicts all the way down."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value.value if isinstance(value, enum.Enum) else value


def _gpu_pin(text: object, fields: object) -> tuple[str, dict[str, Any]]:
    """One GPU's saved entry, checked: (its id, field -> value or None)."""
    gpu_id = parse_gpu_id(text)  # type: ignore[arg-type]  # it says so when not a str
    if not isinstance(fields, dict):
        raise SettingsError(f"GPU {gpu_id}: not a JSON object")
    entry: dict[str, Any] = {}
    for name, value in fields.items():
        if name not in GPU_SETTING_FIELDS:
            raise SettingsError(f"GPU {gpu_id}: unknown setting {excerpt(name)}")
        if name == "anti_thrash" and isinstance(value, str):
            value = ANTI_THRASH_WORDS.get(value, value)
        if value is not None:
            try:
                check_setting(name, value)
            except SettingsError as e:
                raise SettingsError(f"GPU {gpu_id}: {e}") from None
        entry[name] = value
    return gpu_id, entry


def with_gpu_pins(entries: GpuOverrideEntries, pins: GpuPins) -> list[tuple[str, GpuOverrides]]:
    """The config's per-GPU settings with the run-time changes over them, key by key."""
    merged = {gpu_id: own.given() for gpu_id, own in entries}
    for gpu_id, changed in pins.items():
        values = merged.setdefault(gpu_id, {})
        for name, value in changed.items():
            if value is None:
                values.pop(name, None)
            else:
                values[name] = value
    return [(gpu_id, GpuOverrides(**values)) for gpu_id, values in merged.items()]


def overrides_after(
    overrides: dict[str, Any], before: Settings, after: Settings, changed: Iterable[str]
) -> dict[str, Any]:
    """What to save once a run-time change of the fields `changed` took the settings
    from before to after.  A node-wide field is saved even when its value stays (the
    admin chose it explicitly).  A write of the GPUs' settings replaces them all, so
    only what it changes is saved, per GPU and field: the rest keeps following the
    config file."""
    saved = dict(overrides)
    for name in changed:
        if name not in ("gpu_overrides", "shares"):
            saved[name] = getattr(after, name)
    if "shares" in changed:
        was_shares = {group: share.given() for group, share in before.shares}
        now_shares = {group: share.given() for group, share in after.shares}
        share_pins: SharePins = {g: dict(f) for g, f in saved.get(SHARES_KEY, {}).items()}
        for group in sorted(was_shares.keys() | now_shares.keys()):
            was, now = was_shares.get(group, {}), now_shares.get(group, {})
            for name in SHARE_FIELDS:
                if was.get(name) != now.get(name):
                    share_pins.setdefault(group, {})[name] = now.get(name)
        saved[SHARES_KEY] = share_pins
    if "gpu_overrides" in changed:
        old = {gpu_id: own.given() for gpu_id, own in before.gpu_overrides}
        new = {gpu_id: own.given() for gpu_id, own in after.gpu_overrides}
        pins: GpuPins = {gpu_id: dict(fields) for gpu_id, fields in saved.get(GPUS_KEY, {}).items()}
        for gpu_id in sorted(old.keys() | new.keys(), key=gpu_sort_key):
            was, now = old.get(gpu_id, {}), new.get(gpu_id, {})
            for name in GPU_SETTING_FIELDS:
                if was.get(name) != now.get(name):
                    pins.setdefault(gpu_id, {})[name] = now.get(name)
        saved[GPUS_KEY] = pins
    return saved


def without_pin(
    overrides: dict[str, Any], kind: str, entry: str | None, name: str
) -> dict[str, Any]:
    """The run-time changes less one: a node-wide field (kind "scheduler"), or a GPU's
    or a share group's field (kind GPUS_KEY or SHARES_KEY, entry its id).  Settings
    merged from the config and what is left (settings_files.settings_over) have the
    config's value there again."""
    if entry is None:
        return {k: v for k, v in overrides.items() if k != name}
    pins = {e: dict(fields) for e, fields in overrides.get(kind, {}).items()}
    pins.get(entry, {}).pop(name, None)
    return {**overrides, kind: {e: fields for e, fields in pins.items() if fields}}
