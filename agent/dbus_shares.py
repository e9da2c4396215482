"""The share groups' D-Bus surface: interface io.github.nvshare.Shares1 on the
agent's object (agent/io.github.nvshare.Shares1.xml, docs/control.md "Shares").

A second interface beside Scheduler1, served by its own handler ahead of
dbus_api's: the settings (ShareBy, Shares) and the live figures (Groups) as
properties; SetShare and ResetShare as methods, since a share is one entry of a
table, not one value.  Who may change them is dbus_api's one permission check
(DBusApi.caller_may_change); the change goes through Engine.change_settings,
which validates, saves and applies it like any other setting.  Its contract is
the XML (types, signatures, what emits), read by dbus_contract.py and checked
against what this module serves at start (check_shares_contract); its
PropertiesChanged come from dbus_changes.py, by the rule Scheduler1's do.
"""

from __future__ import annotations

import asyncio

from dbus_next import Message, MessageType, Variant
from dbus_next.constants import ErrorType

from . import dbus_names as names
from .dbus_api import DBusApi, settings_refusals
from .dbus_changes import PropertiesChangedEmitter
from .dbus_connection import plain
from .dbus_contract import Contract, ContractMismatch, DBusFailure
from .engine import Engine
from .eventlog import events as log
from .identity import uid_of
from .settings import (
    Settings,
    SettingsError,
    Share,
    parse_share_by,
    parse_share_group,
)
from .snapshot import ShareGroupSnapshot
from .text import excerpt

INTERFACE = names.SHARES_INTERFACE
_PROPERTIES = "org.freedesktop.DBus.Properties"
_INTROSPECTABLE = "org.freedesktop.DBus.Introspectable"
_FIELD_TYPES = {"weight": "u", "memory_cap_bytes": "t"}
# What this module serves; the types, access and signatures are the contract's.
PROPERTIES = ("ShareBy", "Shares", "Groups")  # share_values' keys, GetAll's order
SETTINGS = ("ShareBy",)  # the writable ones
METHODS = ("SetShare", "ResetShare")


def check_shares_contract(contract: Contract) -> None:
    """This module serves exactly Shares1's contract; ContractMismatch, a sentence
    naming each difference, otherwise: a bug, said before anything is served."""
    problems = []
    for what, served, in_xml in (
        ("properties", PROPERTIES, tuple(contract.properties)),
        ("methods", METHODS, tuple(contract.methods)),
        (
            "writable properties",
            SETTINGS,
            tuple(n for n, (_t, access) in contract.properties.items() if access == "readwrite"),
        ),
    ):
        if sorted(served) != sorted(in_xml):
            problems.append(f"{what}: served {', '.join(served)}; in the XML {', '.join(in_xml)}")
    if problems:
        raise ContractMismatch(
            f"agent/dbus_shares.py and {INTERFACE}.xml disagree: " + "; ".join(problems)
        )


def _groups_less_moving_figures(groups: list) -> list:
    # A group's use, share, GPU time and waits move with time and while its clients
    # hold or wait: compared, every read would be a change (as a client's seconds
    # held, dbus_api.py).  Groups changes when a group comes or goes, or its
    # weight, cap or number of clients does.
    moving = names.GROUP_MOVING_FIELDS
    return [{k: v for k, v in g.items() if k not in moving} for g in groups]


def group_to_dbus(group: ShareGroupSnapshot) -> dict:
    """One entry of Groups: the snapshot's figures under dbus_names.GROUP_FIELDS."""
    entry = {}
    for key, dbus_type in names.GROUP_FIELDS:
        value = getattr(group, key)
        entry[key] = Variant(dbus_type, dict(value) if dbus_type == "a{sd}" else value)
    return entry


def share_values(engine: Engine) -> dict:
    settings = engine.settings
    groups = [group_to_dbus(g) for g in engine.snapshot().groups]
    shares = {
        group: {name: Variant(_FIELD_TYPES[name], value) for name, value in share.given().items()}
        for group, share in settings.shares
    }
    return {"ShareBy": settings.share_by.value, "Shares": shares, "Groups": groups}


