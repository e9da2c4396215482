"""Scheduler settings: the value type, the config file, and run-time persistence.

Precedence at start: built-in defaults < the config file (INI, section
[scheduler]) < changes made at run time through the control plane, which are
persisted as JSON under the state directory and so survive a restart.  Only
the settings that were changed at run time are persisted, so an admin's later
edit of the config file still applies to everything else.
"""

from __future__ import annotations

import configparser
import dataclasses
import enum
import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_CONFIG_PATH = Path("/etc/nvshare/nvshare.conf")
DEFAULT_STATE_DIR = Path("/var/lib/nvshare")
STATE_FILE_NAME = "settings.json"

TIME_QUANTUM_RANGE_S = (1, 86400)
# u32 milliseconds on the wire; a day is plenty and keeps the numbers sane.
MILLIS_RANGE = (0, 86_400_000)
# Both files are a few lines; anything larger is the wrong file (--config /dev/zero).
MAX_FILE_BYTES = 64 * 1024
# A minimum slice longer than a second would make light work wait noticeably.
MIN_SLICE_RANGE_MS = (0, 10_000)
# Bytes fit in u64 (D-Bus 't'); a limit of a few MiB would only ever mean "never fits".
MEMORY_LIMIT_RANGE = (0, 2**64 - 1)
_SIZE_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class AntiThrash(str, enum.Enum):
    """on: one holder per GPU, first come first served, turns of at most the time quantum.
    off: every process runs at once.  auto: per GPU, light work runs beside the holder
    while the clients' memory fits the GPU, busy clients take usage-fair turns, and the
    GPU goes to exclusive turns when memory does not fit (docs/scheduling.md)."""

    ON = "on"
    OFF = "off"
    AUTO = "auto"

    def __str__(self) -> str:
        return self.value


class SettingsError(ValueError):
    """A setting out of range or a config file we cannot read; str() is one human sentence."""


class SettingsNotSaved(Exception):
    """A run-time change refused because the state file could not be written
    (disk full, read-only, I/O error); str() is one human sentence."""


@dataclass(frozen=True, slots=True)
class Settings:
    time_quantum_s: int = 30
    anti_thrash: AntiThrash = AntiThrash.AUTO
    idle_release_ms: int = 1000
    drop_grace_ms: int = 5000
    # auto: how long a busy holder keeps the GPU before light work may take it over.
    min_slice_ms: int = 100
    # auto: the most memory a GPU is taken to have (0: its own size).
    memory_limit_bytes: int = 0

    def validated(self) -> Settings:
        lo, hi = TIME_QUANTUM_RANGE_S
        if type(self.time_quantum_s) is not int or not lo <= self.time_quantum_s <= hi:
            raise SettingsError(
                f"time quantum must be {lo}..{hi} seconds, got {self.time_quantum_s!r}"
            )
        if not isinstance(self.anti_thrash, AntiThrash):
            raise SettingsError(f"anti-thrash must be on, off or auto, got {self.anti_thrash!r}")
        for name, (lo, hi) in (
            ("idle_release_ms", MILLIS_RANGE),
            ("drop_grace_ms", MILLIS_RANGE),
            ("min_slice_ms", MIN_SLICE_RANGE_MS),
        ):
            value = getattr(self, name)
            if type(value) is not int or not lo <= value <= hi:
                raise SettingsError(f"{name} must be {lo}..{hi} milliseconds, got {value!r}")
        lo, hi = MEMORY_LIMIT_RANGE
        value = self.memory_limit_bytes
        if type(value) is not int or not lo <= value <= hi:
            raise SettingsError(f"memory_limit must be {lo}..{hi} bytes, got {value!r}")
        return self

    def replaced(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes).validated()


# ---------------------------------------------------------------- config file

_CONFIG_KEYS = {
    "time_quantum": "time_quantum_s",
    "anti_thrash": "anti_thrash",
    "idle_release_ms": "idle_release_ms",
    "drop_grace_ms": "drop_grace_ms",
    "min_slice_ms": "min_slice_ms",
    "memory_limit": "memory_limit_bytes",
}
# The words an admin may write for each anti-thrash mode (the original's on/off,
# and the booleans configparser users expect).
_ANTI_THRASH_WORDS = {
    **dict.fromkeys(("on", "true", "yes", "1"), AntiThrash.ON),
    **dict.fromkeys(("off", "false", "no", "0"), AntiThrash.OFF),
    "auto": AntiThrash.AUTO,
}


