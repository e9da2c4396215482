"""Scheduler settings: the value type, the config file, and run-time persistence.

Precedence at start: built-in defaults < the config file (INI, section
[scheduler]) < changes made at run time through the control plane, which are
persisted as JSON under the state directory and so survive a restart.  Only
the settings that were changed at run time are persisted, so an admin's later
edit of the config file still applies to everything else.

A GPU may have a time quantum, anti-thrash mode and memory limit of its own
(config sections [gpu:ID], D-Bus GpuSettings), named by its UUID or by its
index as NVML numbers the node's GPUs; what it does not set is the node-wide
value.  An entry by UUID wins over one by index, key by key.  Run-time changes
win over the config file per GPU and per key, as the node-wide ones do.
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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .text import excerpt

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
# A node has a handful of GPUs; the bounds only keep a D-Bus write or a state file
# from making the agent hold (and every status read list) thousands of entries.
MAX_GPU_INDEX = 1023
MAX_GPUS_WITH_SETTINGS = 256
# What a GPU may set for itself; idle release, drop grace and the minimum slice
# stay node-wide (the shim applies the first two, per process, not per GPU).
GPU_SETTING_FIELDS = ("time_quantum_s", "anti_thrash", "memory_limit_bytes")


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
class GpuOverrides:
    """What one GPU sets for itself; None: the node-wide value.  A memory limit
    of 0 is a value (no limit on this GPU), not "unset"."""

    time_quantum_s: int | None = None
    anti_thrash: AntiThrash | None = None
    memory_limit_bytes: int | None = None

    def given(self) -> dict[str, Any]:
        """The settings it sets, by field name."""
        return {
            name: value for name in GPU_SETTING_FIELDS if (value := getattr(self, name)) is not None
        }

    def over(self, below: GpuOverrides | None) -> GpuOverrides:
        """These settings, and below's where these leave one unset."""
        if below is None:
            return self
        return GpuOverrides(**{**below.given(), **self.given()})


NO_OVERRIDES = GpuOverrides()

# (GPU id, its own settings): the id as parse_gpu_id writes it, entries in gpu_sort_key order.
GpuOverrideEntries = tuple[tuple[str, GpuOverrides], ...]


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
    # GPUs with settings of their own (with_gpu_overrides builds it).  A tuple, so
    # that the value stays hashable and compares by value.
    gpu_overrides: GpuOverrideEntries = ()

    def validated(self) -> Settings:
        for name in _NODE_FIELDS:
            _check_value(name, getattr(self, name))
        _check_gpu_overrides(self.gpu_overrides)
        return self

    def replaced(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes).validated()

    def with_gpu_overrides(self, entries: Iterable[tuple[str, GpuOverrides]]) -> Settings:
        """These settings with the GPUs' own replaced (ids made canonical, empty
        entries left out), validated."""
        return self.replaced(gpu_overrides=gpu_override_entries(entries))

    def gpu_overrides_by_key(self) -> dict[bytes | int, GpuOverrides]:
        """Each GPU's own settings by gpu_key(): raw UUID bytes, or NVML index."""
        return {gpu_key(gpu_id): own for gpu_id, own in self.gpu_overrides}

    def for_gpu(self, own: GpuOverrides) -> Settings:
        """What a GPU with these settings of its own runs by (no per-GPU entries left)."""
        return dataclasses.replace(self, gpu_overrides=(), **own.given())


DEFAULT_SETTINGS = Settings()

_NODE_FIELDS = (
    "time_quantum_s",
    "anti_thrash",
    "idle_release_ms",
    "drop_grace_ms",
    "min_slice_ms",
    "memory_limit_bytes",
)
_MILLIS_FIELDS = {
    "idle_release_ms": MILLIS_RANGE,
    "drop_grace_ms": MILLIS_RANGE,
    "min_slice_ms": MIN_SLICE_RANGE_MS,
}


