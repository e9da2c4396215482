"""Anyone reads; only root and group nvshare-admin change settings.  Checked
twice: by the bus policy file and by the agent itself, and the two agree."""

import json
import os
import xml.etree.ElementTree as ElementTree

from dbus_harness import (
    ACTIVATION_FILE,
    NOBODY,
    POLICY_FILE,
    busctl,
    busctl_on_agent,
    dbus_send,
    get_property,
    nvsharectl,
    set_property,
)

from nvshare_agent import dbus_names as names
from nvshare_agent.dbus_api import may_change_settings


def test_unprivileged_user_reads_settings_and_state(agent, bus):
    assert get_property(bus.address, "TimeQuantum", user=NOBODY) == "u 30"
    assert get_property(bus.address, "AntiThrash", user=NOBODY) == "b true"
    assert get_property(bus.address, "Gpus", user=NOBODY).startswith("a(sstauau)")
    assert get_property(bus.address, "Clients", user=NOBODY).startswith("a(uuusa(sstd))")
    result = nvsharectl(bus.address, "status", "--json", user=NOBODY)
    assert result.returncode == 0, result.stderr


def test_policy_refuses_unprivileged_set(agent, bus):
    result = set_property(bus.address, "TimeQuantum", "uint32:5", user=NOBODY)
    assert "Error org.freedesktop.DBus.Error.AccessDenied" in result.stderr
    result = set_property(bus.address, "AntiThrash", "boolean:false", user=NOBODY)
    assert "Error org.freedesktop.DBus.Error.AccessDenied" in result.stderr
    result = busctl_on_agent(
        bus.address, "set-property", "TimeQuantum", "u", "5", user=NOBODY, check=False
    )
    assert result.returncode != 0 and "Access denied" in result.stderr
    assert get_property(bus.address, "TimeQuantum") == "u 30"
    assert get_property(bus.address, "AntiThrash") == "b true"


def test_agent_refuses_unprivileged_set_that_a_loose_policy_lets_through(
    agent_on_permissive_bus, permissive_bus
):
    address = permissive_bus.address
    # A bad value too: who may not change settings hears that, not what is wrong with it.
    for prop_name, value in (
        ("TimeQuantum", "uint32:5"),
        ("AntiThrash", "boolean:false"),
        ("TimeQuantum", "string:ten"),
    ):
        result = set_property(address, prop_name, value, user=NOBODY)
        assert f"Error {names.ERROR_ACCESS_DENIED}: " in result.stderr
        assert "needs root or group nvshare-admin (caller uid 65534)" in result.stderr
    assert get_property(address, "TimeQuantum") == "u 30"
    assert get_property(address, "AntiThrash") == "b true"
    # The same bus lets root through: the refusal above was the agent's own.
    assert set_property(address, "TimeQuantum", "uint32:5").returncode == 0
    assert get_property(address, "TimeQuantum") == "u 5"


def test_nvsharectl_reports_permission_denied_with_exit_1(agent, bus):
    result = nvsharectl(bus.address, "set-tq", "5", user=NOBODY)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "nvsharectl: permission denied: changing nvshare settings "
        "needs root or group nvshare-admin (try sudo)"
    )
    result = nvsharectl(bus.address, "-S", "off", user=NOBODY)
    assert result.returncode == 1 and "permission denied" in result.stderr


def test_admin_rule_is_root_or_admin_group_member():
    assert may_change_settings(0)
    assert not may_change_settings(65534)
    # nobody's primary group stands in for the admin group: same lookup path.
    nobody_group = __import__("grp").getgrgid(__import__("pwd").getpwuid(65534).pw_gid).gr_name
    assert may_change_settings(65534, group_name=nobody_group)
    assert not may_change_settings(65534, group_name="no-such-group-for-nvshare")
    assert not may_change_settings(4_000_000_000)  # a uid with no passwd entry


def _policies(path):
    return ElementTree.parse(path).getroot().findall("policy")


def test_policy_file_agrees_with_names_and_agent_rule():
    assert POLICY_FILE.name == names.BUS_NAME + ".conf"
    owners, setters, readers = set(), set(), set()
    for policy in _policies(POLICY_FILE):
        who = (
            (policy.get("user") and f"user:{policy.get('user')}")
            or (policy.get("group") and f"group:{policy.get('group')}")
            or policy.get("context")
        )
        for rule in policy.findall("allow"):
            if rule.get("own"):
                assert rule.get("own") == names.BUS_NAME
                owners.add(who)
            if rule.get("send_destination"):
                assert rule.get("send_destination") == names.BUS_NAME
                member = rule.get("send_member")
                if member == "Set" or (member is None and rule.get("send_interface") is None):
                    setters.add(who)
                else:
                    readers.add((who, rule.get("send_interface"), member))
        assert not policy.findall("deny")
    assert owners == {"user:root"}
    assert setters == {"user:root", f"group:{names.ADMIN_GROUP}"}
    assert ("default", "org.freedesktop.DBus.Properties", "Get") in readers
    assert ("default", "org.freedesktop.DBus.Properties", "GetAll") in readers
    assert ("default", names.INTERFACE, names.METHOD_GET_GPU) in readers


def test_activation_file_names_the_bus_name_and_the_systemd_unit():
    lines = dict(
        line.split("=", 1)
        for line in ACTIVATION_FILE.read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    assert ACTIVATION_FILE.name == names.BUS_NAME + ".service"
    assert lines["Name"] == names.BUS_NAME
    assert lines["SystemdService"] == "nvshare.service"
    assert lines["User"] == "root"
    assert os.path.isabs(lines["Exec"].split()[0])


def test_every_method_introspection_offers_but_set_is_open_to_everyone(agent, bus):
    # The policy and the introspection data must agree: a method offered to all
    # but refused by the policy is a trap for tools.  Called without arguments,
    # a method the policy lets through gets the agent's answer or a wrong-
    # signature error; the policy's refusal is AccessDenied.
    xml = json.loads(
        busctl(
            bus.address,
            "--json=short",
            "call",
            names.BUS_NAME,
            names.OBJECT_PATH,
            "org.freedesktop.DBus.Introspectable",
            "Introspect",
        ).stdout
    )["data"][0]
    offered = [
        (interface.get("name"), method.get("name"))
        for interface in ElementTree.fromstring(xml).findall("interface")
        for method in interface.findall("method")
    ]
    assert (names.INTERFACE, names.METHOD_GET_GPU) in offered
    assert ("org.freedesktop.DBus.Peer", "GetMachineId") in offered
    refused = [
        (interface, member)
        for interface, member in offered
        if "org.freedesktop.DBus.Error.AccessDenied"
        in dbus_send(bus.address, member, interface=interface, user=NOBODY).stderr
    ]
    assert refused == [
        ("org.freedesktop.DBus.Properties", "Set"),
        (names.INTERFACE, names.METHOD_RESET_SETTING),  # GetSettings is open to all
        ("io.github.nvshare.Shares1", "SetShare"),  # agent/dbus_shares.py
        ("io.github.nvshare.Shares1", "ResetShare"),
    ]
