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

from dbus_next.aio import MessageBus
from dbus_next.constants import RequestNameReply

from . import dbus_names as names
from .dbus_api import DBusApi, check_contract
from .dbus_connection import connect_bus
from .dbus_contract import Contract, load_contract
from .dbus_shares import SharesApi, check_shares_contract
from .engine import Engine

log = logging.getLogger(__name__)


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
    except BaseException:
        bus.disconnect()
        raise
    if reply == RequestNameReply.IN_QUEUE:
        log.warning("dbus name=%s is owned by another process; queued for it", names.BUS_NAME)
    return bus, [api, shares]


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
