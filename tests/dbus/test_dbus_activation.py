"""The shipped activation file, with only Exec= pointed at this checkout's
agent, lets a call to the bus name start the agent.  (On a real system bus
SystemdService= hands the start to systemd; a private bus has no systemd, so
dbus-daemon runs Exec= itself.)"""

import os
import shlex
import signal

import pytest
from dbus_harness import (
    ACTIVATION_FILE,
    AgentProcess,
    DbusDaemon,
    busctl,
    get_property,
    nvsharectl,
    wait_for,
)

from nvshare_agent import dbus_names as names


@pytest.mark.root
def test_call_to_the_bus_name_starts_the_agent(world_dir):
    servicedir = world_dir / "services"
    servicedir.mkdir()
    daemon = DbusDaemon(world_dir, servicedir=servicedir)
    agent = AgentProcess(world_dir, daemon.address)  # only for its command line and paths
    lines = [
        f"Exec={shlex.join(agent.command)}" if line.startswith("Exec=") else line
        for line in ACTIVATION_FILE.read_text().splitlines()
    ]
    (servicedir / ACTIVATION_FILE.name).write_text("\n".join(lines) + "\n")
    daemon.start()
    try:
        assert not daemon.name_has_owner()
        result = nvsharectl(daemon.address, "status", "--json")
        assert result.returncode == 0, result.stderr
        assert daemon.name_has_owner()
        assert get_property(daemon.address, "TimeQuantum") == "u 30"
    finally:
        if daemon.name_has_owner():
            pid = busctl(
                daemon.address,
                "call",
                "org.freedesktop.DBus",
                "/org/freedesktop/DBus",
                "org.freedesktop.DBus",
                "GetConnectionUnixProcessID",
                "s",
                names.BUS_NAME,
            ).stdout.split()[1]
            os.kill(int(pid), signal.SIGTERM)
            wait_for(lambda: not daemon.name_has_owner(), "the activated agent to stop")
        daemon.stop()
