"""tests/metrics: nvshare-metrics run as a real process on a connection, against
the real agent on a private dbus-daemon (tests/dbus/dbus_harness.py) with fake
shims (tests/agent/agent_harness.py) making grants, waits and memory happen."""

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "dbus"))
sys.path.insert(0, str(HERE.parent / "agent"))

from dbus_harness import bus, world_dir  # noqa: E402, F401 (fixtures, found by name)


def pytest_collection_modifyitems(items):
    # The agent owns its name on the private bus only as root, as on the system bus.
    for item in items:
        if HERE in Path(item.fspath).parents and "bus" in item.fixturenames:
            item.add_marker(pytest.mark.root)
