"""Where the settings come from: the config file and the run-time changes' state file.

Precedence at start: built-in defaults < the config file (INI, section
[scheduler], [gpu:ID] for a GPU's own settings, [share:GROUP] for a share
group's) < changes made at run time through the control plane, which are
persisted as JSON under the state directory and so survive a restart.  Only the
settings that were changed at run time are persisted (per GPU and key for a
GPU's own, per group and key for a share), so an admin's later edit of the
config file still applies to everything else.

One concern, though past ~400 lines: the settings the agent starts with and
keeps across restarts.  The config file, its last good copy and the state file
are read together (settings_at_start, load_settings) and share the GPU and share
pins (with_gpu_pins, with_share_pins); the precedence above is visible only
where all three are.
"""

from __future__ import annotations

import configparser
import enum
import json
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .identity import uid_of
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
    ShareBy,
    ShareEntries,
    check_setting,
    gpu_sort_key,
    parse_anti_thrash,
    parse_gpu_id,
    parse_share_by,
    parse_share_group,
    parse_size,
    share_entries,
)
from .text import excerpt

DEFAULT_CONFIG_PATH = Path("/etc/nvshare/nvshare.conf")
DEFAULT_STATE_DIR = Path("/var/lib/nvshare")
STATE_FILE_NAME = "settings.json"
# A copy of the config file as it was when last read and found good: what the
# agent serves with when the file is broken (settings_at_start).
LAST_GOOD_CONFIG_NAME = "last-good.conf"
# Both files are a few lines; anything larger is the wrong file (--config /dev/zero).
MAX_FILE_BYTES = 64 * 1024

# ---------------------------------------------------------------- config file

_CONFIG_KEYS = {
    "time_quantum": "time_quantum_s",
    "anti_thrash": "anti_thrash",
    "idle_release_ms": "idle_release_ms",
    "drop_grace_ms": "drop_grace_ms",
    "light_wait_ms": "light_wait_ms",
    "min_slice_ms": "min_slice_ms",
    "memory_limit": "memory_limit_bytes",
    "share_by": "share_by",
}
_GPU_CONFIG_KEYS = {
    "time_quantum": "time_quantum_s",
    "anti_thrash": "anti_thrash",
    "memory_limit": "memory_limit_bytes",
    "light_wait_ms": "light_wait_ms",
}
GPU_SECTION_PREFIX = "gpu:"
# [share:user:alice], [share:unit:jupyter-bob.service], [share:pod:UID]
SHARE_SECTION_PREFIX = "share:"
_SHARE_CONFIG_KEYS = {"weight": "weight", "memory_cap": "memory_cap_bytes"}


def load_config(path: Path) -> Settings:
    """Read the INI config; a missing file means defaults.  Raises SettingsError,
    one line that names the file and, where there is one, the line at fault."""
    text = read_config_text(path)
    return Settings() if text is None else parse_config(text, path)


