"""The D-Bus adapter: the engine's settings and state as io.github.nvshare.Scheduler1.

The contract is the checked-in interface XML beside this file: its property
names, types and access are what calls are checked against, and Introspect
serves it as it is.  dbus-next only carries messages: one dispatcher here
(DBusApi.handle) answers every method call that reaches the agent, so each
call takes one path, which ARCHITECTURE.md walks through for a Set:

    handle -> _start_set -> _set -> caller_may_change (the one permission check)
    -> _setting_change -> Engine.change_settings -> ... -> Engine._notify
    -> publish_changes (PropertiesChanged)

The permission check repeats the policy file's rule on purpose: a permissive
or broken policy must not turn into anyone-may-set.
"""

from __future__ import annotations

import asyncio
import grp
import importlib.resources
import logging
import os
import pwd
from collections.abc import Callable
from dataclasses import dataclass
from xml.etree import ElementTree

from dbus_next import Message, MessageType, Variant
from dbus_next.aio import MessageBus
from dbus_next.constants import ErrorType, RequestNameReply

from . import dbus_names as names
from .dbus_connection import connect_bus, plain, read_machine_id
from .engine import Engine
from .settings import (
    MAX_GPUS_WITH_SETTINGS,
    AntiThrash,
    GpuOverrides,
    Settings,
    SettingsNotSaved,
    parse_anti_thrash,
)
from .snapshot import AgentSnapshot
from .text import excerpt

log = logging.getLogger(__name__)

CONTRACT_FILE = names.INTERFACE + ".xml"
_PROPERTIES = "org.freedesktop.DBus.Properties"
_INTROSPECTABLE = "org.freedesktop.DBus.Introspectable"
_PEER = "org.freedesktop.DBus.Peer"
_STANDARD = (_PROPERTIES, _INTROSPECTABLE, _PEER)
_INTEGER_TYPES = frozenset("ynqiuxt")
# One number outside its D-Bus type fails the whole message, every client's
# view with it: the last line of defence clamps instead.
_UNSIGNED_MAX = {"u": 2**32 - 1, "t": 2**64 - 1}
# Clients may report GPUs of their own: an error lists a few, not all.
_KNOWN_GPUS_SHOWN = 8

# The standard interfaces, as Introspect describes them beside ours.
_STANDARD_XML = f"""
  <interface name="{_INTROSPECTABLE}">
    <method name="Introspect"><arg name="xml_data" type="s" direction="out"/></method>
  </interface>
  <interface name="{_PEER}">
    <method name="Ping"/>
    <method name="GetMachineId"><arg name="machine_uuid" type="s" direction="out"/></method>
  </interface>
  <interface name="{_PROPERTIES}">
    <method name="Get">
      <arg name="interface_name" type="s" direction="in"/>
      <arg name="property_name" type="s" direction="in"/>
      <arg name="value" type="v" direction="out"/>
    </method>
    <method name="GetAll">
      <arg name="interface_name" type="s" direction="in"/>
      <arg name="props" type="a{{sv}}" direction="out"/>
    </method>
    <method name="Set">
      <arg name="interface_name" type="s" direction="in"/>
      <arg name="property_name" type="s" direction="in"/>
      <arg name="value" type="v" direction="in"/>
    </method>
    <signal name="PropertiesChanged">
      <arg name="interface_name" type="s"/>
      <arg name="changed_properties" type="a{{sv}}"/>
      <arg name="invalidated_properties" type="as"/>
    </signal>
  </interface>"""


class DBusFailure(Exception):
    """A call answered with a named error and one human sentence."""

    def __init__(self, name: str, text: str):
        super().__init__(text)
        self.name, self.text = name, text


@dataclass(frozen=True)
class Contract:
    xml: str  # the interface element as written in the file
    properties: dict[str, tuple[str, str]]  # name -> (type, access)
    methods: dict[str, str]  # name -> input signature
    silent: frozenset[str]  # properties that emit no PropertiesChanged


