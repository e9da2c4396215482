"""What the agent reads from disk at start: the config file (--config) and the settings
saved at run time (<state dir>/settings.json).  Whatever lies there, the agent either
starts (a bad state file is one warning, and the config's values apply; a config file
it cannot use is one error line, and the defaults apply: test_config_problems.py); it
never hangs, grows or crashes."""

from __future__ import annotations

import os

import pytest
from agent_harness import FAST_CONFIG, AgentProcess, ShimClient

# The agent runs with a 2 GiB address space: a file it would read without end fails
# it (MemoryError) long before the machine runs short.
LIMITED_MEMORY = ["prlimit", f"--as={2 << 30}", "--"]


class LimitedAgent(AgentProcess):
    def command(self) -> list[str]:
        return LIMITED_MEMORY + super().command()


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def make_state_file(state_dir, kind: str) -> None:
    state_dir.mkdir()
    path = state_dir / "settings.json"
    if kind == "nested-1000-deep":
        path.write_text(nested(1000))  # 2 kB; a RecursionError ended the agent before
    elif kind == "nested-value":
        path.write_text('{"time_quantum_s": ' + nested(990) + "}")
    elif kind == "fifo":
        os.mkfifo(path)  # hung the agent before it listened
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "binary":
        path.write_bytes(bytes(range(256)))
    elif kind == "too-large":
        path.write_text('{"time_quantum_s": 7' + " " * 70_000 + "}")


@pytest.mark.parametrize(
    "kind",
    [
        "nested-1000-deep",
        "nested-value",
        "fifo",
        "dev-zero",
        "directory",
        "binary",
        "too-large",
    ],
)
def test_any_state_file_is_one_warning_and_the_configs_values(tmp_path, kind):
    state_dir = tmp_path / "state"
    make_state_file(state_dir, kind)
    agent = LimitedAgent(tmp_path / "a", state_dir=state_dir).start()
    try:
        with ShimClient(agent.socket_path) as client:
            assert client.settings.time_quantum_ms == 1000  # FAST_CONFIG's 1 s
        agent.wait_for_log("WARNING ignoring saved settings .*settings.json")
    finally:
        code = agent.stop()
    warnings = [line for line in agent.log().splitlines() if "ignoring saved settings" in line]
    assert len(warnings) == 1 and len(warnings[0]) < 400, agent.log()
    assert "Traceback" not in agent.log()
    assert code == 0, agent.log()


@pytest.mark.parametrize(
    "kind, message",
    [
        ("fifo", "not a regular file but a FIFO"),
        ("dev-zero", "not a regular file but a character device"),
        ("directory", "not a regular file but a directory"),
        ("too-large", "larger than 64 KiB"),
    ],
)
def test_a_config_that_is_no_regular_small_file_is_one_error_line_and_the_defaults(
    tmp_path, kind, message
):
    agent = LimitedAgent(tmp_path / "a", config=None)
    config = agent.config_path
    if kind == "fifo":
        os.mkfifo(config)  # hung the agent before
    elif kind == "dev-zero":
        config = agent.config_path = "/dev/zero"  # grew the agent's memory without bound before
    elif kind == "directory":
        config.mkdir()
    elif kind == "too-large":
        config.write_text(FAST_CONFIG + "# padding\n" * 8000)
    agent.start()
    try:
        with ShimClient(agent.socket_path) as client:
            assert client.settings.time_quantum_ms == 30_000  # the defaults
    finally:
        assert agent.stop() == 0, agent.log()
    errors = [line for line in agent.log().splitlines() if " ERROR " in line]
    assert len(errors) == 1 and len(errors[0]) < 600, agent.log()
    assert f"ERROR config error: config {config}: cannot read it: {message}" in errors[0]
    assert "Traceback" not in agent.log()


def test_a_config_saved_with_a_utf8_byte_order_mark_is_read(tmp_path):
    # Notepad and some other editors begin UTF-8 files with U+FEFF; it was refused
    # with "line 1 comes before any [scheduler] header", which it does not.
    agent = AgentProcess(tmp_path / "a", config="\ufeff" + FAST_CONFIG.replace("= 1\n", "= 7\n", 1))
    agent.start()
    try:
        with ShimClient(agent.socket_path) as client:
            assert client.settings.time_quantum_ms == 7000
    finally:
        assert agent.stop() == 0
