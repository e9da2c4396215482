"""The D-Bus properties as one table, a row for each property of the contract
(io.github.nvshare.Scheduler1.xml): how its value is read, and for a setting,
how a Set's value becomes a settings change and the sentences that refuse a
bad one.  Adding a setting is one row here and its line in the XML;
check_properties refuses to serve when the two disagree.

The D-Bus types are the XML's: a row never restates them, its sentences name
them through {type}.  Ranges are the engine's to check (settings.py), with the
rest of the settings, so that D-Bus, the config file and the state file refuse
the same values with the same sentence.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dbus_next import Variant

from . import dbus_names as names
from .dbus_contract import CONTRACT_FILE, Contract, ContractMismatch, DBusFailure
from .engine import Engine
from .settings import (
    MAX_GPUS_WITH_SETTINGS,
    AntiThrash,
    GpuOverrides,
    Settings,
    parse_anti_thrash,
    parse_fair_page,
)
from .settings_sources import ValueSource
from .snapshot import AgentSnapshot
from .text import excerpt

INTEGER_TYPES = frozenset("ynqiuxt")
# One number outside its D-Bus type fails the whole message, every client's
# view with it: the last line of defence clamps instead.
_UNSIGNED_MAX = {"u": 2**32 - 1, "t": 2**64 - 1}


# ---------------------------------------------------------------- values


def _in_range(value, dbus_type):
    maximum = _UNSIGNED_MAX.get(dbus_type)
    return value if maximum is None else min(max(value, 0), maximum)


def _struct_of(record, fields) -> list:
    """A snapshot dataclass as a D-Bus struct, in dbus_names' field order."""
    struct = []
    for field_name, dbus_type in fields:
        value = getattr(record, field_name)
        if field_name == "gpus":
            value = [_struct_of(entry, names.CLIENT_GPU_FIELDS) for entry in value]
        elif dbus_type.startswith("a"):
            value = [_in_range(entry, dbus_type[1:]) for entry in value]
        elif dbus_type == "d":
            value = float(value)
        else:
            value = _in_range(value, dbus_type)
        struct.append(value)
    return struct


def gpu_to_dbus(gpu) -> list:
    return _struct_of(gpu, names.GPU_FIELDS)


def clients_to_dbus(snapshot: AgentSnapshot) -> list:
    return [_struct_of(client, names.CLIENT_FIELDS) for client in snapshot.clients]


def gpu_details_to_dbus(snapshot: AgentSnapshot) -> dict:
    return {
        gpu.uuid: {
            key: Variant(dbus_type, _in_range(getattr(gpu, key), dbus_type))
            for key, dbus_type in names.GPU_DETAIL_FIELDS
        }
        for gpu in snapshot.gpus
    }


def client_details_to_dbus(snapshot: AgentSnapshot) -> dict:
    """ClientDetails: per pid, who it is and what it did on each GPU.  Two
    connections of one process are one pid: their figures are added up."""
    details: dict = {}
    per_gpu: dict = {}
    for client in snapshot.clients:
        pid = _in_range(client.pid, "u")
        details[pid] = {
            key: Variant(dbus_type, getattr(client, key))
            for key, dbus_type in names.CLIENT_DETAIL_FIELDS
        }
        for entry in client.gpus:
            _add_gpu_figures(per_gpu.setdefault(pid, {}).setdefault(entry.uuid, {}), entry)
    for pid, gpus in per_gpu.items():
        details[pid][names.CLIENT_PER_GPU_KEY] = Variant(
            "a{sa{sv}}",
            {
                uuid: {
                    key: Variant(dbus_type, figures[key])
                    for key, dbus_type in names.CLIENT_GPU_DETAIL_FIELDS
                }
                for uuid, figures in gpus.items()
            },
        )
    return details


def _add_gpu_figures(figures: dict, entry) -> None:
    figures["gpu_seconds"] = figures.get("gpu_seconds", 0.0) + float(entry.gpu_seconds)
    figures["recent_use"] = figures.get("recent_use", 0.0) + float(entry.recent_use)
    figures["wait_cause"] = figures.get("wait_cause") or entry.wait_cause
    waited = figures.setdefault("waited_s", {})
    for cause, seconds in entry.waited_s:
        waited[cause] = waited.get(cause, 0.0) + float(seconds)


def gpu_settings_to_dbus(settings: Settings) -> dict:
    """GpuSettings: each GPU id with what it sets for itself, and only that."""
    types = dict(names.GPU_SETTINGS_FIELDS)
    return {
        gpu_id: {
            key: Variant(types[key], value.value if isinstance(value, AntiThrash) else value)
            for key, value in own.given().items()
        }
        for gpu_id, own in settings.gpu_overrides
    }