class SharesApi:
    """Serves Shares1; every other call falls through to dbus_api's handler."""

    def __init__(self, bus, engine: Engine, api: DBusApi, contract: Contract):
        self._bus, self._engine, self._api = bus, engine, api
        self._contract = contract
        self._pending: set[asyncio.Task] = set()
        self._changes = PropertiesChangedEmitter(
            bus,
            contract,
            lambda: share_values(engine),
            {"Groups": _groups_less_moving_figures},
        )

    def publish_changes(self) -> None:
        """The engine's subscriber, beside DBusApi.publish_changes: one
        PropertiesChanged on Shares1 for what changed (dbus_changes.py)."""
        self._changes.publish()

    def handle(self, msg: Message):
        if msg.message_type != MessageType.METHOD_CALL or msg.path != names.OBJECT_PATH:
            return None
        try:
            if (msg.interface, msg.member, msg.signature) == (_INTROSPECTABLE, "Introspect", ""):
                return self._introspect(msg)
            if msg.interface == _PROPERTIES and msg.body and msg.body[0] == INTERFACE:
                return self._property_call(msg)
            if msg.interface != INTERFACE:
                return None
            expected = self._contract.methods.get(msg.member)
            if expected is None:
                raise DBusFailure(
                    ErrorType.UNKNOWN_METHOD.value,
                    f"{INTERFACE} has no method {excerpt(msg.member)}",
                )
            if msg.signature != expected:
                raise DBusFailure(
                    ErrorType.INVALID_ARGS.value,
                    f"{msg.member} takes '{expected}', got '{excerpt(msg.signature)}'",
                )
            self._start(msg, self._change_of(msg))
            return True
        except DBusFailure as failure:
            return Message.new_error(msg, failure.name, failure.text)

    def _introspect(self, msg: Message) -> Message:
        """Scheduler1's introspection (dbus_api's), with this interface in it."""
        reply = self._api._introspect(msg)
        (xml,) = reply.body
        at = xml.rindex("</node>")
        return Message.new_method_return(
            msg, "s", [f"{xml[:at]}  {self._contract.xml}\n{xml[at:]}"]
        )

    def _property_call(self, msg: Message):
        values = share_values(self._engine)
        types = {
            name: dbus_type for name, (dbus_type, _access) in self._contract.properties.items()
        }
        if msg.member == "GetAll" and msg.signature == "s":
            props = {n: Variant(types[n], v) for n, v in values.items()}
            return Message.new_method_return(msg, "a{sv}", [props])
        if msg.member == "Get" and msg.signature == "ss":
            name = msg.body[1]
            if name not in values:
                raise DBusFailure(
                    ErrorType.UNKNOWN_PROPERTY.value, f"{INTERFACE} has no property {excerpt(name)}"
                )
            return Message.new_method_return(msg, "v", [Variant(types[name], values[name])])
        if msg.member == "Set" and msg.signature == "ssv":
            name, value = msg.body[1], msg.body[2]
            if name not in SETTINGS:
                raise DBusFailure(
                    ErrorType.PROPERTY_READ_ONLY.value, f"{excerpt(name)} is not a writable setting"
                )
            self._start(msg, lambda: {"share_by": _share_by_of(value)})
            return True
        return None  # dbus_api answers what is malformed

    def _change_of(self, msg: Message):
        if msg.member == "ResetShare":
            (text,) = msg.body
            return lambda: self._with_share(text, None)
        text, fields = msg.body
        return lambda: self._with_share(text, _share_of(fields))

    def _with_share(self, text: str, share: Share | None):
        """In an executor (a user name's lookup may block): the group, and how to merge
        the change into the shares as they are when it is applied (engine's lock)."""
        try:
            group = parse_share_group(text, uid_of)
        except SettingsError as e:
            raise DBusFailure(names.ERROR_INVALID_ARGUMENT, str(e)) from None

        def merged(current: Settings) -> dict:
            entries = dict(current.shares)
            if share is None:
                entries.pop(group, None)
            else:
                given = {**entries.get(group, Share()).given(), **share.given()}
                entries[group] = Share(**given)
            return {"shares": tuple(sorted((g, s) for g, s in entries.items() if s.given()))}

        return merged

    def _start(self, msg: Message, change) -> None:
        task = asyncio.ensure_future(self._change(msg, change))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _change(self, msg: Message, change) -> None:
        try:
            uid = await self._api.permitted_caller(msg, "nvshare's shares")
            changes = await asyncio.get_running_loop().run_in_executor(None, change)
            with settings_refusals():
                if callable(changes):  # a share: merged under the engine's lock
                    await self._engine.change_settings_from(changes)
                else:
                    await self._engine.change_settings(**changes)
            reply = Message.new_method_return(msg)
            log.info("dbus %s %s uid=%d", msg.member, excerpt(plain(msg.body), 400), uid)
        except DBusFailure as failure:
            reply = Message.new_error(msg, failure.name, failure.text)
        except Exception as error:
            log.error("dbus %s failed: %s", excerpt(msg.member), excerpt(repr(error), 400))
            reply = Message.new_error(msg, names.ERROR_FAILED, f"internal error: {error}")
        if self._bus.connected:
            self._bus.send(reply)


def _share_by_of(value: Variant) -> object:
    if value.signature != "s":
        raise DBusFailure(
            names.ERROR_INVALID_ARGUMENT,
            f"ShareBy must be of D-Bus type 's', got type '{excerpt(value.signature)}'",
        )
    try:
        return parse_share_by(value.value)
    except SettingsError as e:
        raise DBusFailure(names.ERROR_INVALID_ARGUMENT, str(e)) from None


def _share_of(fields: dict) -> Share:
    own = {}
    for key, item in fields.items():
        expected = _FIELD_TYPES.get(key)
        if expected is None:
            raise DBusFailure(
                names.ERROR_INVALID_ARGUMENT,
                f"a share has weight (u) and memory_cap_bytes (t), got {excerpt(key)}",
            )
        if item.signature != expected:
            raise DBusFailure(
                names.ERROR_INVALID_ARGUMENT,
                f"{key} must be of D-Bus type '{expected}', got type '{excerpt(item.signature)}'",
            )
        own[key] = item.value
    if not own:
        raise DBusFailure(names.ERROR_INVALID_ARGUMENT, "SetShare needs weight or memory_cap_bytes")
    return Share(**own)