def _check_value(name: str, value: object) -> None:
    """One setting's value; SettingsError with the sentence for it."""
    if name == "time_quantum_s":
        lo, hi = TIME_QUANTUM_RANGE_S
        if type(value) is not int or not lo <= value <= hi:
            raise SettingsError(f"time quantum must be {lo}..{hi} seconds, got {value!r}")
    elif name == "anti_thrash":
        if not isinstance(value, AntiThrash):
            raise SettingsError(f"anti-thrash must be on, off or auto, got {value!r}")
    elif name == "memory_limit_bytes":
        lo, hi = MEMORY_LIMIT_RANGE
        if type(value) is not int or not lo <= value <= hi:
            raise SettingsError(f"memory_limit must be {lo}..{hi} bytes, got {value!r}")
    else:
        lo, hi = _MILLIS_FIELDS[name]
        if type(value) is not int or not lo <= value <= hi:
            raise SettingsError(f"{name} must be {lo}..{hi} milliseconds, got {value!r}")


def _check_gpu_overrides(entries: object) -> None:
    if type(entries) is not tuple:
        raise SettingsError(f"GPU settings must be a tuple of entries, got {excerpt(entries)}")
    if len(entries) > MAX_GPUS_WITH_SETTINGS:
        raise SettingsError(
            f"at most {MAX_GPUS_WITH_SETTINGS} GPUs may have settings of their own, "
            f"got {len(entries)}"
        )
    seen: dict[bytes | int, str] = {}
    for entry in entries:
        if (
            type(entry) is not tuple
            or len(entry) != 2
            or type(entry[0]) is not str
            or type(entry[1]) is not GpuOverrides
        ):
            raise SettingsError(
                f"a GPU's settings must be (id, GpuOverrides), got {excerpt(entry)}"
            )
        gpu_id, own = entry
        key = gpu_key(gpu_id)
        if key in seen:
            raise SettingsError(f"GPU {seen[key]} and GPU {gpu_id} name the same GPU")
        seen[key] = gpu_id
        for name, value in own.given().items():
            try:
                _check_value(name, value)
            except SettingsError as e:
                raise SettingsError(f"GPU {gpu_id}: {e}") from None


# ---------------------------------------------------------------- naming a GPU

_GPU_UUID = re.compile(
    r"GPU-([0-9a-f]{8})-([0-9a-f]{4})-([0-9a-f]{4})-([0-9a-f]{4})-([0-9a-f]{12})", re.IGNORECASE
)


def parse_gpu_id(text: str) -> str:
    """A GPU as an admin names it, in one canonical spelling: its UUID as NVML
    prints it ("GPU-" and lower-case hex), or its NVML index without leading
    zeros (nvidia-smi's numbering, which CUDA follows only with
    CUDA_DEVICE_ORDER=PCI_BUS_ID).  Raises SettingsError."""
    stripped = text.strip() if isinstance(text, str) else ""
    if stripped.isascii() and stripped.isdigit():
        index = int(stripped)
        if index <= MAX_GPU_INDEX:
            return str(index)
    else:
        match = _GPU_UUID.fullmatch(stripped)
        if match is not None:
            return "GPU-" + "-".join(part.lower() for part in match.groups())
    raise SettingsError(
        "a GPU is named by its UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx) or its "
        f"NVML index (0..{MAX_GPU_INDEX}), got {excerpt(text)}"
    )


def gpu_key(gpu_id: str) -> bytes | int:
    """What the core matches a GPU id against: the UUID's 16 raw bytes (as shims
    send them), or the NVML index."""
    canonical = parse_gpu_id(gpu_id)
    if canonical.startswith("GPU-"):
        return bytes.fromhex(canonical[4:].replace("-", ""))
    return int(canonical)


def gpu_sort_key(gpu_id: str) -> tuple[int, int, str]:
    """Indices first, in order; then UUIDs."""
    return (0, int(gpu_id), "") if gpu_id.isdigit() else (1, 0, gpu_id)


def gpu_override_entries(entries: Iterable[tuple[str, GpuOverrides]]) -> GpuOverrideEntries:
    """Entries as Settings keeps them: ids canonical, empty ones left out, sorted.
    SettingsError for an id that names no GPU, or two that name the same one."""
    by_id: dict[str, GpuOverrides] = {}
    written: dict[str, str] = {}
    for text, own in entries:
        gpu_id = parse_gpu_id(text)
        if gpu_id in by_id:
            raise SettingsError(f"GPU {written[gpu_id]} and GPU {text} name the same GPU")
        by_id[gpu_id], written[gpu_id] = own, text
    return tuple(
        (gpu_id, by_id[gpu_id])
        for gpu_id in sorted(by_id, key=gpu_sort_key)
        if by_id[gpu_id].given()
    )


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


