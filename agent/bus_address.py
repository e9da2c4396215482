"""Is a --bus value a D-Bus address we can connect to?  Checked at startup by
the agent and by nvsharectl, so that a typo is one line and exit 2 instead of
a connection retried forever (the agent) or a confusing failure (the CLI).

Pure: no dbus-next here, so the agent can check its arguments even where the
D-Bus API is missing.  The rules are the D-Bus specification's, limited to what
dbus-next 0.2.3 can connect to (unix: and tcp:, values it accepts)."""

import os
import re

from .text import excerpt

EXAMPLE = "unix:path=/run/dbus/system_bus_socket"
# The specification's optionally-escaped bytes (less backslash and *, which
# dbus-next refuses), and % for the escapes.
_VALUE = re.compile(r"[-0-9A-Za-z_/.%]*")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_KEY = re.compile(r"[A-Za-z][-0-9A-Za-z_]*")
_NEEDS = {"unix": "path= or abstract=", "tcp": "host= and port="}


def bus_address_problem(address: str) -> str | None:
    """Why `address` is not a D-Bus address that we can use (a few words), or None."""
    if not address.isascii() or not address.isprintable():
        return "control or non-ASCII characters"
    entries = [entry for entry in address.split(";") if entry]
    if not entries:
        return "empty"
    for entry in entries:
        transport, colon, options = entry.partition(":")
        if not colon:
            return "no transport, such as unix:"
        if transport not in _NEEDS:
            return f"transport {excerpt(transport)} is not unix: or tcp:"
        values = {}
        for option in filter(None, options.split(",")):
            key, equals, value = option.partition("=")
            if not equals or not _KEY.fullmatch(key):
                return f"{excerpt(option)} is not key=value"
            if not _VALUE.fullmatch(value) or _BAD_ESCAPE.search(value):
                return f"the value of {key}= holds characters that must be %-escaped"
            values[key] = value
        if (transport == "unix" and not values.keys() & {"path", "abstract"}) or (
            transport == "tcp" and not {"host", "port"} <= values.keys()
        ):
            return f"{transport}: needs {_NEEDS[transport]}"
        if transport == "tcp" and not values["port"].isdigit():
            return f"port={excerpt(values['port'])} is not a number"
    return None


def system_bus_problem(environ=os.environ) -> str | None:
    """The system bus is where DBUS_SYSTEM_BUS_ADDRESS says, when set (dbus-next
    reads it): the sentence saying why that value cannot work, or None."""
    address = environ.get("DBUS_SYSTEM_BUS_ADDRESS")
    problem = None if address is None else bus_address_problem(address)
    return (
        problem and f"DBUS_SYSTEM_BUS_ADDRESS={excerpt(address)} is not a D-Bus address ({problem})"
    )