def value_sources_to_dbus(rows: list[ValueSource]) -> list[dict]:
    """GetSettings' answer: each value, its source, the file's value, the way back."""
    answer = []
    for row in rows:
        dbus_type = names.SETTING_TYPES[row.key]
        entry = {
            "section": Variant("s", row.section),
            "key": Variant("s", row.key),
            "source": Variant("s", row.source.value),
            "reset": Variant("s", row.reset_command()),
        }
        for key, value in (("value", row.value), ("file_value", row.file_value)):
            if value is not None:
                plain = value.value if isinstance(value, enum.Enum) else value
                entry[key] = Variant(dbus_type, _in_range(plain, dbus_type))
        answer.append(entry)
    return answer


def statistics_to_dbus(engine: Engine) -> dict:
    return {
        uuid: {
            "grants": Variant("t", _in_range(stats.grants, "t")),
            "drops": Variant("t", _in_range(stats.drops, "t")),
            "revokes": Variant("t", _in_range(stats.revokes, "t")),
            "wait_seconds_sum": Variant("d", float(stats.wait_sum_s)),
            "wait_seconds_buckets": Variant(
                "a(dt)", [[bound, count] for bound, count in stats.cumulative_buckets()]
            ),
        }
        for uuid, stats in engine.gpu_statistics().items()
    }


# ---------------------------------------------------------------- settings from a Set


def _gpu_overrides_of(entries: dict) -> list[tuple[str, GpuOverrides]]:
    """A GpuSettings write (of the contract's type) as (GPU id, its settings)
    pairs, or DBusFailure.  The ids are the engine's to check."""
    if len(entries) > MAX_GPUS_WITH_SETTINGS:  # before looking at each
        raise DBusFailure(
            names.ERROR_INVALID_ARGUMENT,
            f"at most {MAX_GPUS_WITH_SETTINGS} GPUs may have settings of their own, "
            f"got {len(entries)}",
        )
    types = dict(names.GPU_SETTINGS_FIELDS)
    pairs = []
    for gpu_id, fields in entries.items():
        own: dict = {}
        for key, item in fields.items():
            expected = types.get(key)
            if expected is None:
                raise DBusFailure(
                    names.ERROR_INVALID_ARGUMENT,
                    f"GPU {excerpt(gpu_id)}: unknown setting {excerpt(key)} "
                    f"(known: {', '.join(types)})",
                )
            if expected == "s" and item.signature == "s":
                try:
                    own[key] = parse_anti_thrash(item.value)
                except ValueError:
                    raise DBusFailure(
                        names.ERROR_INVALID_ARGUMENT,
                        f"GPU {excerpt(gpu_id)}: anti-thrash mode must be on, off or auto, "
                        f"got {excerpt(item.value)}",
                    ) from None
            elif expected != "s" and item.signature in INTEGER_TYPES:
                own[key] = item.value
            else:
                raise DBusFailure(
                    names.ERROR_INVALID_ARGUMENT,
                    f"GPU {excerpt(gpu_id)}: {key} must be of D-Bus type '{expected}', "
                    f"got type '{excerpt(item.signature)}'",
                )
        pairs.append((gpu_id, GpuOverrides(**own)))
    return pairs


def _on_or_off(on: bool) -> AntiThrash:
    return AntiThrash.ON if on else AntiThrash.OFF


