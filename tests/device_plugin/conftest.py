"""Fixtures for the device plugin's tests.

- kubelet: the stand-in kubelet (standin_kubelet.py) serving in a fresh
  device-plugin directory.
- start_plugin(*args): `python -m nvshare_device_plugin` on that directory, its
  GPUs from the stand-in pynvml (tests/agent/fake_nvml: two GPUs and a MIG
  instance, which is left out), read every 0.2 s.  One still running at
  teardown is stopped with SIGTERM, which must end it with status 0.
- hide_gpus(*uuids): the stand-in pynvml leaves these GPUs out from now on.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from plugin_harness import PluginProcess, plugin_env
from standin_kubelet import StandinKubelet


@pytest.fixture
def kubelet_dir():
    # Short: a UNIX socket's path has room for 107 bytes, and pytest's tmp_path
    # with a long test name leaves too few.
    directory = Path(tempfile.mkdtemp(prefix="kubelet-", dir="/tmp")) / "device-plugins"
    directory.mkdir()
    yield directory
    shutil.rmtree(directory.parent, ignore_errors=True)


@pytest.fixture
def kubelet(kubelet_dir):
    standin = StandinKubelet(kubelet_dir).start()
    yield standin
    standin.stop()


@pytest.fixture
def hidden_gpus_file(tmp_path) -> Path:
    return tmp_path / "hidden-gpus"


@pytest.fixture
def hide_gpus(hidden_gpus_file):
    def hide(*uuids: str) -> None:
        partial = hidden_gpus_file.with_suffix(".partial")
        partial.write_text("".join(f"{uuid}\n" for uuid in uuids))
        partial.rename(hidden_gpus_file)  # the reader never sees half a list

    return hide


@pytest.fixture
def shim_file(tmp_path) -> Path:
    shim = tmp_path / "libnvshare-portable.so"
    shim.write_bytes(b"")
    return shim


@pytest.fixture
def start_plugin(kubelet_dir, shim_file, hidden_gpus_file, tmp_path):
    started: list[PluginProcess] = []

    def start(*args: str, fake_nvml_mode: str = "two-gpus") -> PluginProcess:
        argv = [
            sys.executable,
            "-m",
            "nvshare_device_plugin",
            "--kubelet-dir",
            str(kubelet_dir),
            "--shim-path",
            str(shim_file),
            "--inventory-interval",
            "0.2",
            *args,
        ]
        plugin = PluginProcess(
            argv,
            plugin_env(hidden_gpus_file, fake_nvml_mode),
            tmp_path / f"plugin{len(started)}.log",
        )
        started.append(plugin)
        return plugin

    yield start
    # One that ended before teardown was the test's to check.
    running = [plugin for plugin in started if plugin.running()]
    for plugin in running:
        status = plugin.stop()
        assert status == 0, f"the plugin ended with status {status}: {plugin.log()[-2000:]}"