def load_contract() -> Contract:
    text = importlib.resources.files(__package__).joinpath(CONTRACT_FILE).read_text()
    root = ElementTree.fromstring(text)
    (interface,) = [i for i in root.findall("interface") if i.get("name") == names.INTERFACE]
    properties = {
        p.attrib["name"]: (p.attrib["type"], p.attrib["access"]) for p in interface.iter("property")
    }
    methods = {
        m.attrib["name"]: "".join(
            a.attrib["type"] for a in m.iter("arg") if a.get("direction") == "in"
        )
        for m in interface.iter("method")
    }
    silent = frozenset(
        p.attrib["name"]
        for p in interface.iter("property")
        for a in p.iter("annotation")
        if a.get("name") == "org.freedesktop.DBus.Property.EmitsChangedSignal"
        and a.get("value") == "false"
    )
    start = text.index(f'<interface name="{names.INTERFACE}"')
    end = text.index("</interface>", start) + len("</interface>")
    return Contract(text[start:end], properties, methods, silent)


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
    return {
        _in_range(client.pid, "u"): {
            key: Variant(dbus_type, getattr(client, key))
            for key, dbus_type in names.CLIENT_DETAIL_FIELDS
        }
        for client in snapshot.clients
    }


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


def property_values(engine: Engine, config_problem: str = "") -> dict:
    """Every property's value now, plain Python, by name."""
    settings, snapshot = engine.settings, engine.snapshot()
    return {
        names.PROP_TIME_QUANTUM: settings.time_quantum_s,
        names.PROP_ANTI_THRASH: settings.anti_thrash is not AntiThrash.OFF,
        names.PROP_ANTI_THRASH_MODE: settings.anti_thrash.value,
        names.PROP_MEMORY_LIMIT: settings.memory_limit_bytes,
        names.PROP_GPU_SETTINGS: gpu_settings_to_dbus(settings),
        names.PROP_GPUS: [gpu_to_dbus(gpu) for gpu in snapshot.gpus],
        names.PROP_CLIENTS: clients_to_dbus(snapshot),
        names.PROP_GPU_DETAILS: gpu_details_to_dbus(snapshot),
        names.PROP_CLIENT_DETAILS: client_details_to_dbus(snapshot),
        names.PROP_STATISTICS: statistics_to_dbus(engine),
        names.PROP_CONFIG_PROBLEM: config_problem,
    }


def _setting_change(prop_name: str, value: Variant) -> dict:
    """The engine's settings change for a Set of prop_name, or DBusFailure."""
    if prop_name == names.PROP_TIME_QUANTUM:
        if value.signature not in _INTEGER_TYPES:
            raise DBusFailure(
                names.ERROR_INVALID_ARGUMENT,
                "time quantum must be a whole number of seconds (D-Bus type 'u'), "
                f"got type '{value.signature}'",
            )
        return {"time_quantum_s": value.value}
    if prop_name == names.PROP_ANTI_THRASH:
        if value.signature != "b":
            raise DBusFailure(
                names.ERROR_INVALID_ARGUMENT,
                f"anti-thrash must be on or off (D-Bus type 'b'), "
                f"got {excerpt(value.value)} of type '{value.signature}'",
            )
        return {"anti_thrash": AntiThrash.ON if value.value else AntiThrash.OFF}
    if prop_name == names.PROP_ANTI_THRASH_MODE:
        if value.signature != "s":
            raise DBusFailure(
                names.ERROR_INVALID_ARGUMENT,
                f"anti-thrash mode must be on, off or auto (D-Bus type 's'), "
                f"got type '{value.signature}'",
            )
        try:
            return {"anti_thrash": parse_anti_thrash(value.value)}
        except ValueError:
            raise DBusFailure(
                names.ERROR_INVALID_ARGUMENT,
                f"anti-thrash mode must be on, off or auto, got {excerpt(value.value)}",
            ) from None
    if prop_name == names.PROP_MEMORY_LIMIT:
        if value.signature not in _INTEGER_TYPES:
            raise DBusFailure(
                names.ERROR_INVALID_ARGUMENT,
                "memory limit must be a whole number of bytes (D-Bus type 't'), "
                f"got type '{value.signature}'",
            )
        return {"memory_limit_bytes": value.value}
    if prop_name == names.PROP_GPU_SETTINGS:
        return {"gpu_overrides": _gpu_overrides_of(value)}
    raise AssertionError(f"no setting behind the writable property {prop_name}")


