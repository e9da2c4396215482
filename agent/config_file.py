"""The config file: /etc/nvshare/nvshare.conf, INI, as the admin writes it.

[scheduler] for the node-wide settings, [gpu:ID] for a GPU's own, [share:GROUP]
for a share group's.  Every mistake is one line that names the file and the line
at fault; a [share:user:NAME] for a user this node lacks is no mistake but a
warning (one file serves many nodes), and the section is skipped.  What the file
sets is kept apart from what the defaults fill in (ConfigFile.node_keys), so
that status can say where each value comes from (settings_sources.py).
"""

from __future__ import annotations

import configparser
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .identity import uid_of
from .settings import (
    AntiThrash,
    FairPage,
    GpuOverrides,
    NoSuchUser,
    Settings,
    SettingsError,
    Share,
    ShareBy,
    check_setting,
    parse_anti_thrash,
    parse_fair_page,
    parse_gpu_id,
    parse_share_by,
    parse_share_group,
    parse_size,
    share_entries,
)

DEFAULT_CONFIG_PATH = Path("/etc/nvshare/nvshare.conf")
# Both files are a few lines; anything larger is the wrong file (--config /dev/zero).
MAX_FILE_BYTES = 64 * 1024

CONFIG_KEYS = {
    "time_quantum": "time_quantum_s",
    "anti_thrash": "anti_thrash",
    "idle_release_ms": "idle_release_ms",
    "drop_grace_ms": "drop_grace_ms",
    "light_wait_ms": "light_wait_ms",
    "min_slice_ms": "min_slice_ms",
    "memory_limit": "memory_limit_bytes",
    "share_by": "share_by",
    "fair_page": "fair_page",
}
GPU_CONFIG_KEYS = {
    "time_quantum": "time_quantum_s",
    "anti_thrash": "anti_thrash",
    "memory_limit": "memory_limit_bytes",
    "light_wait_ms": "light_wait_ms",
}
GPU_SECTION_PREFIX = "gpu:"
# [share:user:alice], [share:unit:jupyter-bob.service], [share:pod:UID]
SHARE_SECTION_PREFIX = "share:"
SHARE_CONFIG_KEYS = {"weight": "weight", "memory_cap": "memory_cap_bytes"}


@dataclass(frozen=True)
class ConfigFile:
    """What a config file gives: the settings (defaults where it says nothing),
    the node-wide fields its [scheduler] sets, and warnings (sections skipped)."""

    settings: Settings = field(default_factory=Settings)
    node_keys: frozenset[str] = frozenset()
    warnings: tuple[str, ...] = ()


def load_config(path: Path) -> Settings:
    """Read the INI config; a missing file means defaults.  Raises SettingsError,
    one line that names the file and, where there is one, the line at fault."""
    return load_config_file(path).settings


def load_config_file(path: Path) -> ConfigFile:
    """load_config, with what the file sets itself and its warnings."""
    text = read_config_text(path)
    return ConfigFile() if text is None else parse_config_file(text, path)


def read_config_text(path: Path) -> str | None:
    """The config file's text; None when there is none.  SettingsError when it
    cannot be read (a directory, a FIFO, too large, not UTF-8)."""
    try:
        return read_small_file(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise SettingsError(f"config {path}: cannot read it: {one_line(e)}") from None


def parse_config(text: str, path: Path) -> Settings:
    """The settings that the config file's text gives; SettingsError names the
    line where the text says which (every message begins "config PATH")."""
    return parse_config_file(text, path).settings


def parse_config_file(text: str, path: Path) -> ConfigFile:
    """parse_config, with what the file sets itself and its warnings."""
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
        raise SettingsError(f"config {path}: {one_line(e.message)}") from None
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
            field = CONFIG_KEYS.get(key)
            if field is None:
                raise SettingsError(
                    f"{where('scheduler', key)}: unknown key {key!r} in [scheduler]"
                    f" (known: {', '.join(CONFIG_KEYS)})"
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
    warnings = []
    for section in parser.sections():
        if section.startswith(SHARE_SECTION_PREFIX):
            group, share, skipped = _share_section(parser, section, where)
            if skipped:
                warnings.append(skipped)
            else:
                shares.append((group, share))
    try:
        settings = (
            Settings()
            .replaced(**changes)
            .with_gpu_overrides(gpus)
            .replaced(shares=share_entries(shares))
        )
    except SettingsError as e:  # what no single line says: too many GPUs, say
        raise SettingsError(f"config {path}: {e}") from None
    return ConfigFile(settings, frozenset(changes), tuple(warnings))


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
        field = GPU_CONFIG_KEYS.get(key)
        if field is None:
            raise SettingsError(
                f"{where(section, key)}: unknown key {key!r} in [{section}]"
                f" (known: {', '.join(GPU_CONFIG_KEYS)})"
            )
        own[field] = _parse_value(where(section, key), f"[{section}] {key}", field, text.strip())
    return section.removeprefix(GPU_SECTION_PREFIX), GpuOverrides(**own)


def _share_section(
    parser: configparser.ConfigParser, section: str, where: Callable[..., str]
) -> tuple[str, Share, str]:
    """[share:GROUP]: the group, canonical, and its weight and memory cap; and
    the warning that skips it when it names a user this node does not have (one
    file for many nodes: the rest of the file must still apply), "" else.  Its
    values are checked all the same: a typo is a typo on every node."""
    skipped = ""
    try:
        group = parse_share_group(section.removeprefix(SHARE_SECTION_PREFIX), uid_of)
    except NoSuchUser as e:
        group = section.removeprefix(SHARE_SECTION_PREFIX)
        skipped = (
            f"{where(section)}: [{section}] skipped: {str(e).partition(': ')[2]} "
            "(it applies once the user exists and the agent restarts)"
        )
    except SettingsError as e:
        raise SettingsError(f"{where(section)}: [{section}]: {e}") from None
    own: dict[str, Any] = {}
    for key, text in parser.items(section):
        field = SHARE_CONFIG_KEYS.get(key)
        if field is None:
            raise SettingsError(
                f"{where(section, key)}: unknown key {key!r} in [{section}]"
                f" (known: {', '.join(SHARE_CONFIG_KEYS)})"
            )
        own[field] = _parse_value(where(section, key), f"[{section}] {key}", field, text.strip())
    return group, Share(**own), skipped


def _parse_value(
    where: str, key: str, field: str, text: str
) -> int | AntiThrash | ShareBy | FairPage:
    """One value, parsed and range-checked here, where its line is known."""
    value: int | AntiThrash | ShareBy | FairPage
    try:
        if field == "anti_thrash":
            value = parse_anti_thrash(text)
        elif field == "share_by":
            value = parse_share_by(text)
        elif field == "fair_page":
            value = parse_fair_page(text)
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
        if message.startswith(key):
            raise SettingsError(f"{where}: {message}") from None
        bare = key.rpartition(" ")[2]  # "[gpu:0] memory_limit" -> memory_limit
        if message.startswith(bare):  # the sentence names it already: once is enough
            raise SettingsError(f"{where}: {key}{message[len(bare) :]}") from None
        raise SettingsError(f"{where}: {key}: {message}") from None
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


def one_line(e: object) -> str:
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
