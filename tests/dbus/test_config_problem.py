"""A config file the agent could not use is said on D-Bus (ConfigProblem), by
`nvsharectl status` (first, whole) and its --json, and in a metrics scrape
(nvshare_config_error), with the line at fault; "" and 0 while the file is good.
(The agent's side: tests/agent/test_config_problems.py.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from dbus_harness import (
    AgentProcess,
    busctl_on_agent,
    dbus_send,
    nvsharectl,
    property_data,
    wait_for,
)

from nvshare_agent import dbus_names as names

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "metrics"))
from metrics_harness import exchange, exporter_command, get, samples

BAD = "[scheduler]\ntime_quantum = 12\n\nspeed = 3\n"


@pytest.fixture
def agent_with_a_bad_config(world_dir, bus):
    config = world_dir / "nvshare.conf"
    config.write_text(BAD)
    agent = AgentProcess(world_dir, bus.address)
    agent.command[agent.command.index("--config") + 1] = str(config)
    agent.start()
    wait_for(lambda: bus.name_has_owner() or agent.process.poll() is not None, "the agent")
    agent.assert_alive()
    yield agent, config
    assert agent.stop() == 0, agent.log()


def scrape(address: str) -> dict:
    answer = exchange(exporter_command(address), get())
    assert answer.status == 200, answer
    return samples(answer.body.decode())


def test_a_bad_config_is_said_on_dbus_by_nvsharectl_and_in_the_metrics(
    agent_with_a_bad_config, bus
):
    _, config = agent_with_a_bad_config
    problem = property_data(bus.address, names.PROP_CONFIG_PROBLEM)
    assert problem.startswith(
        f"config {config} line 4: unknown key 'speed' in [scheduler] (known: "
    ), problem
    assert "; serving with the built-in defaults (no config was good before)" in problem
    assert property_data(bus.address, names.PROP_TIME_QUANTUM) == 30

    text = nvsharectl(bus.address, "status")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"CONFIG ERROR: config {config} line 4: ")
    assert all(len(line) <= 80 for line in lines), text.stdout
    # Wrapped, never cut: the whole sentence is there.
    block = " ".join(line.strip() for line in lines[: lines.index("")])
    assert block == f"CONFIG ERROR: {problem}"

    status = json.loads(nvsharectl(bus.address, "status", "--json").stdout)
    assert status["config_problem"] == problem

    found = scrape(bus.address)
    assert found[("nvshare_config_error", frozenset({("problem", problem)}))] == 1


def test_a_good_config_says_nothing(agent, bus):
    assert property_data(bus.address, names.PROP_CONFIG_PROBLEM) == ""
    assert "CONFIG" not in nvsharectl(bus.address, "status").stdout
    assert json.loads(nvsharectl(bus.address, "status", "--json").stdout)["config_problem"] == ""
    assert scrape(bus.address)[("nvshare_config_error", frozenset({("problem", "")}))] == 0


def test_config_problem_is_read_only(agent, bus):
    result = dbus_send(
        bus.address,
        "Set",
        f"string:{names.INTERFACE}",
        f"string:{names.PROP_CONFIG_PROBLEM}",
        "variant:string:",
    )
    assert "org.freedesktop.DBus.Error.PropertyReadOnly" in result.stderr, result.stderr
    assert busctl_on_agent(bus.address, "get-property", "ConfigProblem").stdout.strip() == 's ""'
