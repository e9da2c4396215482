"""D-Bus adapter: publishes the agent's facade (`nvshare_agent.daemon.Agent`)
on a bus with dbus-next.  Transport only: settings are validated by the agent,
state comes from `agent.snapshot()`, and change notifications from
`agent.subscribe()`.

Settings are read-write properties; writes go through `CallGate`, which
sees the calling connection (dbus-next does not hand the message to property
setters) and checks the caller's uid with the bus daemon before anything
changes.  That check repeats the policy file's rule on purpose: a permissive or
broken policy must not turn into anyone-may-set.
"""

import asyncio
import grp
import logging
import os
import pwd

from dbus_next import DBusError, Message, MessageType, Variant
from dbus_next.aio import MessageBus
from dbus_next.constants import ErrorType, RequestNameReply
from dbus_next.service import PropertyAccess, ServiceInterface, dbus_property, method

from . import dbus_names as names
from .dbus_connection import connect_bus
from .settings import SettingsNotSaved
from .text import excerpt

log = logging.getLogger(__name__)

_INTEGER_TYPES = frozenset("ynqiuxt")
# One number outside its D-Bus type fails the whole message, every client's
# view with it: the last line of defence clamps instead.
_UNSIGNED_MAX = {"u": 2**32 - 1, "t": 2**64 - 1}
_PROPERTIES_INTERFACE = "org.freedesktop.DBus.Properties"
# Clients may report GPUs of their own: an error lists a few, not all.
_KNOWN_GPUS_SHOWN = 8


def may_change_settings(uid: int, group_name: str = names.ADMIN_GROUP) -> bool:
    """Root, or a user whose user-database groups include the admin group:
    the same rule the policy file's <policy group=...> applies."""
    if uid == 0:
        return True
    try:
        admin_gid = grp.getgrnam(group_name).gr_gid
        user = pwd.getpwuid(uid)
    except KeyError:
        return False
    return admin_gid in os.getgrouplist(user.pw_name, user.pw_gid)


def gpus_to_dbus(snapshot) -> list:
    return [gpu_to_dbus(gpu) for gpu in snapshot.gpus]


def gpu_to_dbus(gpu) -> list:
    return _struct_of(gpu, names.GPU_FIELDS)


def clients_to_dbus(snapshot) -> list:
    return [_struct_of(client, names.CLIENT_FIELDS) for client in snapshot.clients]


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


def _in_range(value, dbus_type):
    maximum = _UNSIGNED_MAX.get(dbus_type)
    return value if maximum is None else min(max(value, 0), maximum)


def _without_holding_time(clients: list) -> list:
    # Holding time grows on every read; comparing it would make every snapshot
    # look like a change.  PropertiesChanged reports state changes.
    return [[*client[:4], [entry[:3] for entry in client[4]]] for client in clients]


