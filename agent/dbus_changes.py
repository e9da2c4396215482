"""org.freedesktop.DBus.Properties.PropertiesChanged for one interface of the
contract: Scheduler1's (dbus_api.py) and Shares1's (dbus_shares.py) each have
one emitter, made from the interface's contract (dbus_contract.py), so both
decide by one rule what to send.

The rule: when the engine's ChangeNotifier (timers.py) says something changed
(after a batch of events, at most every 0.1 s), the properties are read and
compared with what was last published; those that differ go out in one signal
named for the interface.  A property the contract annotates
org.freedesktop.DBus.Property.EmitsChangedSignal=false is never sent.  A
figure that moves with time alone (a client's seconds held, a group's use and
share) is left out of the comparison by the interface's `unchanging` row for
the property, so it rides along with a real change rather than making every
read a change; the value sent is the whole property as read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from dbus_next import Message, Variant
from dbus_next.aio import MessageBus

from . import dbus_names as names
from .dbus_contract import PROPERTIES_INTERFACE, Contract

log = logging.getLogger(__name__)


class PropertiesChangedEmitter:
    """What one interface last published, and the signal for what changed since."""

    def __init__(
        self,
        bus: MessageBus,
        contract: Contract,
        read: Callable[[], dict],
        unchanging: Mapping[str, Callable[[Any], Any]] | None = None,
    ):
        """read(): every property's value now, plain Python, by name.  unchanging:
        for a property with figures that move with time, its value less them."""
        self._bus = bus
        self._contract = contract
        self._read = read
        self._unchanging = dict(unchanging or {})
        self._published = self._comparable(read())

    def _comparable(self, values: dict) -> dict:
        return {
            name: self._unchanging[name](value) if name in self._unchanging else value
            for name, value in values.items()
            if name not in self._contract.silent
        }

    def publish(self) -> None:
        """One PropertiesChanged with what changed since the last call, if anything did."""
        if not self._bus.connected:
            return
        values = self._read()
        comparable = self._comparable(values)
        changed = [n for n in comparable if comparable[n] != self._published.get(n)]
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
                log.warning(
                    "dbus PropertiesChanged %s.%s not sent: %s",
                    self._contract.interface,
                    name,
                    error,
                )
        if variants:
            try:
                self._send(variants)
            except Exception as error:
                log.warning("dbus PropertiesChanged not sent: %s", error)

    def _send(self, variants: dict) -> None:
        self._bus.send(
            Message.new_signal(
                names.OBJECT_PATH,
                PROPERTIES_INTERFACE,
                "PropertiesChanged",
                "sa{sv}as",
                [self._contract.interface, variants, []],
            )
        )
