"""tests/metrics: nvshare-metrics run as a real process on a connection, against
the real agent on a private dbus-daemon (tests/dbus/dbus_harness.py) with fake
shims (tests/agent/agent_harness.py) making grants, waits and memory happen."""

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "dbus"))
sys.path.insert(0, str(HERE.parent / "agent"))

from agent_harness import FAST_CONFIG, AgentProcess  # noqa: E402
from dbus_harness import bus, wait_for, world_dir  # noqa: E402, F401 (fixtures, found by name)


@pytest.fixture
def fast_agent(world_dir, bus):  # noqa: F811 (the fixtures above, by name)
    """The real agent on the private bus, its quantum and grace short (FAST_CONFIG)."""
    agent = AgentProcess(world_dir / "agent", config=FAST_CONFIG, bus=bus.address).start()
    (world_dir / "agent").chmod(0o755)
    wait_for(bus.name_has_owner, "the agent on the bus")
    yield agent
    assert agent.stop() == 0, agent.log()


def pytest_collection_modifyitems(items):
    # The agent owns its name on the private bus only as root, as on the system bus.
    for item in items:
        if HERE in Path(item.fspath).parents and "bus" in item.fixturenames:
            item.add_marker(pytest.mark.root)
