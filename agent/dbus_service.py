"""Staying on the bus: the D-Bus API (dbus_api.DBusApi, and dbus_shares.SharesApi
beside it for Shares1) served on a bus connection, its well-known name
requested, and a new connection with exponential backoff whenever the bus is
missing or goes away; the agent keeps serving the shims meanwhile.  The
contracts are checked once, before the first connection (dbus_api.check_contract,
dbus_shares.check_shares_contract).  Each change notification from the engine
goes to both interfaces' publish_changes, which send what changed (dbus_changes.py)."""

from __future__ import annotations

import asyncio
import logging

from dbus_next import Message
from dbus_next.aio import MessageBus
from dbus_next.constants import RequestNameReply

from . import dbus_names as names
from .dbus_api import DBusApi, check_contract
from .dbus_connection import connect_bus
from .dbus_contract import Contract, load_contract
from .dbus_shares import SharesApi, check_shares_contract
from .engine import Engine

log = logging.getLogger(__name__)
# Handing the name back is two round trips to dbus-daemon: milliseconds.  The
# bound keeps a stop short (agent/daemon.py's STOP_RECANCEL_S) when the bus is slow.
HAND_BACK_TIMEOUT_S = 0.15


async def _publish(
    engine: Engine,
    address: str,
    contract: Contract,
    shares_contract: Contract,
    config_problem: str,
) -> tuple[MessageBus, list[DBusApi | SharesApi]]:
    bus = await connect_bus(address, timeout_s=10)
    try:
        api = DBusApi(bus, engine, contract, config_problem)
        # Shares1 (dbus_shares.py), a second interface: its handler goes first, and
        # passes on every call that is not its own.
        shares = SharesApi(bus, engine, api, shares_contract)
        bus.add_message_handler(shares.handle)
        bus.add_message_handler(api.handle)
        reply = await bus.request_name(names.BUS_NAME)
    except BaseException as error:
        try:
            # Stopped while asking for the name: it may be ours already, and
            # calls that waited for an agent on their way to us.
            if isinstance(error, asyncio.CancelledError):
                await _hand_back_the_name(bus)
        finally:
            bus.disconnect()
        raise
    if reply == RequestNameReply.IN_QUEUE:
        log.warning("dbus name=%s is owned by another process; queued for it", names.BUS_NAME)
    return bus, [api, shares]


async def _hand_back_the_name(bus: MessageBus) -> None:
    """Before the agent leaves the bus: release the name, so that calls from now
    on wait in dbus-daemon for the next agent (D-Bus activation, the restart's
    start), and answer those the bus routed to us before.  Closing with them
    unanswered fails each ("Message recipient disconnected from message bus
    without replying"): every call that met a restart (issue 45).  The bus
    answers ReleaseName after every call it sent us before it, which dbus-next
    has answered by then; the reply to one more call says that our answers are out
    (GetId: the system bus's policy refuses Peer.Ping to the bus itself)."""
    try:
        async with asyncio.timeout(HAND_BACK_TIMEOUT_S):
            await bus.release_name(names.BUS_NAME)
            await bus.call(
                Message(
                    destination="org.freedesktop.DBus",
                    path="/org/freedesktop/DBus",
                    interface="org.freedesktop.DBus",
                    member="GetId",
                )
            )
    except Exception as error:  # a bus already gone: nothing to hand back
        log.debug("dbus name not handed back: %s", str(error) or type(error).__name__)


async def export_on_bus(
    engine: Engine,
    address: str = "system",
    *,
    first_retry_s: float = 0.5,
    max_retry_s: float = 30.0,
    config_problem: str = "",
    first_try: asyncio.Event | None = None,
) -> None:
    """Serve the API on the bus at `address` ("system" or a D-Bus address) until
    cancelled.  When the bus is missing or goes away, retry with exponential
    backoff; the agent keeps serving the shims meanwhile.  first_try, if given,
    is set once the name is requested or the first connection failed."""
    first_try = first_try or asyncio.Event()
    contract = load_contract()
    check_contract(contract)  # a mismatch is a bug: say so before serving anything
    shares_contract = load_contract(names.SHARES_INTERFACE)
    check_shares_contract(shares_contract)
    current: list[DBusApi | SharesApi] = []  # the interfaces of the connection we have

    def publish() -> None:
        for api in current:
            api.publish_changes()

    unsubscribe = engine.subscribe(publish)
    retry_s, failures = first_retry_s, 0
    try:
        while True:
            bus = None
            try:
                bus, apis = await _publish(
                    engine, address, contract, shares_contract, config_problem
                )
                current[:] = apis
                first_try.set()
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
                    try:
                        await _hand_back_the_name(bus)
                    finally:
                        bus.disconnect()
                raise
            except Exception as error:
                first_try.set()
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