def _as_is(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Setting:
    """How a Set of one property becomes Engine.change_settings(field=...).

    wrong_type: the sentence for a value of a D-Bus type it does not take; it may
    name {type} (the contract's), {got} (the caller's type), {got_quoted} (that,
    quoted and cut short) and {value} (the value, quoted and cut short).
    parse: the value, of a type it takes, as the setting's; a ValueError from it
    is answered with bad_value ({value} as above).  A DBusFailure from it is
    answered as it is (GpuSettings' entries say which entry is wrong)."""

    field: str
    wrong_type: str
    parse: Callable[[Any], Any] = _as_is
    bad_value: str = ""
    also_takes: frozenset[str] = frozenset()  # D-Bus types taken besides the contract's

    def change(self, contract_type: str, value: Variant) -> dict:
        """The settings change for a Set of this property to `value`, or DBusFailure."""
        if value.signature != contract_type and value.signature not in self.also_takes:
            raise DBusFailure(
                names.ERROR_INVALID_ARGUMENT,
                self.wrong_type.format(
                    type=contract_type,
                    got=value.signature,
                    got_quoted=excerpt(value.signature),
                    # Quoting a value is work that grows with it: only where asked for.
                    value=excerpt(value.value) if "{value}" in self.wrong_type else "",
                ),
            )
        try:
            return {self.field: self.parse(value.value)}
        except ValueError:
            if not self.bad_value:
                raise
            raise DBusFailure(
                names.ERROR_INVALID_ARGUMENT, self.bad_value.format(value=excerpt(value.value))
            ) from None


@dataclass(frozen=True)
class Reading:
    """What every property is read from: taken once for a read of them all."""

    engine: Engine
    settings: Settings
    snapshot: AgentSnapshot
    config_problem: str


@dataclass(frozen=True)
class Property:
    name: str
    read: Callable[[Reading], Any]  # the value now, plain Python
    setting: Setting | None = None  # None: read-only (the contract must say so)


# In the contract's order: GetAll and PropertiesChanged list them so.
PROPERTIES = (
    Property(
        names.PROP_TIME_QUANTUM,
        lambda now: now.settings.time_quantum_s,
        Setting(
            "time_quantum_s",
            "time quantum must be a whole number of seconds (D-Bus type '{type}'), "
            "got type '{got}'",
            also_takes=INTEGER_TYPES,
        ),
    ),
    Property(
        names.PROP_ANTI_THRASH,
        lambda now: now.settings.anti_thrash is not AntiThrash.OFF,
        Setting(
            "anti_thrash",
            "anti-thrash must be on or off (D-Bus type '{type}'), got {value} of type '{got}'",
            parse=_on_or_off,
        ),
    ),
    Property(
        names.PROP_ANTI_THRASH_MODE,
        lambda now: now.settings.anti_thrash.value,
        Setting(
            "anti_thrash",
            "anti-thrash mode must be on, off or auto (D-Bus type '{type}'), got type '{got}'",
            parse=parse_anti_thrash,
            bad_value="anti-thrash mode must be on, off or auto, got {value}",
        ),
    ),
    Property(
        names.PROP_MEMORY_LIMIT,
        lambda now: now.settings.memory_limit_bytes,
        Setting(
            "memory_limit_bytes",
            "memory limit must be a whole number of bytes (D-Bus type '{type}'), got type '{got}'",
            also_takes=INTEGER_TYPES,
        ),
    ),
    Property(
        names.PROP_GPU_SETTINGS,
        lambda now: gpu_settings_to_dbus(now.settings),
        Setting(
            "gpu_overrides",
            "GPU settings map GPU ids to their settings (D-Bus type '{type}'), "
            "got type '{got_quoted}'",
            parse=_gpu_overrides_of,
        ),
    ),
    Property(
        names.PROP_FAIR_PAGE,
        lambda now: now.settings.fair_page.value,
        Setting(
            "fair_page",
            "fair page must be on or off (D-Bus type '{type}'), got type '{got}'",
            parse=parse_fair_page,
            bad_value="fair_page must be on or off, got {value}",
        ),
    ),
    Property(names.PROP_GPUS, lambda now: [gpu_to_dbus(gpu) for gpu in now.snapshot.gpus]),
    Property(names.PROP_CLIENTS, lambda now: clients_to_dbus(now.snapshot)),
    Property(names.PROP_GPU_DETAILS, lambda now: gpu_details_to_dbus(now.snapshot)),
    Property(names.PROP_CLIENT_DETAILS, lambda now: client_details_to_dbus(now.snapshot)),
    Property(names.PROP_STATISTICS, lambda now: statistics_to_dbus(now.engine)),
    Property(names.PROP_CONFIG_PROBLEM, lambda now: now.config_problem),
    Property(names.PROP_CONFIG_WARNINGS, lambda now: list(now.engine.settings_origin.warnings)),
)
SETTINGS = {row.name: row.setting for row in PROPERTIES if row.setting is not None}


def property_values(engine: Engine, config_problem: str = "") -> dict:
    """Every property's value now, plain Python, by name."""
    now = Reading(engine, engine.settings, engine.snapshot(), config_problem)
    return {row.name: row.read(now) for row in PROPERTIES}


def check_properties(contract: Contract) -> None:
    """The table serves exactly the contract's properties, a setting for each
    writable one; ContractMismatch (a sentence naming each difference) otherwise."""
    problems = []
    in_table = [row.name for row in PROPERTIES]
    only_xml = [name for name in contract.properties if name not in in_table]
    only_table = [name for name in in_table if name not in contract.properties]
    if only_xml:
        problems.append(f"in {CONTRACT_FILE} but not in the table: {', '.join(only_xml)}")
    if only_table:
        problems.append(f"in the table but not in {CONTRACT_FILE}: {', '.join(only_table)}")
    for row in PROPERTIES:
        if row.name not in contract.properties:
            continue
        writable = contract.properties[row.name][1] == "readwrite"
        if writable and row.setting is None:
            problems.append(f"{row.name} is readwrite in {CONTRACT_FILE} but has no setting")
        elif not writable and row.setting is not None:
            problems.append(f"{row.name} has a setting but is read-only in {CONTRACT_FILE}")
    if problems:
        raise ContractMismatch(
            "agent/dbus_properties.py and the D-Bus contract disagree: " + "; ".join(problems)
        )