class SchedulerInterface(ServiceInterface):
    """io.github.nvshare.Scheduler1 on /io/github/nvshare/Scheduler1."""

    def __init__(self, agent):
        super().__init__(names.INTERFACE)
        self._agent = agent
        self._last_published = self._current_values()
        self._emit_pending = False

    # Settings.  Setters exist so introspection says "readwrite"; real writes
    # are routed through CallGate to apply(), which knows who is calling.

    @dbus_property(name=names.PROP_TIME_QUANTUM)
    def time_quantum(self) -> "u":
        return self._agent.settings.time_quantum_s

    @time_quantum.setter
    def time_quantum(self, value: "u"):
        raise _gate_bypassed()

    @dbus_property(name=names.PROP_ANTI_THRASH)
    def anti_thrash(self) -> "b":
        return self._agent.settings.anti_thrash

    @anti_thrash.setter
    def anti_thrash(self, value: "b"):
        raise _gate_bypassed()

    # Live state.

    @dbus_property(name=names.PROP_GPUS, access=PropertyAccess.READ)
    def gpus(self) -> names.GPUS_SIGNATURE:
        return gpus_to_dbus(self._agent.snapshot())

    @dbus_property(name=names.PROP_CLIENTS, access=PropertyAccess.READ)
    def clients(self) -> names.CLIENTS_SIGNATURE:
        return clients_to_dbus(self._agent.snapshot())

    @method(name=names.METHOD_GET_GPU)
    def get_gpu(self, uuid: "s") -> names.GPU_SIGNATURE:
        # Declared for introspection; CallGate serves the calls (via find_gpu),
        # since dbus-next's @method wrapper drops the return value when called.
        return self.find_gpu(uuid)

    def find_gpu(self, uuid: str) -> list:
        gpus = self._agent.snapshot().gpus
        for gpu in gpus:
            if gpu.uuid == uuid:
                return gpu_to_dbus(gpu)
        known = ", ".join(gpu.uuid for gpu in gpus[:_KNOWN_GPUS_SHOWN]) or "none"
        if len(gpus) > _KNOWN_GPUS_SHOWN:
            known += f" and {len(gpus) - _KNOWN_GPUS_SHOWN} more"
        raise DBusError(
            names.ERROR_UNKNOWN_GPU,
            f"no GPU with UUID {excerpt(uuid)} on this node (known: {known})",
        )

    def apply(self, prop_name: str, value: Variant) -> None:
        """Change one setting for an already authorised caller."""
        if prop_name == names.PROP_TIME_QUANTUM:
            if value.signature not in _INTEGER_TYPES:
                raise DBusError(
                    names.ERROR_INVALID_ARGUMENT,
                    f"time quantum must be a whole number of seconds (D-Bus type 'u'), "
                    f"got type '{value.signature}'",
                )
            self._change(time_quantum_s=value.value)
        elif prop_name == names.PROP_ANTI_THRASH:
            if value.signature != "b":
                raise DBusError(
                    names.ERROR_INVALID_ARGUMENT,
                    f"anti-thrash must be on or off (D-Bus type 'b'), "
                    f"got {excerpt(value.value)} of type '{value.signature}'",
                )
            self._change(anti_thrash=value.value)
        elif prop_name in (names.PROP_GPUS, names.PROP_CLIENTS):
            raise DBusError(ErrorType.PROPERTY_READ_ONLY, f"{prop_name} is read-only live state")
        else:
            raise DBusError(
                ErrorType.UNKNOWN_PROPERTY,
                f"{names.INTERFACE} has no property {excerpt(prop_name)}",
            )

    def _change(self, **setting) -> None:
        try:
            self._agent.change_settings(**setting)
        except ValueError as error:  # SettingsError: str() is the human sentence
            raise DBusError(names.ERROR_INVALID_ARGUMENT, str(error)) from None
        except SettingsNotSaved as error:
            raise DBusError(names.ERROR_SAVE_FAILED, str(error)) from None

    # PropertiesChanged.

    def on_agent_changed(self) -> None:
        """Subscriber of the facade; coalesces a burst of changes into one signal."""
        if not self._emit_pending:
            self._emit_pending = True
            asyncio.get_running_loop().call_soon(self._emit_changes)

    def _emit_changes(self) -> None:
        self._emit_pending = False
        values = self._current_values()
        changed = {
            name: value
            for name, value in values.items()
            if _comparable(name, value) != _comparable(name, self._last_published[name])
        }
        self._last_published = values
        if not changed:
            return
        try:
            self.emit_properties_changed(changed)
            return
        except Exception:
            pass  # not the bus going away: dbus-next unexports us then, and emits nothing
        # One value the bus cannot carry must not hold back the others.
        for name, value in changed.items():
            try:
                self.emit_properties_changed({name: value})
            except Exception as error:
                log.warning("dbus PropertiesChanged %s not sent: %s", name, error)

    def _current_values(self) -> dict:
        settings, snapshot = self._agent.settings, self._agent.snapshot()
        return {
            names.PROP_TIME_QUANTUM: settings.time_quantum_s,
            names.PROP_ANTI_THRASH: settings.anti_thrash,
            names.PROP_GPUS: gpus_to_dbus(snapshot),
            names.PROP_CLIENTS: clients_to_dbus(snapshot),
        }


def _comparable(prop_name, value):
    return _without_holding_time(value) if prop_name == names.PROP_CLIENTS else value