_GPU_CONFIG_KEYS = {
    "time_quantum": "time_quantum_s",
    "anti_thrash": "anti_thrash",
    "memory_limit": "memory_limit_bytes",
}
GPU_SECTION_PREFIX = "gpu:"


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
    unknown_sections = [
        s for s in parser.sections() if s != "scheduler" and not s.startswith(GPU_SECTION_PREFIX)
    ]
    if parser.defaults():
        unknown_sections.insert(0, parser.default_section)
    if unknown_sections:
        raise SettingsError(
            f"config {path}: unknown section [{unknown_sections[0]}] "
            "(only [scheduler] and [gpu:ID])"
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
    gpus = [
        _gpu_section(path, parser, section)
        for section in parser.sections()
        if section.startswith(GPU_SECTION_PREFIX)
    ]
    try:
        return Settings().replaced(**changes).with_gpu_overrides(gpus)
    except SettingsError as e:
        raise SettingsError(f"config {path}: {e}") from None


def _gpu_section(
    path: Path, parser: configparser.ConfigParser, section: str
) -> tuple[str, GpuOverrides]:
    """[gpu:ID]: the GPU's id as written, and what it sets."""
    try:
        parse_gpu_id(section.removeprefix(GPU_SECTION_PREFIX))
    except SettingsError as e:
        raise SettingsError(f"config {path}: [{section}]: {e}") from None
    own: dict[str, Any] = {}
    for key, text in parser.items(section):
        field = _GPU_CONFIG_KEYS.get(key)
        if field is None:
            raise SettingsError(
                f"config {path}: unknown key {key!r} in [{section}]"
                f" (known: {', '.join(_GPU_CONFIG_KEYS)})"
            )
        own[field] = _parse_value(path, f"[{section}] {key}", field, text.strip())
    return section.removeprefix(GPU_SECTION_PREFIX), GpuOverrides(**own)


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


# Per GPU, what was changed at run time: GPU id -> field -> value, or None where
# the GPU's own value was taken away (the node-wide value applies, whatever the
# config file sets for it).  Saved under GPUS_KEY beside the node-wide fields.
GpuPins = dict[str, dict[str, Any]]
GPUS_KEY = "gpus"


class SettingsStore:
    """The run-time overrides, one JSON object in <state_dir>/settings.json:
    node-wide fields, and under "gpus" each GPU's changed fields (GpuPins)."""

    PERSISTED_FIELDS = ("time_quantum_s", "anti_thrash", "memory_limit_bytes")

    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / STATE_FILE_NAME

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
            overrides["anti_thrash"] = _ANTI_THRASH_WORDS.get(saved, saved)
        try:
            Settings().replaced(**overrides)
        except (SettingsError, RecursionError) as e:
            # The message quotes the value, which may be a 60 kB list: keep it a line.
            return {}, f"ignoring saved settings {self.path}: {_one_line(e)[:200]}"
        pins, warning = self._gpu_pins(data.get(GPUS_KEY))
        if pins:
            overrides[GPUS_KEY] = pins
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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".settings.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(_plain(overrides), f, sort_keys=True)
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
            value = _ANTI_THRASH_WORDS.get(value, value)
        if value is not None:
            try:
                _check_value(name, value)
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
        if name != "gpu_overrides":
            saved[name] = getattr(after, name)
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
    """Defaults < config < persisted overrides. Returns (settings, overrides, warning)."""
    base = load_config(config_path)
    overrides, warning = store.load_overrides()
    node_wide = {k: v for k, v in overrides.items() if k != GPUS_KEY}
    settings = base.replaced(**node_wide)
    pins = overrides.get(GPUS_KEY)
    if pins:
        try:
            settings = settings.with_gpu_overrides(with_gpu_pins(base.gpu_overrides, pins))
        except SettingsError as e:  # each fits, together too many GPUs have settings
            overrides = node_wide
            problem = f"ignoring saved GPU settings in {store.path}: {_one_line(e)[:200]}"
            warning = f"{warning}; {problem}" if warning else problem
    return settings, overrides, warning
