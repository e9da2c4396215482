"""nvshare-device-plugin.service reads NVML as nvshare.service does, so it
allows the same device nodes (tests/gpu/test_unit_device_access.py checks the
agent's lines against a real driver), and runs what the package installs."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLUGIN_UNIT = (REPO / "systemd/nvshare-device-plugin.service").read_text()
AGENT_UNIT = (REPO / "systemd/nvshare.service").read_text()


def lines_starting(unit_text: str, *keys: str) -> list[str]:
    return [line for line in unit_text.splitlines() if line.startswith(keys)]


def test_the_plugin_unit_allows_the_device_nodes_the_agent_unit_allows():
    keys = ("DevicePolicy=", "DeviceAllow=", "PrivateDevices=")
    assert lines_starting(PLUGIN_UNIT, *keys) == lines_starting(AGENT_UNIT, *keys)
    assert lines_starting(PLUGIN_UNIT, "Environment=PYTHONPATH=") == lines_starting(
        AGENT_UNIT, "Environment=PYTHONPATH="
    )


def test_the_plugin_unit_writes_only_where_its_condition_points():
    (condition,) = lines_starting(PLUGIN_UNIT, "ConditionPathExists=")
    (writable,) = lines_starting(PLUGIN_UNIT, "ReadWritePaths=")
    path_unit = (REPO / "systemd/nvshare-device-plugin.path").read_text()
    (watched,) = lines_starting(path_unit, "PathExists=")
    directory = condition.split("=", 1)[1]
    assert writable.split("=", 1)[1] == watched.split("=", 1)[1] == directory
    assert directory == "/var/lib/kubelet/device-plugins"
