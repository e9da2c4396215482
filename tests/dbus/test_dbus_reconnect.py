"""The agent keeps serving the shim without a bus, and comes back on the bus
when it (re)appears."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_harness import ShimClient  # noqa: E402

from dbus_harness import (AgentProcess, DbusDaemon, busctl_on_agent,  # noqa: E402
                          get_property, nvsharectl, wait_for)


def test_agent_survives_bus_restart_and_reclaims_its_name(agent, bus):
    busctl_on_agent(bus.address, "set-property", "TimeQuantum", "u", "12")
    bus.stop()
    with ShimClient(agent.socket_path, command="during-outage") as client:
        assert client.settings.time_quantum_ms == 12_000  # the shim side never noticed
    agent.assert_alive()
    assert nvsharectl(bus.address, "status").returncode == 1

    bus.start()
    wait_for(bus.name_has_owner, "the agent to re-register after the bus came back")
    assert get_property(bus.address, "TimeQuantum") == "u 12"
    busctl_on_agent(bus.address, "set-property", "AntiThrash", "b", "false")
    assert get_property(bus.address, "AntiThrash") == "b false"
    # The name is owned before the agent logs it, and its log is written in batches.
    wait_for(lambda: agent.log().count("dbus connected") >= 2, "the agent to log its second bus connection")
    assert agent.log().count("dbus connected") == 2


def test_agent_started_before_its_bus_registers_when_the_bus_appears(world_dir):
    daemon = DbusDaemon(world_dir)
    agent = AgentProcess(world_dir, daemon.address)
    agent.start()
    try:
        wait_for(agent.socket_path.exists, "the agent's socket")
        with ShimClient(agent.socket_path, command="no-bus-yet") as client:
            assert client.settings.anti_thrash is True
        agent.assert_alive()
        daemon.start()
        wait_for(daemon.name_has_owner, "the agent to register once the bus exists")
        assert get_property(daemon.address, "TimeQuantum") == "u 30"
        assert agent.log().count("dbus unavailable") == 1  # logged once, not per retry
    finally:
        agent.stop()
        daemon.stop()
