"""The D-Bus side of nvsharectl: call the agent, turn bus errors into one-line
`CliError`s that say what to do next.  No scheduling logic lives here."""

import asyncio
import contextlib

from dbus_next import Message, MessageType, Variant
from dbus_next.aio import MessageBus

from nvshare_agent import dbus_names as names
from nvshare_agent.bus_address import EXAMPLE, bus_address_problem, system_bus_problem
from nvshare_agent.dbus_connection import connect_bus, plain
from nvshare_agent.settings import SettingsError, check_setting
from nvshare_agent.text import excerpt

from . import unit_state

CALL_TIMEOUT_S = 25.0  # the bus may be starting nvshare.service for us

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it

_PROPERTIES = "org.freedesktop.DBus.Properties"
_AGENT_MISSING = {
    "org.freedesktop.DBus.Error.ServiceUnknown",
    "org.freedesktop.DBus.Error.NameHasNoOwner",
    "org.freedesktop.DBus.Error.Spawn.ChildExited",
    "org.freedesktop.DBus.Error.Spawn.Failed",
    "org.freedesktop.systemd1.NoSuchUnit",
    "org.freedesktop.systemd1.UnitMasked",
}
_DENIED = {"org.freedesktop.DBus.Error.AccessDenied", names.ERROR_ACCESS_DENIED}
_BAD_VALUE = {names.ERROR_INVALID_ARGUMENT, names.ERROR_UNKNOWN_GPU}
_NO_ANSWER = "the nvshare agent did not answer in time: see journalctl -u nvshare.service"
_AGENT_STOPPED = "the nvshare agent stopped before it answered: see journalctl -u nvshare.service"


