"""Fixtures live in dbus_harness.py, beside the helpers the tests import from it."""

from dbus_harness import (  # noqa: F401 (fixtures, found by pytest by name)
    agent,
    agent_on_permissive_bus,
    bus,
    permissive_bus,
    world_dir,
)