_GPU_SETTINGS_SIGNATURE = "a{sa{sv}}"


def _gpu_overrides_of(value: Variant) -> list[tuple[str, GpuOverrides]]:
    """A GpuSettings write as (GPU id, its settings) pairs, or DBusFailure.  The ids
    and ranges are the engine's to check (settings.py), with the rest of the settings."""
    if value.signature != _GPU_SETTINGS_SIGNATURE:
        raise DBusFailure(
            names.ERROR_INVALID_ARGUMENT,
            f"GPU settings map GPU ids to their settings (D-Bus type '{_GPU_SETTINGS_SIGNATURE}'), "
            f"got type '{excerpt(value.signature)}'",
        )
    if len(value.value) > MAX_GPUS_WITH_SETTINGS:  # before looking at each
        raise DBusFailure(
            names.ERROR_INVALID_ARGUMENT,
            f"at most {MAX_GPUS_WITH_SETTINGS} GPUs may have settings of their own, "
            f"got {len(value.value)}",
        )
    types = dict(names.GPU_SETTINGS_FIELDS)
    entries = []
    for gpu_id, fields in value.value.items():
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
            elif expected != "s" and item.signature in _INTEGER_TYPES:
                own[key] = item.value
            else:
                raise DBusFailure(
                    names.ERROR_INVALID_ARGUMENT,
                    f"GPU {excerpt(gpu_id)}: {key} must be of D-Bus type '{expected}', "
                    f"got type '{excerpt(item.signature)}'",
                )
        entries.append((gpu_id, GpuOverrides(**own)))
    return entries


# ---------------------------------------------------------------- who may change settings


def may_change_settings(uid: int, group_name: str = names.ADMIN_GROUP) -> bool:
    """Root, or a user whose user-database groups include the admin group:
    the same rule the policy file's <policy group=...> applies.  Blocking
    (NSS may ask LDAP): call it off the event loop."""
    if uid == 0:
        return True
    try:
        admin_gid = grp.getgrnam(group_name).gr_gid
        user = pwd.getpwuid(uid)
    except KeyError:
        return False
    return admin_gid in os.getgrouplist(user.pw_name, user.pw_gid)


# ---------------------------------------------------------------- the dispatcher


