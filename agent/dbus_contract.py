"""The D-Bus contract as the agent reads it: the checked-in interface XML
(io.github.nvshare.Scheduler1.xml beside this file, and Shares1's,
io.github.nvshare.Shares1.xml) and the standard interfaces served beside them,
and the named error every refused call answers with.  The XML is the one
definition: property types and access, method signatures, which properties
emit no PropertiesChanged; dbus_properties.check_properties (Scheduler1) and
dbus_shares.check_shares_contract (Shares1) refuse to serve when the code and
the XML disagree.
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass
from xml.etree import ElementTree

from . import dbus_names as names

CONTRACT_FILE = names.INTERFACE + ".xml"
PROPERTIES_INTERFACE = "org.freedesktop.DBus.Properties"
INTROSPECTABLE_INTERFACE = "org.freedesktop.DBus.Introspectable"
PEER_INTERFACE = "org.freedesktop.DBus.Peer"
STANDARD_INTERFACES = (PROPERTIES_INTERFACE, INTROSPECTABLE_INTERFACE, PEER_INTERFACE)

# The standard interfaces, as Introspect describes them beside ours.
STANDARD_XML = f"""
  <interface name="{INTROSPECTABLE_INTERFACE}">
    <method name="Introspect"><arg name="xml_data" type="s" direction="out"/></method>
  </interface>
  <interface name="{PEER_INTERFACE}">
    <method name="Ping"/>
    <method name="GetMachineId"><arg name="machine_uuid" type="s" direction="out"/></method>
  </interface>
  <interface name="{PROPERTIES_INTERFACE}">
    <method name="Get">
      <arg name="interface_name" type="s" direction="in"/>
      <arg name="property_name" type="s" direction="in"/>
      <arg name="value" type="v" direction="out"/>
    </method>
    <method name="GetAll">
      <arg name="interface_name" type="s" direction="in"/>
      <arg name="props" type="a{{sv}}" direction="out"/>
    </method>
    <method name="Set">
      <arg name="interface_name" type="s" direction="in"/>
      <arg name="property_name" type="s" direction="in"/>
      <arg name="value" type="v" direction="in"/>
    </method>
    <signal name="PropertiesChanged">
      <arg name="interface_name" type="s"/>
      <arg name="changed_properties" type="a{{sv}}"/>
      <arg name="invalidated_properties" type="as"/>
    </signal>
  </interface>"""


class DBusFailure(Exception):
    """A call answered with a named error and one human sentence."""

    def __init__(self, name: str, text: str):
        super().__init__(text)
        self.name, self.text = name, text


class ContractMismatch(RuntimeError):
    """The agent's code and the interface XML disagree: a bug, found at start."""


@dataclass(frozen=True)
class Contract:
    xml: str  # the interface element as written in the file
    properties: dict[str, tuple[str, str]]  # name -> (type, access)
    methods: dict[str, str]  # name -> input signature
    silent: frozenset[str]  # properties that emit no PropertiesChanged
    interface: str = names.INTERFACE


def load_contract(interface: str = names.INTERFACE) -> Contract:
    """The contract of `interface`, from its file (INTERFACE.xml, package data)."""
    text = importlib.resources.files(__package__).joinpath(interface + ".xml").read_text()
    return parse_contract(text, interface)


def parse_contract(text: str, interface_name: str = names.INTERFACE) -> Contract:
    root = ElementTree.fromstring(text)
    (interface,) = [i for i in root.findall("interface") if i.get("name") == interface_name]
    properties = {
        p.attrib["name"]: (p.attrib["type"], p.attrib["access"]) for p in interface.iter("property")
    }
    methods = {
        m.attrib["name"]: "".join(
            a.attrib["type"] for a in m.iter("arg") if a.get("direction") == "in"
        )
        for m in interface.iter("method")
    }
    silent = frozenset(
        p.attrib["name"]
        for p in interface.iter("property")
        for a in p.iter("annotation")
        if a.get("name") == "org.freedesktop.DBus.Property.EmitsChangedSignal"
        and a.get("value") == "false"
    )
    start = text.index(f'<interface name="{interface_name}"')
    end = text.index("</interface>", start) + len("</interface>")
    return Contract(text[start:end], properties, methods, silent, interface_name)
