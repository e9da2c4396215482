"""Fixtures live in dbus_harness.py, beside the helpers the tests import from it."""

from dbus_harness import (agent, agent_on_permissive_bus, bus,  # noqa: F401 (fixtures)
                          permissive_bus, world_dir)
