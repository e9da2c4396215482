"""Scheduler settings: the value type, its validation, and the words for its values.

Node-wide settings, and what a GPU may set for itself: a time quantum,
anti-thrash mode, memory limit and light work's wait of its own (GpuOverrides),
named by the GPU's UUID or by its index as NVML numbers the node's GPUs; what it
does not set is the node-wide value.  An entry by UUID wins over one by index,
key by key.  A share group's weight and memory cap (Share), by group.  Where the
values come from (defaults < the config file < run-time changes) is
settings_files.py.

One concern, though past ~400 lines: what a setting may be.  The value types
(node-wide, a GPU's own, a share group's), the range of each field and the
words and ids that name values (a GPU, a share group, a mode, a size) live
together, so that every way in (the config file, the state file, a change over
D-Bus) is checked by the same rules.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .protocol import DEFAULT_DROP_GRACE_MS
from .text import excerpt

TIME_QUANTUM_RANGE_S = (1, 86400)
# u32 milliseconds on the wire; a day is plenty and keeps the numbers sane.
MILLIS_RANGE = (0, 86_400_000)
# A minimum slice or a light wait of more than ten seconds is no longer light work's.
MIN_SLICE_RANGE_MS = (0, 10_000)
LIGHT_WAIT_RANGE_MS = (0, 10_000)
# A memory limit or cap: 0 (none), else bytes in this range.  Below a MiB it is a
# number whose unit was left out (40 for 40G) and would mean "nothing ever fits";
# above 16 TiB it is a typo too (no GPU comes near), and it keeps D-Bus's u64 far.
MEMORY_SIZE_RANGE = (1 << 20, 16 << 40)
_SIZE_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
# A node has a handful of GPUs; the bounds only keep a D-Bus write or a state file
# from making the agent hold (and every status read list) thousands of entries.
MAX_GPU_INDEX = 1023
MAX_GPUS_WITH_SETTINGS = 256
# What a GPU may set for itself; idle release, drop grace and the minimum slice
# stay node-wide (the shim applies the first two, per process, not per GPU).
GPU_SETTING_FIELDS = ("time_quantum_s", "anti_thrash", "memory_limit_bytes", "light_wait_ms")
# Shares (docs/scheduling.md, "Shares"): a group's weight, and how many groups may
# have settings (each one a line in status; the bound keeps a D-Bus write sane).
SHARE_WEIGHT_RANGE = (1, 1000)
MAX_SHARES = 1024
SHARE_FIELDS = ("weight", "memory_cap_bytes")


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


class ShareBy(str, enum.Enum):
    """What a share group is: the client's user (uid), its systemd unit or
    Kubernetes pod, or the process itself (fairness per process, as before shares)."""

    USER = "user"
    UNIT = "unit"
    PROCESS = "process"

    def __str__(self) -> str:
        return self.value


class FairPage(str, enum.Enum):
    """on: holders of a GPU whose shims take it share the GPU by weight through its fair
    page (docs/scheduling.md, "Side by side: the fair page"); off: no slots are handed
    out and none held, the driver interleaves the holders as it will."""

    ON = "on"
    OFF = "off"

    def __str__(self) -> str:
        return self.value


class SettingsError(ValueError):
    """A setting out of range or a config file we cannot read; str() is one human sentence."""


class NoSuchUser(SettingsError):
    """A share group names a user this node does not have (yet)."""


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
    light_wait_ms: int | None = None

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
class Share:
    """What one share group sets: its weight (None: 1) and its memory cap per GPU
    in bytes (None or 0: no cap)."""

    weight: int | None = None
    memory_cap_bytes: int | None = None

    def given(self) -> dict[str, Any]:
        return {name: value for name in SHARE_FIELDS if (value := getattr(self, name)) is not None}


# (group id, what it sets): ids as parse_share_group writes them ("user:1000",
# "unit:jupyter-alice.service", "pod:<uid>"), sorted.
ShareEntries = tuple[tuple[str, Share], ...]


DEFAULT_TIME_QUANTUM_S = 30


@dataclass(frozen=True, slots=True)
class Settings:
    time_quantum_s: int = DEFAULT_TIME_QUANTUM_S
    anti_thrash: AntiThrash = AntiThrash.AUTO
    idle_release_ms: int = 1000
    drop_grace_ms: int = DEFAULT_DROP_GRACE_MS
    # auto: light work that cannot run beside the turn waits about this long at most ...
    light_wait_ms: int = 100
    # ... and a turn runs at least this long between two windows of it.
    min_slice_ms: int = 50
    # auto: the most memory a GPU is taken to have (0: its own size).
    memory_limit_bytes: int = 0
    # GPUs with settings of their own (with_gpu_overrides builds it).  A tuple, so
    # that the value stays hashable and compares by value.
    gpu_overrides: GpuOverrideEntries = ()
    # What a share group is, and the groups' weights and memory caps.
    share_by: ShareBy = ShareBy.USER
    shares: ShareEntries = ()
    fair_page: FairPage = FairPage.ON

    def validated(self) -> Settings:
        for name in _NODE_FIELDS:
            check_setting(name, getattr(self, name))
        _check_gpu_overrides(self.gpu_overrides)
        _check_shares(self.shares)
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
    "light_wait_ms",
    "min_slice_ms",
    "memory_limit_bytes",
    "share_by",
    "fair_page",
)
_MILLIS_FIELDS = {
    "idle_release_ms": MILLIS_RANGE,
    "drop_grace_ms": MILLIS_RANGE,
    "light_wait_ms": LIGHT_WAIT_RANGE_MS,
    "min_slice_ms": MIN_SLICE_RANGE_MS,
}


def _whole_in(value: object, bounds: tuple[int, int]) -> bool:
    return type(value) is int and bounds[0] <= value <= bounds[1]


def check_setting(name: str, value: object) -> None:
    """One setting's value, by field name; SettingsError with the sentence for it."""
    if name == "time_quantum_s":
        lo, hi = TIME_QUANTUM_RANGE_S
        if not _whole_in(value, TIME_QUANTUM_RANGE_S):
            raise SettingsError(f"time quantum must be {lo}..{hi} seconds, got {value!r}")
    elif name == "anti_thrash":
        if not isinstance(value, AntiThrash):
            raise SettingsError(f"anti-thrash must be on, off or auto, got {value!r}")
    elif name == "memory_limit_bytes":
        _check_memory_size("memory_limit", "no limit", value)
    elif name == "share_by":
        if not isinstance(value, ShareBy):
            raise SettingsError(f"share_by must be user, unit or process, got {value!r}")
    elif name == "fair_page":
        if not isinstance(value, FairPage):
            raise SettingsError(f"fair_page must be on or off, got {value!r}")
    elif name == "weight":
        lo, hi = SHARE_WEIGHT_RANGE
        if not _whole_in(value, SHARE_WEIGHT_RANGE):
            raise SettingsError(f"a share's weight must be {lo}..{hi}, got {value!r}")
    elif name == "memory_cap_bytes":
        _check_memory_size("a share's memory_cap", "no cap", value)
    else:
        lo, hi = _MILLIS_FIELDS[name]
        if not _whole_in(value, _MILLIS_FIELDS[name]):
            raise SettingsError(f"{name} must be {lo}..{hi} milliseconds, got {value!r}")


