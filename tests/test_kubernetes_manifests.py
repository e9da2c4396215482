"""The files in kubernetes/ parse and agree with the plugin, the package and
docs/kubernetes.md.  No cluster, kubectl or Docker daemon checks them here
(docs/kubernetes.md, "What was run, and what was not")."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from nvshare_device_plugin.__main__ import DEFAULT_KUBELET_DIR, DEFAULT_SHIM_PATH

REPO = Path(__file__).resolve().parents[1]
KUBERNETES = REPO / "kubernetes"
OPTION = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")


def manifest(name: str) -> dict:
    return yaml.safe_load((KUBERNETES / name).read_text())


def version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_the_notebook_asks_for_one_nvshare_gpu_and_for_nothing_the_plugin_gives():
    pod = manifest("notebook.yaml")
    assert (pod["apiVersion"], pod["kind"]) == ("v1", "Pod")
    (container,) = pod["spec"]["containers"]
    assert container["resources"] == {"limits": {"nvshare.com/gpu": 1}}
    # The environment and the mounts come from the plugin's Allocate answer.
    assert "env" not in container and "volumeMounts" not in container
    assert "volumes" not in pod["spec"]


def test_docs_show_the_notebook_example_as_the_file_has_it():
    text = (KUBERNETES / "notebook.yaml").read_text()
    without_header = re.sub(r"\A(#.*\n)+", "", text)
    blocks = re.findall(r"```yaml\n(.*?)```", (REPO / "docs/kubernetes.md").read_text(), re.S)
    assert without_header in blocks


def test_the_daemonset_runs_the_plugin_with_options_it_accepts_and_the_paths_it_names():
    daemonset = manifest("device-plugin-daemonset.yaml")
    assert (daemonset["apiVersion"], daemonset["kind"]) == ("apps/v1", "DaemonSet")
    pod = daemonset["spec"]["template"]
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    assert container["image"] == f"nvshare-device-plugin:{version()}"

    help_text = subprocess.run(
        [sys.executable, "-m", "nvshare_device_plugin", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    accepted = set(OPTION.findall(help_text))
    options = dict(arg.split("=", 1) for arg in container["args"])
    assert set(options) <= accepted, set(options) - accepted

    # The plugin's directories are the node's, mounted at the same paths: it names
    # them to the kubelet, which mounts them from the node into other pods.
    mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["spec"]["volumes"]}

    def host_path(path: str) -> str:
        return volumes[mounts[path]["name"]]["hostPath"]["path"]

    assert options["--kubelet-dir"] == str(DEFAULT_KUBELET_DIR)
    assert host_path(options["--kubelet-dir"]) == options["--kubelet-dir"]
    assert options["--shim-path"] == str(DEFAULT_SHIM_PATH)
    shim_dir = str(Path(options["--shim-path"]).parent)
    assert host_path(shim_dir) == shim_dir and mounts[shim_dir]["readOnly"]


def test_the_dockerfile_builds_the_image_the_daemonset_names_from_the_package():
    dockerfile = (KUBERNETES / "Dockerfile").read_text()
    assert f"-t nvshare-device-plugin:{version()} build/" in dockerfile
    assert "COPY nvshare_*_amd64.deb" in dockerfile
    unit = (REPO / "systemd/nvshare-device-plugin.service").read_text()
    program = re.search(r"^ExecStart=(\S+)", unit, re.M)[1]
    assert f'ENTRYPOINT ["{program}"]' in dockerfile
    # The unit's private pynvml, for the image too.
    assert "ENV PYTHONPATH=/usr/lib/nvshare/python" in dockerfile
    assert "Environment=PYTHONPATH=/usr/lib/nvshare/python" in unit
