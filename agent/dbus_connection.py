"""Opening a bus connection with dbus-next: the one way that the agent and
nvsharectl both use, so fixes to dbus-next 0.2.3 apply to both."""

import asyncio

from dbus_next import AuthError, BusType, DBusError, MessageType, Variant
from dbus_next.aio import MessageBus

# Error replies longer than this are cut.  dbus-next's own errors quote what
# the caller sent (a property, interface or object path of any length); a reply
# past the bus's message limit (32 MiB on the system bus) makes dbus-daemon
# drop the connection that sent it: the agent, and every client's view with it.
MAX_ERROR_TEXT = 512

# Where the machine's D-Bus id lives: systemd's file, then dbus's own copy.
MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")


def read_machine_id(files=MACHINE_ID_FILES) -> str:
    """The 32 hex digits that org.freedesktop.DBus.Peer.GetMachineId answers.
    Raises OSError when no file holds one."""
    problem = "no machine id file"
    for path in files:
        try:
            with open(path) as file:
                machine_id = file.read(64).strip()
        except OSError as error:
            problem = f"{path}: {error.strerror}"
            continue
        if len(machine_id) == 32 and all(c in "0123456789abcdef" for c in machine_id):
            return machine_id
        problem = f"{path} holds no machine id"
    raise OSError(problem)


def plain(value):
    """A D-Bus value with the variants inside it (the a{sv} dictionaries) unwrapped."""
    if isinstance(value, Variant):
        return plain(value.value)
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):  # an array of a{sv} (Shares1's Groups)
        return [plain(item) for item in value]
    return value


def _retrieve_exception(future) -> None:
    if not future.cancelled():
        future.exception()


class _MessageBus(MessageBus):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # A connection's end is also reported to every pending call; where no
        # one waits for the end itself (nvsharectl), asyncio would log
        # "Future exception was never retrieved" for it.
        self._disconnect_future.add_done_callback(_retrieve_exception)

    def send(self, msg):
        if (
            msg.message_type == MessageType.ERROR
            and msg.signature == "s"
            and len(msg.body[0]) > MAX_ERROR_TEXT
        ):
            text = msg.body[0]
            msg.body = [
                f"{text[:MAX_ERROR_TEXT]}... ({len(text) - MAX_ERROR_TEXT} more characters)"
            ]
        sent = super().send(msg)
        # Nobody awaits this future.  When the connection closes, every write
        # still queued fails with it, and asyncio would log "Future exception
        # was never retrieved" for each; the loss itself reaches
        # wait_for_disconnect() and the pending calls.
        sent.add_done_callback(_retrieve_exception)
        return sent

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
    or TimeoutError."""
    bus = (
        _MessageBus(bus_type=BusType.SYSTEM)
        if address == "system"
        else _MessageBus(bus_address=address)
    )
    # asyncio.timeout, not wait_for: 3.11's wait_for returns the connection when
    # it is cancelled in the loop turn that connects, and the cancellation is
    # lost.  A SIGTERM 20 ms after the agent's start then left it serving the bus,
    # deaf to the stop, until systemd killed it 15 s later (issue 45).
    async with asyncio.timeout(timeout_s):
        return await bus.connect()