def _check_memory_size(setting: str, zero: str, value: object) -> None:
    if (type(value) is int and value == 0) or _whole_in(value, MEMORY_SIZE_RANGE):
        return
    hint = ""
    if type(value) is int and 0 < value < MEMORY_SIZE_RANGE[0]:
        hint = ": a size without a unit is bytes (write 40G for 40 GiB)"
    got = f"{value} bytes" if type(value) is int else repr(value)
    raise SettingsError(f"{setting} must be 0 ({zero}) or 1M..16T (1 MiB..16 TiB), got {got}{hint}")


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
                check_setting(name, value)
            except SettingsError as e:
                raise SettingsError(f"GPU {gpu_id}: {e}") from None


def _check_shares(entries: object) -> None:
    if type(entries) is not tuple:
        raise SettingsError(f"shares must be a tuple of entries, got {excerpt(entries)}")
    if len(entries) > MAX_SHARES:
        raise SettingsError(f"at most {MAX_SHARES} groups may have shares, got {len(entries)}")
    seen = set()
    for entry in entries:
        if (
            type(entry) is not tuple
            or len(entry) != 2
            or type(entry[0]) is not str
            or type(entry[1]) is not Share
        ):
            raise SettingsError(f"a share must be (group, Share), got {excerpt(entry)}")
        group, share = entry
        if parse_share_group(group) != group:
            raise SettingsError(f"share group {group!r} is not written canonically")
        if group in seen:
            raise SettingsError(f"share group {group} appears twice")
        seen.add(group)
        for name, value in share.given().items():
            try:
                check_setting(name, value)
            except SettingsError as e:
                raise SettingsError(f"share {group}: {e}") from None


