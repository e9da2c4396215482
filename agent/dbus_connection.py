"""Opening a bus connection with dbus-next: the one way that the agent and
nvsharectl both use, so fixes to dbus-next 0.2.3 apply to both."""

import asyncio

from dbus_next import AuthError, BusType, DBusError, MessageType
from dbus_next.aio import MessageBus

# Error replies longer than this are cut.  dbus-next's own errors quote what
# the caller sent (a property, interface or object path of any length); a reply
# past the bus's message limit (32 MiB on the system bus) makes dbus-daemon
# drop the connection that sent it: the agent, and every client's view with it.
MAX_ERROR_TEXT = 512


class _MessageBus(MessageBus):
    def send(self, msg):
        if (msg.message_type == MessageType.ERROR and msg.signature == "s"
                and len(msg.body[0]) > MAX_ERROR_TEXT):
            text = msg.body[0]
            msg.body = [f"{text[:MAX_ERROR_TEXT]}... ({len(text) - MAX_ERROR_TEXT} more characters)"]
        return super().send(msg)

    def _process_message(self, msg) -> None:
        try:
            super()._process_message(msg)
        except DBusError:
            # A call dbus-next's own dispatch refuses (Get of an unknown
            # property, interface or path, ...) has had its error reply by now;
            # 0.2.3 then lets the error escape, and _on_message logs it at ERROR
            # with a traceback: anyone could fill the journal with normal answers.
            if msg.message_type != MessageType.METHOD_CALL:
                raise

    async def _auth_readline(self) -> str:
        # dbus-next 0.2.3 loops on sock_recv until it sees "\r\n"; at EOF
        # sock_recv returns b"" at once, without yielding, so a peer that hangs
        # up mid-handshake spins the whole event loop (no timeout, no signal
        # handler ever runs).  The same loop, ending at EOF.
        line = b""
        while line[-2:] != b"\r\n":
            data = await self._loop.sock_recv(self._sock, 2)
            if not data:
                raise AuthError("the bus closed the connection during authentication")
            line += data
        return line[:-2].decode()


async def connect_bus(address: str, timeout_s: float) -> MessageBus:
    """`address` is "system" or a D-Bus address such as unix:path=/run/x.
    Raises what dbus-next raises (OSError, AuthError, ValueError, Exception)
    or asyncio.TimeoutError."""
    if address == "system":
        bus = _MessageBus(bus_type=BusType.SYSTEM)
    else:
        bus = _MessageBus(bus_address=address)
    return await asyncio.wait_for(bus.connect(), timeout_s)