def read_config_text(path: Path) -> str | None:
    """The config file's text; None when there is none.  SettingsError when it
    cannot be read (a directory, a FIFO, too large, not UTF-8)."""
    try:
        return read_small_file(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise SettingsError(f"config {path}: cannot read it: {_one_line(e)}") from None


def parse_config(text: str, path: Path) -> Settings:
    """The settings that the config file's text gives; SettingsError names the
    line where the text says which (every message begins "config PATH")."""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text, source=str(path))
    except configparser.MissingSectionHeaderError as e:
        raise SettingsError(
            f"config {path} line {e.lineno}: a key before any section (begin with [scheduler])"
        ) from None
    except configparser.ParsingError as e:
        line = e.errors[0][0] if e.errors else "?"
        raise SettingsError(f"config {path} line {line}: not 'key = value'") from None
    except configparser.DuplicateOptionError as e:
        raise SettingsError(
            f"config {path} line {e.lineno}: {e.option} is set twice in [{e.section}]"
        ) from None
    except configparser.DuplicateSectionError as e:
        raise SettingsError(f"config {path} line {e.lineno}: [{e.section}] appears twice") from None
    except configparser.Error as e:
        raise SettingsError(f"config {path}: {_one_line(e.message)}") from None
    lines = _ConfigLines(text)

    def where(section: str, key: str | None = None) -> str:
        line = lines.of(section, key)
        return f"config {path} line {line}" if line else f"config {path}"

    # configparser keeps [DEFAULT] out of sections() and silently merges it into
    # [scheduler]: an admin who wrote only [DEFAULT] would get none of it.
    unknown_sections = [
        s
        for s in parser.sections()
        if s != "scheduler" and not s.startswith((GPU_SECTION_PREFIX, SHARE_SECTION_PREFIX))
    ]
    if parser.defaults():
        unknown_sections.insert(0, parser.default_section)
    if unknown_sections:
        raise SettingsError(
            f"{where(unknown_sections[0])}: unknown section [{unknown_sections[0]}] "
            "(only [scheduler], [gpu:ID] and [share:GROUP])"
        )
    changes = {}
    if parser.has_section("scheduler"):
        for key, text_value in parser.items("scheduler"):
            field = _CONFIG_KEYS.get(key)
            if field is None:
                raise SettingsError(
                    f"{where('scheduler', key)}: unknown key {key!r} in [scheduler]"
                    f" (known: {', '.join(_CONFIG_KEYS)})"
                )
            changes[field] = _parse_value(where("scheduler", key), key, field, text_value.strip())
    gpus = []
    named: dict[str, str] = {}  # canonical GPU id -> the section that names it
    for section in parser.sections():
        if not section.startswith(GPU_SECTION_PREFIX):
            continue
        gpu_id, own = _gpu_section(parser, section, where)
        canonical = parse_gpu_id(gpu_id)
        if canonical in named:
            raise SettingsError(
                f"{where(section)}: [{section}] and [{named[canonical]}] name the same GPU"
            )
        named[canonical] = section
        gpus.append((gpu_id, own))
    shares = []
    for section in parser.sections():
        if section.startswith(SHARE_SECTION_PREFIX):
            shares.append(_share_section(parser, section, where))
    try:
        return (
            Settings()
            .replaced(**changes)
            .with_gpu_overrides(gpus)
            .replaced(shares=share_entries(shares))
        )
    except SettingsError as e:  # what no single line says: too many GPUs, say
        raise SettingsError(f"config {path}: {e}") from None


def _gpu_section(
    parser: configparser.ConfigParser, section: str, where: Callable[..., str]
) -> tuple[str, GpuOverrides]:
    """[gpu:ID]: the GPU's id as written, and what it sets."""
    try:
        parse_gpu_id(section.removeprefix(GPU_SECTION_PREFIX))
    except SettingsError as e:
        raise SettingsError(f"{where(section)}: [{section}]: {e}") from None
    own: dict[str, Any] = {}
    for key, text in parser.items(section):
        field = _GPU_CONFIG_KEYS.get(key)
        if field is None:
            raise SettingsError(
                f"{where(section, key)}: unknown key {key!r} in [{section}]"
                f" (known: {', '.join(_GPU_CONFIG_KEYS)})"
            )
        own[field] = _parse_value(where(section, key), f"[{section}] {key}", field, text.strip())
    return section.removeprefix(GPU_SECTION_PREFIX), GpuOverrides(**own)


def _share_section(
    parser: configparser.ConfigParser, section: str, where: Callable[..., str]
) -> tuple[str, Share]:
    """[share:GROUP]: the group, canonical, and its weight and memory cap."""
    try:
        group = parse_share_group(section.removeprefix(SHARE_SECTION_PREFIX), uid_of)
    except SettingsError as e:
        raise SettingsError(f"{where(section)}: [{section}]: {e}") from None
    own: dict[str, Any] = {}
    for key, text in parser.items(section):
        field = _SHARE_CONFIG_KEYS.get(key)
        if field is None:
            raise SettingsError(
                f"{where(section, key)}: unknown key {key!r} in [{section}]"
                f" (known: {', '.join(_SHARE_CONFIG_KEYS)})"
            )
        own[field] = _parse_value(where(section, key), f"[{section}] {key}", field, text.strip())
    return group, Share(**own)


