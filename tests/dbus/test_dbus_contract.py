"""The property table (agent/dbus_properties.py) and the interface XML agree, and
so do agent/dbus_shares.py and Shares1's XML; the agent refuses to serve when they
do not: a setting added to one and not the other is a failing test and a clear line
at start, not a silent gap."""

from pathlib import Path

import pytest

import nvshare_agent
from nvshare_agent import dbus_names as names
from nvshare_agent.dbus_api import check_contract
from nvshare_agent.dbus_contract import (
    CONTRACT_FILE,
    ContractMismatch,
    load_contract,
    parse_contract,
)
from nvshare_agent.dbus_properties import PROPERTIES, SETTINGS, check_properties
from nvshare_agent.dbus_shares import check_shares_contract


def test_the_property_table_serves_the_contract():
    contract = load_contract()
    check_properties(contract)
    assert [row.name for row in PROPERTIES] == list(contract.properties)
    writable = {
        name for name, (_type, access) in contract.properties.items() if access == "readwrite"
    }
    assert set(SETTINGS) == writable


def _contract_with(properties: str):
    return parse_contract(
        f'<node><interface name="{names.INTERFACE}">{properties}</interface></node>'
    )


def test_a_property_missing_from_the_table_is_refused_by_name():
    xml = "".join(
        f'<property name="{row.name}" type="s" access="{"readwrite" if row.setting else "read"}"/>'
        for row in PROPERTIES
    )
    contract = _contract_with(xml + '<property name="ShareBy" type="s" access="readwrite"/>')
    with pytest.raises(ContractMismatch, match="in .*xml but not in the table: ShareBy"):
        check_properties(contract)


def test_a_setting_the_contract_calls_read_only_is_refused_by_name():
    xml = "".join(f'<property name="{row.name}" type="s" access="read"/>' for row in PROPERTIES)
    with pytest.raises(ContractMismatch, match="TimeQuantum has a setting but is read-only"):
        check_properties(_contract_with(xml))


def _contract_file_with(extra: str):
    text = (Path(nvshare_agent.__file__).parent / CONTRACT_FILE).read_text()
    return parse_contract(text.replace("  </interface>", extra + "\n  </interface>", 1))


def test_the_agent_serves_the_contract():
    check_contract(load_contract())


def test_a_method_the_agent_does_not_serve_is_refused_by_name():
    contract = _contract_file_with('<method name="JoinShareGroup"/>')
    with pytest.raises(ContractMismatch, match="not served: JoinShareGroup"):
        check_contract(contract)


def test_the_shares_interface_serves_its_contract():
    contract = load_contract(names.SHARES_INTERFACE)
    check_shares_contract(contract)
    assert contract.interface == names.SHARES_INTERFACE
    assert contract.methods == {"SetShare": "sa{sv}", "ResetShare": "s"}
    # Groups emits (its use and share alone do not count as a change, dbus_changes.py).
    assert contract.silent == frozenset()


def test_a_shares_member_the_agent_does_not_serve_is_refused_by_name():
    text = (Path(nvshare_agent.__file__).parent / f"{names.SHARES_INTERFACE}.xml").read_text()
    extra = '<property name="Quota" type="u" access="read"/>'
    contract = parse_contract(
        text.replace("  </interface>", extra + "\n  </interface>", 1), names.SHARES_INTERFACE
    )
    with pytest.raises(ContractMismatch, match="in the XML ShareBy, Shares, Groups, Quota"):
        check_shares_contract(contract)
