"""A config file the agent cannot use never leaves the node unscheduled (issue 36):
the agent serves with the last good config (a copy it keeps in its state
directory), else the defaults, and says what is wrong and on which line: one
ERROR line in its log and, under systemd, its STATUS= line.  Fixing the file and
restarting brings the new settings.  (D-Bus, nvsharectl and the metrics:
tests/dbus/test_config_problem.py; under a booted systemd:
tests/packaging/test_config_faults_in_container.py.)"""

from __future__ import annotations

import socket

import pytest
from agent_harness import FAST_CONFIG, TIMEOUT_S, AgentProcess, ShimClient

from nvshare_agent.daemon import status_line
from nvshare_agent.settings_files import LAST_GOOD_CONFIG_NAME
from nvshare_agent.snapshot import AgentSnapshot

DEFAULT_QUANTUM_MS = 30_000
BAD_CONFIGS = [
    ("[scheduler]\ntime_quantum = 0\n", "line 2: time_quantum: time quantum must be 1..86400"),
    (
        "[scheduler]\n# why\n\nanti_thrash = maybe\n",
        "line 4: anti_thrash: anti-thrash must be on, off or auto, got 'maybe'",
    ),
    ("[scheduler]\ntime_quantum = 5\nspeed = 3\n", "line 3: unknown key 'speed' in [scheduler]"),
    ("time_quantum = 5\n", "line 1: a key before any section (begin with [scheduler])"),
    (
        "[scheduler]\ntime_quantum = 3\ntime_quantum = 4\n",
        "line 3: time_quantum is set twice in [scheduler]",
    ),
    ("[scheduler]\n= 3\n", "line 2: not 'key = value'"),
    ("[scheduler]\n\n[other]\nx = 1\n", "line 3: unknown section [other]"),
    ("[DEFAULT]\ntime_quantum = 5\n", "line 1: unknown section [DEFAULT]"),
    ("[scheduler]\nmemory_limit = lots\n", "line 2: memory_limit: a size is a whole number"),
    ("[gpu:1]\ntime_quantum = ten\n", "line 2: [gpu:1] time_quantum must be a whole number"),
]


def config_errors(agent: AgentProcess) -> list[str]:
    return [line for line in agent.log().splitlines() if " ERROR config error: " in line]


def quantum_ms(agent: AgentProcess) -> int:
    with ShimClient(agent.socket_path) as client:
        return client.settings.time_quantum_ms


@pytest.mark.parametrize("text, where", BAD_CONFIGS, ids=range(len(BAD_CONFIGS)))
def test_a_bad_config_is_one_error_line_naming_the_line_and_the_agent_serves(tmp_path, text, where):
    agent = AgentProcess(tmp_path / "a", config=text).start()
    try:
        # Served, and scheduled: a lock is granted, with the defaults (no good config before).
        with ShimClient(agent.socket_path) as client:
            assert client.settings.time_quantum_ms == DEFAULT_QUANTUM_MS
            client.request()
            client.wait_grant()
    finally:
        assert agent.stop() == 0, agent.log()
    (line,) = config_errors(agent)
    assert f"config error: config {agent.config_path} {where}" in line, line
    assert "serving with the built-in defaults (no config was good before)" in line
    assert "fix the file, then restart the agent (systemctl restart nvshare)" in line
    assert "Traceback" not in agent.log()


def test_the_last_good_config_is_served_until_the_file_is_fixed_and_the_agent_restarted(
    tmp_path,
):
    agent = AgentProcess(tmp_path / "a", config=FAST_CONFIG.replace("= 1\n", "= 7\n", 1))
    kept = agent.state_dir / LAST_GOOD_CONFIG_NAME
    agent.start()
    try:
        assert quantum_ms(agent) == 7000
    finally:
        assert agent.stop() == 0
    assert kept.read_text() == agent.config_path.read_text()

    # A typo: the last good config's 7 s, not the defaults' 30 s; the copy stays as it was.
    agent.config_path.write_text(FAST_CONFIG.replace("= 1\n", "= 9\nanti-thrash = on\n", 1))
    agent.start()
    try:
        assert quantum_ms(agent) == 7000
    finally:
        assert agent.stop() == 0
    (line,) = config_errors(agent)
    assert f"config {agent.config_path} line 3: unknown key 'anti-thrash'" in line
    assert f"serving with the last good config (a copy in {kept})" in line
    assert "time_quantum = 7" in kept.read_text()

    # Fixed and restarted: the file's settings, nothing said.
    agent.config_path.write_text(FAST_CONFIG.replace("= 1\n", "= 9\n", 1))
    agent.start()
    try:
        assert quantum_ms(agent) == 9000
    finally:
        assert agent.stop() == 0
    assert len(config_errors(agent)) == 1, agent.log()  # still the one from before
    assert "time_quantum = 9" in kept.read_text()


def test_a_deleted_config_means_the_defaults_and_no_last_good_copy(tmp_path):
    agent = AgentProcess(tmp_path / "a").start()
    assert agent.stop() == 0
    agent.config_path.unlink()
    agent.start()
    try:
        assert quantum_ms(agent) == DEFAULT_QUANTUM_MS
    finally:
        assert agent.stop() == 0
    assert not (agent.state_dir / LAST_GOOD_CONFIG_NAME).exists()
    assert config_errors(agent) == []


def test_changes_made_at_run_time_still_win_over_the_last_good_config(tmp_path):
    agent = AgentProcess(tmp_path / "a")  # FAST_CONFIG: 1 s
    agent.state_dir.mkdir(parents=True)
    (agent.state_dir / "settings.json").write_text('{"time_quantum_s": 11}\n')
    agent.start()
    assert agent.stop() == 0
    agent.config_path.write_text("[scheduler\n")
    agent.start()
    try:
        assert quantum_ms(agent) == 11_000
    finally:
        assert agent.stop() == 0
    assert len(config_errors(agent)) == 1


def test_the_status_line_names_the_problem_first_and_stays_short():
    snapshot = AgentSnapshot(gpus=(), clients=())
    assert status_line(snapshot, config_problem="") == "0 clients"
    line = status_line(snapshot, config_problem="config /etc/x line 3: unknown key 'speed'")
    assert line == "CONFIG ERROR: config /etc/x line 3: unknown key 'speed'; 0 clients"
    long = status_line(snapshot, max_bytes=200, config_problem="x" * 5000)
    assert long.startswith("CONFIG ERROR: xxx") and long.endswith("…; 0 clients")
    assert len(long.encode()) <= 200


def test_the_problem_is_the_status_line_under_systemd(tmp_path):
    notify_path = tmp_path / "notify.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(notify_path))
    listener.settimeout(TIMEOUT_S)
    agent = AgentProcess(
        tmp_path / "a", config="[scheduler]\nspeed = 3\n", env={"NOTIFY_SOCKET": str(notify_path)}
    )
    try:
        agent.start()
        while not (message := listener.recv(4096).decode()).startswith("STATUS="):
            pass
        assert message.startswith(
            f"STATUS=CONFIG ERROR: config {agent.config_path} line 2: unknown key 'speed'"
        ), message
        assert message.endswith("; 0 clients"), message
    finally:
        agent.stop()
        listener.close()
