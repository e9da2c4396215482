"""nvshare.service's device policy lets the agent read its GPUs on this driver.

The unit runs the agent with DevicePolicy=closed and a DeviceAllow= list of
device groups, which systemd looks up by name in /proc/devices.  Drivers name
their groups differently (550 and older: "nvidia-frontend"; 580: "nvidia" and
"nvidiactl"), and a name that matches nothing silently leaves the device
blocked: NVML then fails inside the unit and the agent runs without its GPU
inventory.  So this runs the agent's own NVML reader, lists the NVIDIA device
nodes it holds open, and checks each against the unit's lines as systemd
would (no systemd on the GPU machine).
"""

import fnmatch
import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "nvshare.service"
PYNVML = REPO / "packaging" / "vendor" / "nvidia-ml-py-12.535.161"

# The agent's reader, with nvmlShutdown wrapped to list the open device nodes first.
READER = r"""
import json, os, stat, pynvml
from nvshare_agent import nvml_reader

nodes = []
real_shutdown = pynvml.nvmlShutdown

def shutdown_after_listing():
    for fd in os.listdir("/proc/self/fd"):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
            info = os.stat(f"/proc/self/fd/{fd}")
            flags = int(open(f"/proc/self/fdinfo/{fd}").read().split("flags:")[1].split()[0], 8)
        except (OSError, IndexError, ValueError):
            continue
        if stat.S_ISCHR(info.st_mode) and path.startswith("/dev/nvidia"):
            nodes.append({"path": path, "major": os.major(info.st_rdev),
                          "access": {0: "r", 1: "w", 2: "rw"}[flags & 3]})
    real_shutdown()

pynvml.nvmlShutdown = shutdown_after_listing
inventory = nvml_reader.read_inventory_here()
gpus, problem = inventory["gpus"], inventory["problem"]
# The agent's watcher (anti-thrash auto) also reads each GPU's processes: what it
# opens for that must be allowed too.
pynvml.nvmlInit()
processes = nvml_reader.processes_here(pynvml)
shutdown_after_listing()
print(json.dumps({"gpus": len(gpus), "problem": problem, "nodes": nodes,
                  "process_readings": len(processes)}))
"""


def device_allow(unit_text: str) -> list[tuple[str, str]]:
    rules = []
    for line in unit_text.splitlines():
        if line.startswith("DeviceAllow="):
            spec, access = line.split("=", 1)[1].split()
            rules.append((spec, access))
    return rules


def char_groups() -> dict[int, list[str]]:
    """/proc/devices' character section: major -> group names."""
    groups: dict[int, list[str]] = {}
    section = None
    for line in pathlib.Path("/proc/devices").read_text().splitlines():
        if line.endswith(":"):
            section = line
        elif line.strip() and section == "Character devices:":
            major, name = line.split()
            groups.setdefault(int(major), []).append(name)
    return groups


def allowed(node: dict, rules, groups) -> bool:
    for spec, access in rules:
        if not set(node["access"]) <= set(access):
            continue
        if spec == node["path"]:
            return True
        if spec.startswith("char-") and any(
            fnmatch.fnmatchcase(name, spec[len("char-") :])
            for name in groups.get(node["major"], [])
        ):
            return True
    return False


def test_every_node_the_nvml_reader_opens_is_allowed_by_the_unit(agent_pythonpath):
    env = dict(os.environ, PYTHONPATH=f"{agent_pythonpath}:{PYNVML}")
    done = subprocess.run(
        [sys.executable, "-c", READER], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    reading = json.loads(done.stdout.strip().splitlines()[-1])
    assert reading["problem"] is None and reading["gpus"] >= 1, reading
    assert reading["process_readings"] == reading["gpus"], reading
    assert reading["nodes"], "the NVML reader held no /dev/nvidia* node open"
    rules, groups = device_allow(UNIT.read_text()), char_groups()
    blocked = [node for node in reading["nodes"] if not allowed(node, rules, groups)]
    names = {node["major"]: groups.get(node["major"]) for node in reading["nodes"]}
    assert not blocked, f"blocked by {UNIT.name}: {blocked}; /proc/devices names {names}"