class CliError(Exception):
    """One line for the user, and the exit code that goes with it."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED):
        super().__init__(message)
        self.exit_code = exit_code


def _error_from_reply(reply: Message) -> CliError:
    text = reply.body[0] if reply.body and isinstance(reply.body[0], str) else reply.error_name
    # One line: dbus-next appends a traceback to the text of an unexpected error.
    text = (text.strip().splitlines() or [reply.error_name])[0].strip()
    if reply.error_name in _AGENT_MISSING:
        return CliError(f"the nvshare agent is not running ({text}): {names.START_HINT}")
    if reply.error_name in _DENIED:
        return CliError(
            f"permission denied: changing nvshare settings needs root or group "
            f"{names.ADMIN_GROUP} (try sudo)"
        )
    if reply.error_name in _BAD_VALUE:
        return CliError(f"invalid value: {text}", EXIT_USAGE)
    if reply.error_name == "org.freedesktop.DBus.Error.NoReply":
        # dbus-daemon says NoReply both when its reply timeout passes and when
        # the callee leaves the bus without answering ("Message recipient
        # disconnected from message bus without replying").
        return CliError(_AGENT_STOPPED if "disconnected" in text else _NO_ANSWER)
    return CliError(f"the agent refused: {text} ({reply.error_name})")


def _maybe_not_started(reply: Message) -> bool:
    """An error from the bus or systemd rather than from the agent: one that may
    mean the agent could not be started (dbus-daemon passes systemd's activation
    failures on under systemd's own error names)."""
    name = reply.error_name or ""
    return reply.message_type == MessageType.ERROR and (
        name in _AGENT_MISSING
        or name.startswith("org.freedesktop.systemd1.")
        or name.startswith("org.freedesktop.DBus.Error.Spawn.")
    )


def _u64(num_bytes: int, setting: str = "memory_limit") -> int:
    # Past u64 the marshaller would fail with a traceback: the agent's range
    # sentence, said here (settings.py has the bounds).
    try:
        check_setting(f"{setting}_bytes", num_bytes)
    except SettingsError as error:
        raise CliError(f"invalid value: {error}", EXIT_USAGE) from None
    return num_bytes


def _variant(dbus_type: str, value, setting: str = "") -> Variant:
    # A number outside u32 goes as int64, so that the agent, not the
    # marshaller, answers with its range sentence naming the setting.
    if dbus_type == "u" and not 0 <= value <= 0xFFFFFFFF:
        if not -(2**63) <= value < 2**63:
            raise CliError(f"invalid value: {setting} {value} is out of range", EXIT_USAGE)
        return Variant("x", value)
    if dbus_type == "t":
        _u64(value, setting.removesuffix("_bytes"))
    return Variant(dbus_type, value)


SHARES_INTERFACE = names.SHARES_INTERFACE  # agent/io.github.nvshare.Shares1.xml


class AgentClient:
    def __init__(self, bus: MessageBus, where: str, on_system_bus: bool = False):
        self._bus = bus
        self._where = where
        self._on_system_bus = on_system_bus

    async def _call(self, message: Message) -> Message:
        try:
            # asyncio.timeout, not wait_for: 3.11's wait_for can turn the
            # cancellation of Ctrl-C into a TimeoutError.
            async with asyncio.timeout(CALL_TIMEOUT_S):
                reply = await self._call_or_why_not(message)
        except TimeoutError:  # before OSError, its base class
            raise CliError(_NO_ANSWER) from None
        except (
            EOFError,
            OSError,
        ) as error:  # dbus-next fails pending calls with the connection's end
            reason = (
                error.strerror if isinstance(error, OSError) and error.strerror else "it closed"
            )
            raise CliError(
                f"lost the connection to {self._where} during the call ({reason}): is dbus running?"
            ) from None
        if reply is None:  # dbus-next answers None only for NO_REPLY_EXPECTED calls
            raise CliError(_NO_ANSWER)
        if reply.message_type == MessageType.ERROR:
            raise _error_from_reply(reply)
        return reply

    async def _call_or_why_not(self, message: Message) -> Message | None:
        """The call's reply; or, as soon as systemd says the agent cannot answer
        (it cannot start, or runs and is silent), CliError with why, rather than
        the bus's 25 s wait (unit_state.py)."""
        call = asyncio.ensure_future(self._bus.call(message))
        watch = asyncio.ensure_future(unit_state.why_no_answer(self._bus, self._on_system_bus))
        try:
            await asyncio.wait((call, watch), return_when=asyncio.FIRST_COMPLETED)
            if not call.done() and watch.exception() is not None:
                await asyncio.wait((call,))  # asking systemd failed: the call decides
            if call.done():
                reply = call.result()
                if reply is not None and _maybe_not_started(reply):
                    # The bus tried to start the agent and could not: say why.
                    reason = await unit_state.trouble_now(self._bus, self._on_system_bus)
                    if reason:
                        raise CliError(f"the nvshare agent is not running: {reason}")
                return reply
            reason = watch.result()
        finally:
            for task in (call, watch):
                task.cancel()
            await asyncio.gather(call, watch, return_exceptions=True)
        raise CliError(f"the nvshare agent does not answer: {reason}")

    def _message(self, interface, member, signature="", body=()):
        return Message(
            destination=names.BUS_NAME,
            path=names.OBJECT_PATH,
            interface=interface,
            member=member,
            signature=signature,
            body=list(body),
        )

    async def properties(self) -> dict:
        """All properties of the interface, plain Python values by name."""
        reply = await self._call(self._message(_PROPERTIES, "GetAll", "s", [names.INTERFACE]))
        return {name: plain(variant.value) for name, variant in reply.body[0].items()}

    async def set_time_quantum(self, seconds: int) -> None:
        # 'u' is the property's type; a value outside u32 goes as int64 so
        # that the agent, not the marshaller, answers with its range sentence.
        signature = "u" if 0 <= seconds <= 0xFFFFFFFF else "x"
        if signature == "x" and not -(2**63) <= seconds < 2**63:
            raise CliError(
                f"invalid value: time quantum {seconds} seconds is out of range", EXIT_USAGE
            )
        await self._set(names.PROP_TIME_QUANTUM, Variant(signature, seconds))

    async def set_anti_thrash(self, mode: str) -> None:
        """mode: on, off or auto."""
        await self._set(names.PROP_ANTI_THRASH_MODE, Variant("s", mode))

    async def set_fair_page(self, switch: str) -> None:
        """switch: on or off."""
        await self._set(names.PROP_FAIR_PAGE, Variant("s", switch))

    async def set_memory_limit(self, num_bytes: int) -> None:
        """0: none."""
        await self._set(names.PROP_MEMORY_LIMIT, Variant("t", _u64(num_bytes)))

    async def gpu_settings(self) -> dict:
        """GpuSettings: GPU id -> the settings it has of its own, plain values."""
        reply = await self._call(
            self._message(_PROPERTIES, "Get", "ss", [names.INTERFACE, names.PROP_GPU_SETTINGS])
        )
        return plain(reply.body[0].value)

    async def set_gpu_settings(self, gpu_settings: dict) -> None:
        """Replace GpuSettings with `gpu_settings` (GPU id -> key -> plain value)."""
        types = dict(names.GPU_SETTINGS_FIELDS)
        value = {
            gpu_id: {key: _variant(types[key], item, key) for key, item in entry.items()}
            for gpu_id, entry in gpu_settings.items()
        }
        await self._set(names.PROP_GPU_SETTINGS, Variant("a{sa{sv}}", value))

    async def _set(self, prop_name: str, value: Variant) -> None:
        await self._call(
            self._message(_PROPERTIES, "Set", "ssv", [names.INTERFACE, prop_name, value])
        )

    # ---- share groups (io.github.nvshare.Shares1)

    async def shares(self) -> dict:
        """ShareBy, Shares and Groups, plain values by name."""
        reply = await self._call(self._message(_PROPERTIES, "GetAll", "s", [SHARES_INTERFACE]))
        return {name: plain(variant.value) for name, variant in reply.body[0].items()}

    async def set_share(self, group: str, fields: dict) -> None:
        types = {"weight": "u", "memory_cap_bytes": "t"}
        body = [group, {key: _variant(types[key], value, key) for key, value in fields.items()}]
        await self._call(self._message(SHARES_INTERFACE, "SetShare", "sa{sv}", body))

    async def reset_share(self, group: str) -> None:
        await self._call(self._message(SHARES_INTERFACE, "ResetShare", "s", [group]))

    async def set_share_by(self, share_by: str) -> None:
        await self._call(
            self._message(
                _PROPERTIES, "Set", "ssv", [SHARES_INTERFACE, "ShareBy", Variant("s", share_by)]
            )
        )

    async def settings_sources(self) -> list | None:
        """GetSettings: each value, where it comes from; None from an agent before it."""
        try:
            reply = await self._call(self._message(names.INTERFACE, names.METHOD_GET_SETTINGS))
        except CliError:
            return None
        return plain(reply.body[0])

    async def reset_setting(self, section: str, key: str) -> None:
        """ResetSetting: the config file's value of one setting applies again."""
        await self._call(
            self._message(names.INTERFACE, names.METHOD_RESET_SETTING, "ss", [section, key])
        )

    async def gpu(self, uuid: str) -> list:
        reply = await self._call(self._message(names.INTERFACE, names.METHOD_GET_GPU, "s", [uuid]))
        return reply.body[0]


@contextlib.asynccontextmanager
async def connect(address: str):
    """`address` is "system" or a D-Bus address such as unix:path=/run/x."""
    if not address:  # dbus-next would take "" for the session bus
        raise CliError(f"--bus needs 'system' or a D-Bus address such as {EXAMPLE}", EXIT_USAGE)
    problem = system_bus_problem() if address == "system" else bus_address_problem(address)
    if problem and address == "system":
        raise CliError(problem, EXIT_USAGE)
    if problem:  # the address is quoted, so a newline in it cannot make a second line
        raise CliError(
            f"--bus {excerpt(address)} is not a D-Bus address ({problem}); "
            f"use 'system' or an address such as {EXAMPLE}",
            EXIT_USAGE,
        )
    where = "the system bus" if address == "system" else f"the bus at {address}"
    try:
        bus = await connect_bus(address, CALL_TIMEOUT_S)
    except (TimeoutError, OSError, ValueError) as error:
        detail = str(error) or type(error).__name__
        raise CliError(f"cannot connect to {where} ({detail}): is dbus running?") from None
    except Exception as error:  # dbus-next raises bare Exceptions for bad addresses, auth
        raise CliError(f"cannot connect to {where}: {error}") from None
    try:
        yield AgentClient(bus, where, on_system_bus=address == "system")
    finally:
        if bus.connected:  # else dbus-next logs a traceback for the socket it cannot shut down
            bus.disconnect()