def _parse_value(where: str, key: str, field: str, text: str) -> int | AntiThrash | ShareBy:
    """One value, parsed and range-checked here, where its line is known."""
    value: int | AntiThrash | ShareBy
    try:
        if field == "anti_thrash":
            value = parse_anti_thrash(text)
        elif field == "share_by":
            value = parse_share_by(text)
        elif field in ("memory_limit_bytes", "memory_cap_bytes"):
            value = parse_size(text)
        else:
            try:
                value = int(text)
            except ValueError:
                raise SettingsError(f"{key} must be a whole number, got {text!r}") from None
        check_setting(field, value)
    except SettingsError as e:
        message = str(e)
        raise SettingsError(
            f"{where}: {message}" if message.startswith(key) else f"{where}: {key}: {message}"
        ) from None
    return value


class _ConfigLines:
    """Where each section and key of a config file's text is, by line number:
    configparser does not keep it, and an admin wants to be told which line."""

    _SECTION = re.compile(r"\[(?P<name>.+)\]")
    _KEY = re.compile(r"(?P<key>[^=:]+?)\s*[=:]")

    def __init__(self, text: str):
        self._lines: dict[tuple[str, str | None], int] = {}
        section = None
        for number, line in enumerate(text.splitlines(), 1):
            stripped = line.strip()
            if not stripped or stripped[0] in "#;" or line[0].isspace():
                continue  # blank, a comment, or a value's continuation
            match = self._SECTION.match(stripped)
            if match:
                section = match.group("name")
                self._lines.setdefault((section, None), number)
                continue
            match = self._KEY.match(stripped)
            if match and section is not None:
                self._lines.setdefault((section, match.group("key").lower()), number)

    def of(self, section: str, key: str | None = None) -> int | None:
        return self._lines.get((section, key)) or self._lines.get((section, None))


def _one_line(e: object) -> str:
    return " ".join(str(e).split())