# ---------------------------------------------------------------- naming a share group

_UNIT_NAME = re.compile(r"[A-Za-z0-9:_.\\@-]{1,250}\.(service|scope|slice)")
_POD_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?")
MAX_UID = 2**32 - 2  # (uid_t)-1 is "no user"


def parse_share_group(text: object, uid_of: Callable[[str], int | None] | None = None) -> str:
    """A share group as an admin names it, in one canonical spelling:
    user:NAME or user:UID (kept as user:UID; uid_of looks a name up, the adapters
    pass the user database), unit:NAME.service (or .scope, .slice), pod:UID (a
    Kubernetes pod's UID).  A process is no group one can set: it has no
    lasting name.  Raises SettingsError."""
    stripped = text.strip() if isinstance(text, str) else ""
    kind, _, name = stripped.partition(":")
    kind = kind.lower()
    if kind == "user" and name:
        if name.isascii() and name.isdigit() and int(name) <= MAX_UID:
            return f"user:{int(name)}"
        if _USER_NAME.fullmatch(name):
            uid = uid_of(name) if uid_of is not None else None
            if uid is None:
                raise NoSuchUser(f"share group {stripped}: no user named {name!r} on this node")
            return f"user:{uid}"
    elif kind == "unit" and _UNIT_NAME.fullmatch(name):
        return f"unit:{name}"
    elif kind == "pod" and _POD_UID.fullmatch(name.lower()):
        return f"pod:{name.lower()}"
    raise SettingsError(
        f"a share group is user:NAME, user:UID, unit:NAME.service or pod:UID, got {excerpt(text)}"
    )


def share_entries(entries: Iterable[tuple[str, Share]]) -> ShareEntries:
    """Entries as Settings keeps them: canonical (already), empty ones left out, sorted."""
    by_group: dict[str, Share] = {}
    for group, share in entries:
        if group in by_group:
            raise SettingsError(f"share group {group} appears twice")
        by_group[group] = share
    return tuple((g, by_group[g]) for g in sorted(by_group) if by_group[g].given())


def parse_share_by(text: str) -> ShareBy:
    try:
        return ShareBy(text.strip().lower())
    except ValueError:
        raise SettingsError(f"share_by must be user, unit or process, got {text!r}") from None


def parse_fair_page(text: str) -> FairPage:
    try:
        return FairPage(text.strip().lower())
    except ValueError:
        raise SettingsError(f"fair_page must be on or off, got {text!r}") from None


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


# ---------------------------------------------------------------- words for values

# The words an admin may write for each anti-thrash mode (the original's on/off,
# and the booleans configparser users expect).
ANTI_THRASH_WORDS = {
    **dict.fromkeys(("on", "true", "yes", "1"), AntiThrash.ON),
    **dict.fromkeys(("off", "false", "no", "0"), AntiThrash.OFF),
    "auto": AntiThrash.AUTO,
}


def parse_anti_thrash(text: str) -> AntiThrash:
    """on/off/auto (and true/false/yes/no/1/0); raises SettingsError."""
    mode = ANTI_THRASH_WORDS.get(text.strip().lower())
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