class DBusApi:
    """Serves the contract for the engine on one bus connection."""

    def __init__(
        self, bus: MessageBus, engine: Engine, contract: Contract, config_problem: str = ""
    ):
        self._bus = bus
        self._engine = engine
        self._contract = contract
        # Read once at start: the agent reads its config file only then.
        self._config_problem = config_problem
        self._pending: set[asyncio.Task] = set()  # strong refs: the loop keeps weak ones
        self._published = self._comparable(self._values())
        self._routes: dict[tuple[str, str], Callable[[Message], Message | None]] = {
            (_PROPERTIES, "Get"): self._get,
            (_PROPERTIES, "GetAll"): self._get_all,
            (_PROPERTIES, "Set"): self._start_set,
            (_INTROSPECTABLE, "Introspect"): self._introspect,
            (_PEER, "Ping"): lambda msg: Message.new_method_return(msg),
            (_PEER, "GetMachineId"): self._machine_id,
            (names.INTERFACE, names.METHOD_GET_GPU): self._get_gpu,
        }

    def handle(self, msg: Message):
        """dbus-next's message handler: every method call to the agent comes here."""
        if msg.message_type != MessageType.METHOD_CALL:
            return None
        route = self._routes.get((msg.interface or "", msg.member))
        try:
            if msg.interface == _PEER and route is not None:
                return route(msg)  # Peer answers on any path
            if msg.path != names.OBJECT_PATH:
                if (msg.interface, msg.member) == (_INTROSPECTABLE, "Introspect"):
                    return self._introspect_parent(msg)
                raise DBusFailure(
                    ErrorType.UNKNOWN_OBJECT.value, f"no object at path {excerpt(msg.path)}"
                )
            if route is None:
                raise DBusFailure(
                    ErrorType.UNKNOWN_METHOD.value,
                    f"{excerpt(msg.interface)} has no method {excerpt(msg.member)} "
                    f"with signature {excerpt(msg.signature)}",
                )
            self._check_signature(msg)
            reply = route(msg)
            return True if reply is None else reply
        except DBusFailure as failure:
            return Message.new_error(msg, failure.name, failure.text)

    def _check_signature(self, msg: Message) -> None:
        expected = {"Get": "ss", "GetAll": "s", "Set": "ssv"}.get(msg.member, "")
        if msg.interface == names.INTERFACE:
            expected = self._contract.methods[msg.member]
        if msg.signature != expected:
            raise DBusFailure(
                ErrorType.INVALID_ARGS.value,
                f"{msg.member} takes '{expected}', got '{excerpt(msg.signature)}'",
            )

    # ------------------------------------------------------------ properties

    def _values(self) -> dict:
        return property_values(self._engine, self._config_problem)

    def _property(self, interface: str, prop_name: str) -> tuple[str, str]:
        if interface == "":
            raise DBusFailure(
                ErrorType.NOT_SUPPORTED.value, "properties need an interface name; none was given"
            )
        if interface in _STANDARD:
            raise DBusFailure(
                ErrorType.UNKNOWN_PROPERTY.value,
                f"{interface} has no property {excerpt(prop_name)}",
            )
        if interface != names.INTERFACE:
            raise DBusFailure(
                ErrorType.UNKNOWN_INTERFACE.value,
                f"no interface {excerpt(interface)} at {names.OBJECT_PATH}",
            )
        found = self._contract.properties.get(prop_name)
        if found is None:
            raise DBusFailure(
                ErrorType.UNKNOWN_PROPERTY.value,
                f"{names.INTERFACE} has no property {excerpt(prop_name)}",
            )
        return found

    def _get(self, msg: Message) -> Message:
        interface, prop_name = msg.body
        dbus_type, _access = self._property(interface, prop_name)
        value = self._values()[prop_name]
        return Message.new_method_return(msg, "v", [Variant(dbus_type, value)])

    def _get_all(self, msg: Message) -> Message:
        (interface,) = msg.body
        if interface in _STANDARD:
            return Message.new_method_return(msg, "a{sv}", [{}])
        if interface != names.INTERFACE:
            self._property(interface, "")  # raises the error that fits
        values = self._values()
        props = self._contract.properties
        return Message.new_method_return(
            msg, "a{sv}", [{name: Variant(props[name][0], values[name]) for name in props}]
        )

    def _start_set(self, msg: Message) -> None:
        interface, prop_name, value = msg.body
        _dbus_type, access = self._property(interface, prop_name)
        if access != "readwrite":
            raise DBusFailure(
                ErrorType.PROPERTY_READ_ONLY.value, f"{prop_name} is read-only live state"
            )
        task = asyncio.ensure_future(self._set(msg, prop_name, value))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _set(self, msg: Message, prop_name: str, value: Variant) -> None:
        try:
            uid = await self._caller_uid(msg.sender)
            if not await self.caller_may_change(uid):
                raise DBusFailure(
                    names.ERROR_ACCESS_DENIED,
                    f"changing nvshare settings needs root or group {names.ADMIN_GROUP} "
                    f"(caller uid {uid})",
                )
            # The value is looked at only for those who may change it.
            change = _setting_change(prop_name, value)
            try:
                await self._engine.change_settings(**change)
            except SettingsNotSaved as error:
                raise DBusFailure(names.ERROR_SAVE_FAILED, str(error)) from None
            except ValueError as error:  # SettingsError: str() is the human sentence
                raise DBusFailure(names.ERROR_INVALID_ARGUMENT, str(error)) from None
            reply = Message.new_method_return(msg)
            log.info("dbus set %s=%s uid=%d", prop_name, excerpt(plain(value.value), 400), uid)
        except DBusFailure as failure:
            reply = Message.new_error(msg, failure.name, failure.text)
        except Exception as error:
            if not self._bus.connected:
                # Stopping, or the bus went away, while we asked who calls:
                # nothing changed, and the bus tells the caller NoReply.
                log.info("dbus set %s dropped: the bus connection closed", excerpt(prop_name))
                return
            # A bug must not leave the caller hanging.
            log.exception("dbus set %s failed", excerpt(prop_name))
            reply = Message.new_error(msg, names.ERROR_FAILED, f"internal error: {error}")
        if self._bus.connected:
            self._bus.send(reply)

    async def caller_may_change(self, uid: int) -> bool:
        """The one permission check for every change (off the loop: NSS may block)."""
        return await asyncio.get_running_loop().run_in_executor(None, may_change_settings, uid)

    async def _caller_uid(self, sender: str) -> int:
        reply = await self._bus.call(
            Message(
                destination="org.freedesktop.DBus",
                path="/org/freedesktop/DBus",
                interface="org.freedesktop.DBus",
                member="GetConnectionUnixUser",
                signature="s",
                body=[sender],
            )
        )
        if reply is None or reply.message_type != MessageType.METHOD_RETURN:
            detail = reply.body if reply is not None else "no reply"
            raise DBusFailure(names.ERROR_ACCESS_DENIED, f"could not identify the caller: {detail}")
        return reply.body[0]

    # ------------------------------------------------------------ methods and introspection

    def _get_gpu(self, msg: Message) -> Message:
        (uuid,) = msg.body
        gpus = self._engine.snapshot().gpus
        for gpu in gpus:
            if gpu.uuid == uuid:
                return Message.new_method_return(msg, names.GPU_SIGNATURE, [gpu_to_dbus(gpu)])
        known = ", ".join(gpu.uuid for gpu in gpus[:_KNOWN_GPUS_SHOWN]) or "none"
        if len(gpus) > _KNOWN_GPUS_SHOWN:
            known += f" and {len(gpus) - _KNOWN_GPUS_SHOWN} more"
        raise DBusFailure(
            names.ERROR_UNKNOWN_GPU,
            f"no GPU with UUID {excerpt(uuid)} on this node (known: {known})",
        )

    def _introspect(self, msg: Message) -> Message:
        xml = f"<node>{_STANDARD_XML}\n  {self._contract.xml}\n</node>\n"
        return Message.new_method_return(msg, "s", [xml])

    def _introspect_parent(self, msg: Message) -> Message:
        """The nodes above our object, so tools that walk the tree from / find it."""
        path = msg.path.rstrip("/") or ""
        if not names.OBJECT_PATH.startswith(path + "/"):
            raise DBusFailure(
                ErrorType.UNKNOWN_OBJECT.value, f"no object at path {excerpt(msg.path)}"
            )
        child = names.OBJECT_PATH[len(path) + 1 :].split("/")[0]
        xml = f'<node>{_STANDARD_XML}\n  <node name="{child}"/>\n</node>\n'
        return Message.new_method_return(msg, "s", [xml])

    def _machine_id(self, msg: Message) -> Message:
        try:
            return Message.new_method_return(msg, "s", [read_machine_id()])
        except OSError as error:
            raise DBusFailure(ErrorType.FAILED.value, f"no machine id: {error}") from None

    # ------------------------------------------------------------ PropertiesChanged

    @staticmethod
    def _comparable(values: dict) -> dict:
        # Holding time grows on every read; comparing it would make every snapshot
        # look like a change.  PropertiesChanged reports state changes.
        clients = values[names.PROP_CLIENTS]
        values[names.PROP_CLIENTS] = [[*c[:4], [e[:3] for e in c[4]]] for c in clients]
        return values

    def publish_changes(self) -> None:
        """The engine's subscriber (coalesced there): one PropertiesChanged for what changed."""
        if not self._bus.connected:
            return
        values = self._values()
        comparable = self._comparable(dict(values))
        silent = self._contract.silent
        changed = [n for n in values if n not in silent and comparable[n] != self._published.get(n)]
        self._published = comparable
        if not changed:
            return
        props = self._contract.properties
        # One value the bus cannot carry (a Variant checks it here) must not hold
        # back the others.
        variants = {}
        for name in changed:
            try:
                variants[name] = Variant(props[name][0], values[name])
            except Exception as error:
                log.warning("dbus PropertiesChanged %s not sent: %s", name, error)
        if variants:
            try:
                self._send_changed(variants)
            except Exception as error:
                log.warning("dbus PropertiesChanged not sent: %s", error)

    def _send_changed(self, variants: dict) -> None:
        self._bus.send(
            Message.new_signal(
                names.OBJECT_PATH,
                _PROPERTIES,
                "PropertiesChanged",
                "sa{sv}as",
                [names.INTERFACE, variants, []],
            )
        )