def parse_anti_thrash(text: str) -> AntiThrash:
    """on/off/auto (and true/false/yes/no/1/0); raises SettingsError."""
    mode = _ANTI_THRASH_WORDS.get(text.strip().lower())
    if mode is None:
        raise SettingsError(f"anti-thrash must be on, off or auto, got {text!r}")
    return mode


_SIZE = re.compile(r"(\d+)\s*([KMGT]?)(?:I?B)?", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes, with an optional K, M, G or T suffix (powers of 1024; "GiB" and "GB"
    read the same); "none" or "0" means no limit.  Raises SettingsError."""
    if text.strip().lower() == "none":
        return 0
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise SettingsError(
            f"a size is a whole number of bytes with an optional K, M, G or T suffix, got {text!r}"
        )
    return int(match.group(1)) * _SIZE_SUFFIXES[match.group(2).upper()]


def load_config(path: Path) -> Settings:
    """Read the INI config; a missing file means defaults. Raises SettingsError."""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(read_small_file(path), source=str(path))
    except FileNotFoundError:
        return Settings()
    except configparser.MissingSectionHeaderError as e:
        raise SettingsError(
            f"config {path}: line {e.lineno} comes before any [scheduler] header"
        ) from None
    except configparser.ParsingError as e:
        line = e.errors[0][0] if e.errors else "?"
        raise SettingsError(f"config {path}: line {line} is not 'key = value'") from None
    except configparser.Error as e:
        raise SettingsError(f"config {path}: {_one_line(e.message)}") from None
    except (OSError, ValueError) as e:
        raise SettingsError(f"config {path}: cannot read it: {_one_line(e)}") from None
    # configparser keeps [DEFAULT] out of sections() and silently merges it into
    # [scheduler]: an admin who wrote only [DEFAULT] would get none of it.
    unknown_sections = [s for s in parser.sections() if s != "scheduler"]
    if parser.defaults():
        unknown_sections.insert(0, parser.default_section)
    if unknown_sections:
        raise SettingsError(
            f"config {path}: unknown section [{unknown_sections[0]}] (only [scheduler])"
        )
    changes = {}
    if parser.has_section("scheduler"):
        for key, text in parser.items("scheduler"):
            field = _CONFIG_KEYS.get(key)
            if field is None:
                raise SettingsError(
                    f"config {path}: unknown key {key!r} in [scheduler]"
                    f" (known: {', '.join(_CONFIG_KEYS)})"
                )
            changes[field] = _parse_value(path, key, field, text.strip())
    try:
        return Settings().replaced(**changes)
    except SettingsError as e:
        raise SettingsError(f"config {path}: {e}") from None


def _parse_value(path: Path, key: str, field: str, text: str) -> int | AntiThrash:
    try:
        if field == "anti_thrash":
            return parse_anti_thrash(text)
        if field == "memory_limit_bytes":
            return parse_size(text)
    except SettingsError as e:
        raise SettingsError(f"config {path}: {key}: {e}") from None
    try:
        return int(text)
    except ValueError:
        raise SettingsError(f"config {path}: {key} must be a whole number, got {text!r}") from None


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


class SettingsStore:
    """The run-time overrides, one JSON object in <state_dir>/settings.json."""

    PERSISTED_FIELDS = ("time_quantum_s", "anti_thrash")

    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / STATE_FILE_NAME

    def load_overrides(self) -> tuple[dict[str, Any], str | None]:
        """Returns (overrides, warning). A broken file is a warning, not a failure:
        the daemon must come up, and the config file still gives sane values."""
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
            overrides["anti_thrash"] = _ANTI_THRASH_WORDS.get(saved, saved)
        try:
            Settings().replaced(**overrides)
        except (SettingsError, RecursionError) as e:
            # The message quotes the value, which may be a 60 kB list: keep it a line.
            return {}, f"ignoring saved settings {self.path}: {_one_line(e)[:200]}"
        return overrides, None

    def save_overrides(self, overrides: dict[str, Any]) -> None:
        """Write atomically (temp file, fsync, rename, fsync dir): a crash leaves old or new."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".settings.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                plain = {
                    k: v.value if isinstance(v, enum.Enum) else v for k, v in overrides.items()
                }
                json.dump(plain, f, sort_keys=True)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def load_settings(
    config_path: Path, store: SettingsStore
) -> tuple[Settings, dict[str, Any], str | None]:
    """Defaults < config < persisted overrides. Returns (settings, overrides, warning)."""
    base = load_config(config_path)
    overrides, warning = store.load_overrides()
    return base.replaced(**overrides), overrides, warning
