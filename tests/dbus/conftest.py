"""Fixtures live in dbus_harness.py, beside the helpers the tests import from it."""

from pathlib import Path

import pytest
from dbus_harness import (  # noqa: F401 (fixtures, found by pytest by name)
    agent,
    agent_on_permissive_bus,
    bus,
    permissive_bus,
    world_dir,
)

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items):
    # The agent owns its name on the private bus as on the system bus, where the
    # policy lets only root own it; and the bus runs the checks that setpriv makes.
    for item in items:
        if HERE in Path(item.fspath).parents and {"bus", "permissive_bus"} & set(item.fixturenames):
            item.add_marker(pytest.mark.root)