# ---------------------------------------------------------------- staying on the bus


async def _publish(
    engine: Engine, address: str, contract: Contract, config_problem: str
) -> tuple[MessageBus, DBusApi]:
    bus = await connect_bus(address, timeout_s=10)
    try:
        api = DBusApi(bus, engine, contract, config_problem)
        from .dbus_shares import SharesApi  # a second interface, ahead of this one's handler

        bus.add_message_handler(SharesApi(bus, engine, api).handle)
        bus.add_message_handler(api.handle)
        reply = await bus.request_name(names.BUS_NAME)
    except BaseException:
        bus.disconnect()
        raise
    if reply == RequestNameReply.IN_QUEUE:
        log.warning("dbus name=%s is owned by another process; queued for it", names.BUS_NAME)
    return bus, api


async def export_on_bus(
    engine: Engine,
    address: str = "system",
    *,
    first_retry_s: float = 0.5,
    max_retry_s: float = 30.0,
    config_problem: str = "",
) -> None:
    """Serve the API on the bus at `address` ("system" or a D-Bus address) until
    cancelled.  When the bus is missing or goes away, retry with exponential
    backoff; the agent keeps serving the shims meanwhile."""
    contract = load_contract()
    current: list[DBusApi] = []  # the API of the connection we have, if any

    def publish() -> None:
        for api in current:
            api.publish_changes()

    unsubscribe = engine.subscribe(publish)
    retry_s, failures = first_retry_s, 0
    try:
        while True:
            bus = None
            try:
                bus, api = await _publish(engine, address, contract, config_problem)
                current[:] = [api]
                log.info("dbus connected address=%s name=%s", address, names.BUS_NAME)
                retry_s, failures = first_retry_s, 0
                try:
                    await bus.wait_for_disconnect()
                    reason = "disconnected"
                except Exception as error:
                    reason = str(error) or type(error).__name__
                log.warning("dbus lost address=%s reason=%s", address, reason)
            except asyncio.CancelledError:
                if bus is not None and bus.connected:
                    bus.disconnect()
                raise
            except Exception as error:
                failures += 1
                # Once per outage at warning level; the retries after it at debug.
                level = logging.WARNING if failures == 1 else logging.DEBUG
                log.log(
                    level,
                    "dbus unavailable address=%s error=%s retry_in_s=%.1f",
                    address,
                    str(error) or type(error).__name__,
                    retry_s,
                )
            finally:
                current.clear()
            await asyncio.sleep(retry_s)
            retry_s = min(retry_s * 2, max_retry_s)
    finally:
        unsubscribe()