def _gate_bypassed() -> DBusError:
    return DBusError(
        names.ERROR_ACCESS_DENIED, "settings can only be changed through the checked path"
    )


class CallGate:
    """Bus message handler, run before dbus-next's own dispatch, for the calls
    that dispatch cannot serve as we need:
    - every Properties.Set on our interface: it needs the sender, to ask the
      bus daemon for the caller's uid before anything changes;
    - our methods: dbus-next 0.2.3 logs a traceback for every DBusError a
      method raises, and a bad UUID is a normal answer, not a crash."""

    def __init__(self, bus: MessageBus, interface: SchedulerInterface):
        self._bus = bus
        self._interface = interface
        self._pending = set()  # strong refs: the loop keeps only weak ones to tasks

    def __call__(self, msg: Message):
        if msg.message_type != MessageType.METHOD_CALL or msg.path != names.OBJECT_PATH:
            return None
        if (
            msg.interface == _PROPERTIES_INTERFACE
            and msg.member == "Set"
            and msg.signature == "ssv"
            and msg.body[0] == names.INTERFACE
        ):
            task = asyncio.ensure_future(self._set(msg))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
            return True
        if (
            msg.interface == names.INTERFACE
            and msg.member == names.METHOD_GET_GPU
            and msg.signature == "s"
        ):
            try:
                return Message.new_method_return(
                    msg, names.GPU_SIGNATURE, [self._interface.find_gpu(msg.body[0])]
                )
            except DBusError as error:
                return Message.new_error(msg, error.type, error.text)
        return None

    async def _set(self, msg: Message) -> None:
        _, prop_name, value = msg.body
        try:
            uid = await self._caller_uid(msg.sender)
            if not may_change_settings(uid):
                raise DBusError(
                    names.ERROR_ACCESS_DENIED,
                    f"changing nvshare settings needs root or group {names.ADMIN_GROUP} "
                    f"(caller uid {uid})",
                )
            self._interface.apply(prop_name, value)
            reply = Message.new_method_return(msg)
            log.info("dbus set %s=%r uid=%d", prop_name, value.value, uid)
        except DBusError as error:
            reply = Message.new_error(msg, error.type, error.text)
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
        if reply.message_type != MessageType.METHOD_RETURN:
            raise DBusError(
                names.ERROR_ACCESS_DENIED, f"could not identify the caller: {reply.body}"
            )
        return reply.body[0]


async def _publish(agent, address: str, subscribers: list) -> MessageBus:
    bus = await connect_bus(address, timeout_s=10)
    try:
        interface = SchedulerInterface(agent)
        bus.add_message_handler(CallGate(bus, interface))
        bus.export(names.OBJECT_PATH, interface)
        reply = await bus.request_name(names.BUS_NAME)
    except BaseException:
        bus.disconnect()
        raise
    if reply == RequestNameReply.IN_QUEUE:
        log.warning("dbus name=%s is owned by another process; queued for it", names.BUS_NAME)
    subscribers[:] = [interface.on_agent_changed]
    return bus


async def export_on_bus(
    agent, address: str = "system", *, first_retry_s: float = 0.5, max_retry_s: float = 30.0
) -> None:
    """Publish `agent` on the bus at `address` ("system" or a D-Bus address)
    until cancelled.  When the bus is missing or goes away, retry with
    exponential backoff; the agent keeps serving the shim meanwhile."""
    subscribers: list = []  # the interface of the current connection, if any

    def forward_change():
        for subscriber in subscribers:
            subscriber()

    unsubscribe = agent.subscribe(forward_change)
    try:
        await _stay_on_bus(agent, address, subscribers, first_retry_s, max_retry_s)
    finally:
        if callable(unsubscribe):
            unsubscribe()


async def _stay_on_bus(agent, address, subscribers, first_retry_s, max_retry_s) -> None:
    retry_s = first_retry_s
    failures = 0
    while True:
        bus = None
        try:
            bus = await _publish(agent, address, subscribers)
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
            subscribers.clear()
        await asyncio.sleep(retry_s)
        retry_s = min(retry_s * 2, max_retry_s)
