"""nvshare-device-plugin on a real driver: the GPUs it advertises are the ones
nvidia-smi lists, 10 replicas each and Healthy, and Allocate names the GPU by
the UUID that NVIDIA's container runtime expects.  The kubelet is the stand-in
of tests/device_plugin; NVML is the real one (the agent's reader)."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "device_plugin"))

from plugin_harness import PluginProcess  # noqa: E402
from standin_kubelet import StandinKubelet  # noqa: E402


def test_the_plugin_advertises_the_gpus_nvidia_smi_lists(agent_pythonpath, tmp_path):
    listed = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert listed and all(uuid.startswith("GPU-") for uuid in listed)
    pythonpath = Path(agent_pythonpath.split(":")[0])
    if not (pythonpath / "nvshare_device_plugin").exists():
        (pythonpath / "nvshare_device_plugin").symlink_to(REPO / "device_plugin")
    shim = tmp_path / "libnvshare-portable.so"
    shim.write_bytes(b"")
    # Short: a UNIX socket's path has room for 107 bytes.
    kubelet_dir = Path(tempfile.mkdtemp(prefix="kubelet-", dir="/tmp")) / "device-plugins"
    kubelet = StandinKubelet(kubelet_dir).start()
    plugin = PluginProcess(
        [
            sys.executable,
            "-m",
            "nvshare_device_plugin",
            "--kubelet-dir",
            str(kubelet_dir),
            "--shim-path",
            str(shim),
        ],
        dict(os.environ, PYTHONPATH=agent_pythonpath),
        tmp_path / "plugin.log",
    )
    try:
        registration = kubelet.wait_for_registration(timeout=60)
        assert registration.request.resource_name == "nvshare.com/gpu"
        devices = kubelet.next_devices(timeout=60)
        assert devices == [(f"{uuid}::{n}", "Healthy") for uuid in listed for n in range(10)]
        given = kubelet.allocate([f"{listed[-1]}::9"]).container_responses[0]
        assert given.envs["NVIDIA_VISIBLE_DEVICES"] == listed[-1]
    finally:
        status = plugin.stop()
        kubelet.stop()
        shutil.rmtree(kubelet_dir.parent, ignore_errors=True)
    assert status == 0, plugin.log()
    print(plugin.log())
