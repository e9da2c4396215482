"""The D-Bus adapter: the engine's settings and state as io.github.nvshare.Scheduler1.

The contract is the checked-in interface XML beside this file (read by
dbus_contract.py): its property names, types and access are what calls are
checked against, and Introspect serves it as it is.  Each property is a row of
dbus_properties.py's table: how it is read, and for a setting how a Set's value
becomes a settings change.  dbus-next only carries messages: one dispatcher here
(DBusApi.handle) answers every method call that reaches the agent, so each
call takes one path, which ARCHITECTURE.md walks through for a Set:

    handle -> _start_set -> _set -> caller_may_change (the one permission check)
    -> Setting.change (dbus_properties.py) -> Engine.change_settings -> ...
    -> ChangeNotifier._notify (timers.py) -> publish_changes
    -> PropertiesChangedEmitter.publish (dbus_changes.py, PropertiesChanged)

The permission check repeats the policy file's rule on purpose: a permissive
or broken policy must not turn into anyone-may-set.

Adding a method is a row of DBusApi.METHODS, its handler and its XML; a method
that changes something goes through caller_may_change as _set does.  Staying
on the bus (connect, own the name, reconnect) is dbus_service.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import logging
import os
import pwd
from collections.abc import Callable, Iterator
from typing import ClassVar

from dbus_next import Message, MessageType, Variant
from dbus_next.aio import MessageBus
from dbus_next.constants import ErrorType

from . import dbus_names as names
from .dbus_changes import PropertiesChangedEmitter
from .dbus_connection import plain, read_machine_id
from .dbus_contract import (
    CONTRACT_FILE,
    INTROSPECTABLE_INTERFACE,
    PEER_INTERFACE,
    PROPERTIES_INTERFACE,
    STANDARD_INTERFACES,
    STANDARD_XML,
    Contract,
    ContractMismatch,
    DBusFailure,
)
from .dbus_properties import (
    SETTINGS,
    check_properties,
    gpu_to_dbus,
    property_values,
    value_sources_to_dbus,
)
from .engine import Engine
from .identity import uid_of
from .settings import SettingsNotSaved
from .settings_sources import pin_address
from .text import excerpt

log = logging.getLogger(__name__)


def check_contract(contract: Contract) -> None:
    """The agent serves exactly the contract's properties (dbus_properties.py) and
    methods (DBusApi.METHODS); ContractMismatch, a sentence naming each
    difference, otherwise: a bug, said before anything is served."""
    check_properties(contract)
    only_xml = [m for m in contract.methods if m not in DBusApi.METHODS]
    only_code = [m for m in DBusApi.METHODS if m not in contract.methods]
    problems = []
    if only_xml:
        problems.append(f"in {CONTRACT_FILE} but not served: {', '.join(only_xml)}")
    if only_code:
        problems.append(f"served but not in {CONTRACT_FILE}: {', '.join(only_code)}")
    if problems:
        raise ContractMismatch(
            "the agent's D-Bus methods and the contract disagree: " + "; ".join(problems)
        )


# Clients may report GPUs of their own: an error lists a few, not all.
_KNOWN_GPUS_SHOWN = 8


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


@contextlib.contextmanager
def settings_refusals() -> Iterator[None]:
    """A change the engine refuses, as the named D-Bus error that says why."""
    try:
        yield
    except SettingsNotSaved as error:
        raise DBusFailure(names.ERROR_SAVE_FAILED, str(error)) from None
    except ValueError as error:  # SettingsError: str() is the human sentence
        raise DBusFailure(names.ERROR_INVALID_ARGUMENT, str(error)) from None


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
        self._changes = PropertiesChangedEmitter(
            bus,
            contract,
            self._values,
            {
                names.PROP_CLIENTS: _clients_less_held_seconds,
                names.PROP_CLIENT_DETAILS: _details_less_moving_figures,
            },
        )
        self._routes: dict[tuple[str, str], Callable[[Message], Message | None]] = {
            (PROPERTIES_INTERFACE, "Get"): self._get,
            (PROPERTIES_INTERFACE, "GetAll"): self._get_all,
            (PROPERTIES_INTERFACE, "Set"): self._start_set,
            (INTROSPECTABLE_INTERFACE, "Introspect"): self._introspect,
            (PEER_INTERFACE, "Ping"): lambda msg: Message.new_method_return(msg),
            (PEER_INTERFACE, "GetMachineId"): self._machine_id,
        }
        for member, handler in self.METHODS.items():
            self._routes[(names.INTERFACE, member)] = handler.__get__(self)

    def handle(self, msg: Message):
        """dbus-next's message handler: every method call to the agent comes here."""
        if msg.message_type != MessageType.METHOD_CALL:
            return None
        route = self._routes.get((msg.interface or "", msg.member))
        try:
            if msg.interface == PEER_INTERFACE and route is not None:
                return route(msg)  # Peer answers on any path
            if msg.path != names.OBJECT_PATH:
                if (msg.interface, msg.member) == (INTROSPECTABLE_INTERFACE, "Introspect"):
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
        if interface in STANDARD_INTERFACES:
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
        if interface in STANDARD_INTERFACES:
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
        dbus_type, access = self._property(interface, prop_name)
        if access != "readwrite":
            raise DBusFailure(
                ErrorType.PROPERTY_READ_ONLY.value, f"{prop_name} is read-only live state"
            )
        task = asyncio.ensure_future(self._set(msg, prop_name, dbus_type, value))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _set(self, msg: Message, prop_name: str, dbus_type: str, value: Variant) -> None:
        try:
            uid = await self.permitted_caller(msg, "nvshare settings")
            # The value is looked at only for those who may change it.
            change = SETTINGS[prop_name].change(dbus_type, value)
            with settings_refusals():
                await self._engine.change_settings(**change)
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

    async def permitted_caller(self, msg: Message, what: str) -> int:
        """The caller's uid, once the one permission check lets it change `what`."""
        uid = await self._caller_uid(msg.sender)
        if not await self.caller_may_change(uid):
            raise DBusFailure(
                names.ERROR_ACCESS_DENIED,
                f"changing {what} needs root or group {names.ADMIN_GROUP} (caller uid {uid})",
            )
        return uid

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

    def _get_settings(self, msg: Message) -> Message:
        rows = value_sources_to_dbus(self._engine.value_sources())
        return Message.new_method_return(msg, "aa{sv}", [rows])

    def _start_reset(self, msg: Message) -> None:
        task = asyncio.ensure_future(self._reset(msg))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _reset(self, msg: Message) -> None:
        """ResetSetting: who calls, may they, which setting (a user's name is looked up
        off the loop), then the engine takes the run-time change back."""
        section, key = msg.body
        try:
            uid = await self.permitted_caller(msg, "nvshare settings")
            loop = asyncio.get_running_loop()
            with settings_refusals():
                where = await loop.run_in_executor(None, pin_address, section, key, uid_of)
                await self._engine.reset_setting(*where)
            reply = Message.new_method_return(msg)
            log.info("dbus reset [%s] %s uid=%d", excerpt(section), excerpt(key), uid)
        except DBusFailure as failure:
            reply = Message.new_error(msg, failure.name, failure.text)
        except Exception as error:
            if not self._bus.connected:
                return  # stopping: nothing changed, the bus tells the caller NoReply
            log.exception("dbus reset failed")
            reply = Message.new_error(msg, names.ERROR_FAILED, f"internal error: {error}")
        if self._bus.connected:
            self._bus.send(reply)

    # The interface's own methods, one row each (and its line in the XML;
    # check_contract refuses to serve when the two disagree).
    METHODS: ClassVar[dict[str, Callable[[DBusApi, Message], Message | None]]] = {
        names.METHOD_GET_GPU: _get_gpu,
        names.METHOD_GET_SETTINGS: _get_settings,
        names.METHOD_RESET_SETTING: _start_reset,
    }

    def _introspect(self, msg: Message) -> Message:
        xml = f"<node>{STANDARD_XML}\n  {self._contract.xml}\n</node>\n"
        return Message.new_method_return(msg, "s", [xml])

    def _introspect_parent(self, msg: Message) -> Message:
        """The nodes above our object, so tools that walk the tree from / find it."""
        path = msg.path.rstrip("/") or ""
        if not names.OBJECT_PATH.startswith(path + "/"):
            raise DBusFailure(
                ErrorType.UNKNOWN_OBJECT.value, f"no object at path {excerpt(msg.path)}"
            )
        child = names.OBJECT_PATH[len(path) + 1 :].split("/")[0]
        xml = f'<node>{STANDARD_XML}\n  <node name="{child}"/>\n</node>\n'
        return Message.new_method_return(msg, "s", [xml])

    def _machine_id(self, msg: Message) -> Message:
        try:
            return Message.new_method_return(msg, "s", [read_machine_id()])
        except OSError as error:
            raise DBusFailure(ErrorType.FAILED.value, f"no machine id: {error}") from None

    # ------------------------------------------------------------ PropertiesChanged

    def publish_changes(self) -> None:
        """The engine's subscriber (coalesced there): one PropertiesChanged for what changed
        (dbus_changes.py, the rule both interfaces emit by)."""
        self._changes.publish()


def _clients_less_held_seconds(clients: list) -> list:
    # Holding time grows on every read; comparing it would make every snapshot
    # look like a change.  PropertiesChanged reports state changes.
    return [[*c[:4], [e[:3] for e in c[4]]] for c in clients]


def _details_less_moving_figures(details: dict) -> dict:
    # GPU time, recent use and time waited move on every read; why a client
    # waits is a change of state, and stays.
    return {
        pid: {
            key: (
                {uuid: gpu["wait_cause"].value for uuid, gpu in item.value.items()}
                if key == names.CLIENT_PER_GPU_KEY
                else item
            )
            for key, item in fields.items()
        }
        for pid, fields in details.items()
    }