_FILE_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def read_small_file(path: Path) -> str:
    """The text of a regular file of at most MAX_FILE_BYTES, UTF-8 with or without a
    byte-order mark (Windows editors add one).  FileNotFoundError when it is missing;
    any other OSError, or ValueError (UnicodeDecodeError among them), with one line.

    Opened non-blocking and checked before a byte is read: a FIFO would hang the agent
    before it listens, and a device such as /dev/zero would grow it without bound."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        kind = stat.S_IFMT(os.fstat(fd).st_mode)
        if kind != stat.S_IFREG:
            raise ValueError(f"not a regular file but {_FILE_KINDS.get(kind, 'a special file')}")
        data = b""
        while len(data) <= MAX_FILE_BYTES:
            chunk = os.read(fd, MAX_FILE_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"larger than {MAX_FILE_BYTES // 1024} KiB, so not a settings file")
    return data.decode("utf-8").removeprefix("\ufeff")


# ---------------------------------------------------------------- run-time changes


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
            broken.append(_one_line(e)[:200])
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

    PERSISTED_FIELDS = ("time_quantum_s", "anti_thrash", "memory_limit_bytes", "share_by")

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
            return {}, f"ignoring saved settings {self.path}: {_one_line(e)}"
        if not isinstance(data, dict):
            return {}, f"ignoring saved settings {self.path}: not a JSON object"
        overrides = {k: data[k] for k in self.PERSISTED_FIELDS if k in data}
        saved = overrides.get("anti_thrash")
        if isinstance(saved, bool):  # saved before anti-thrash had a third value
            overrides["anti_thrash"] = AntiThrash.ON if saved else AntiThrash.OFF
        elif isinstance(saved, str):
            overrides["anti_thrash"] = ANTI_THRASH_WORDS.get(saved, saved)
        if isinstance(overrides.get("share_by"), str):
            try:
                overrides["share_by"] = parse_share_by(overrides["share_by"])
            except SettingsError as e:
                return {}, f"ignoring saved settings {self.path}: {_one_line(e)[:200]}"
        try:
            Settings().replaced(**overrides)
        except (SettingsError, RecursionError) as e:
            # The message quotes the value, which may be a 60 kB list: keep it a line.
            return {}, f"ignoring saved settings {self.path}: {_one_line(e)[:200]}"
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
                broken.append(_one_line(e)[:200])
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

    def last_good_config(self) -> tuple[Settings, str]:
        """The settings of the last good config, and words for where they come from."""
        path = self.last_good_config_path
        try:
            text = _text_or_none(path)
            if text is not None:
                return parse_config(text, path), f"the last good config (a copy in {path})"
        except (OSError, ValueError) as e:  # SettingsError is a ValueError
            return Settings(), f"the built-in defaults (the last good copy is unusable: {e})"
        return Settings(), "the built-in defaults (no config was good before)"


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


def load_settings(
    config_path: Path, store: SettingsStore
) -> tuple[Settings, dict[str, Any], str | None]:
    """Defaults < config < persisted overrides. Returns (settings, overrides, warning).
    Raises SettingsError for a config file that cannot be used."""
    return _with_saved_changes(load_config(config_path), store)


def _with_saved_changes(
    base: Settings, store: SettingsStore
) -> tuple[Settings, dict[str, Any], str | None]:
    overrides, warning = store.load_overrides()
    node_wide = {k: v for k, v in overrides.items() if k not in (GPUS_KEY, SHARES_KEY)}
    settings = base.replaced(**node_wide)
    share_pins = overrides.get(SHARES_KEY)
    if share_pins:
        try:
            settings = settings.replaced(shares=with_share_pins(base.shares, share_pins))
        except SettingsError as e:  # each fits, together too many groups
            overrides = {k: v for k, v in overrides.items() if k != SHARES_KEY}
            problem = f"ignoring saved shares in {store.path}: {_one_line(e)[:200]}"
            warning = f"{warning}; {problem}" if warning else problem
    pins = overrides.get(GPUS_KEY)
    if pins:
        try:
            settings = settings.with_gpu_overrides(with_gpu_pins(base.gpu_overrides, pins))
        except SettingsError as e:  # each fits, together too many GPUs have settings
            overrides = {k: v for k, v in overrides.items() if k != GPUS_KEY}
            problem = f"ignoring saved GPU settings in {store.path}: {_one_line(e)[:200]}"
            warning = f"{warning}; {problem}" if warning else problem
    return settings, overrides, warning


# ---------------------------------------------------------------- at start


@dataclass(frozen=True)
class StartSettings:
    """What the agent starts with.  A config file it cannot use does not stop it:
    a node whose agent does not run is a node whose processes run unscheduled,
    and systemd would restart it until its start limit takes the socket down
    (issue 36).  It serves with the last good config instead and says so."""

    settings: Settings
    overrides: dict[str, Any]
    warnings: tuple[str, ...] = ()  # saved settings ignored, the last good copy not kept
    # "" when the config file was used; else what is wrong with it (which line),
    # and what the agent serves with instead: one line for the journal, STATUS=,
    # D-Bus (ConfigProblem), nvsharectl status and the metrics.
    config_problem: str = ""


def settings_at_start(config_path: Path, store: SettingsStore) -> StartSettings:
    """Defaults < config < persisted overrides, where the config is the file or,
    when the file cannot be used, the last good one (a copy kept in the state
    directory each time the file was good), else the defaults."""
    warnings = []
    problem = ""
    try:
        text = read_config_text(config_path)
        base = Settings() if text is None else parse_config(text, config_path)
    except SettingsError as e:
        base, instead = store.last_good_config()
        problem = (
            f"{_one_line(e)}; serving with {instead}: fix the file, then restart the agent "
            "(systemctl restart nvshare)"
        )
    else:
        kept = store.keep_good_config(text)
        if kept:
            warnings.append(kept)
    settings, overrides, warning = _with_saved_changes(base, store)
    if warning:
        warnings.append(warning)
    return StartSettings(settings, overrides, tuple(warnings), problem)
