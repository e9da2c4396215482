"""Who a client is (agent/identity.py): /proc/PID/cgroup as systemd, container
runtimes and the kubelet lay it out, and the lookup over a real connection."""

import asyncio
import os
import pwd

import pytest
from agent_harness import GPU0, AsyncShimClient

from nvshare_agent.identity import ClientIdentity, identify, parse_cgroup

POD = "0f6a3a52-5c55-4b0e-9ad5-6d1c2b1f6f0e"
CONTAINER = "4c2b8e1f9a7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b"


@pytest.mark.parametrize(
    "text, unit, container",
    [
        (
            "0::/system.slice/jupyter-alice-singleuser.service\n",
            "jupyter-alice-singleuser.service",
            "",
        ),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", "session-3.scope", ""),
        ("0::/system.slice/run-u42.service\n", "run-u42.service", ""),
        (
            "0::/user.slice/user-1000.slice/user@1000.service/app.slice/app-gnome-x.scope\n",
            "app-gnome-x.scope",
            "",
        ),
        (f"0::/system.slice/docker-{CONTAINER}.scope\n", "", f"docker:{CONTAINER[:12]}"),
        (
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{POD.replace('-', '_')}.slice/cri-containerd-{CONTAINER}.scope\n",
            "",
            f"pod:{POD}/{CONTAINER[:12]}",
        ),
        (f"0::/kubepods/besteffort/pod{POD}/{CONTAINER}\n", "", f"pod:{POD}"),
        # cgroup v1: the systemd hierarchy names the unit.
        (
            "12:cpu,cpuacct:/system.slice/x.service\n1:name=systemd:/system.slice/notebook.service\n",
            "notebook.service",
            "",
        ),
        ("0::/\n", "", ""),
        ("", "", ""),
    ],
    ids=[
        "spawner",
        "session",
        "systemd-run",
        "user-app",
        "docker",
        "kubepods",
        "kube-v1",
        "v1",
        "root",
        "empty",
    ],
)
def test_the_cgroup_names_the_unit_and_the_container(text, unit, container):
    assert parse_cgroup(text) == (unit, container)


def test_a_process_gone_or_a_user_unknown_gives_empty_strings(tmp_path):
    assert identify(2**31 - 1, 4_000_000_000, proc=str(tmp_path)) == ClientIdentity()


async def test_status_names_the_user_of_a_client(start_inproc_agent):
    agent, path = await start_inproc_agent()
    client = await AsyncShimClient.connect(path, (GPU0,), "notebook")
    name = pwd.getpwuid(os.getuid()).pw_name
    for _ in range(200):
        clients = agent.snapshot().clients
        if clients and clients[0].user:
            break
        await asyncio.sleep(0.01)
    assert clients[0].user == name
    with open("/proc/self/cgroup") as cgroup:
        assert clients[0].unit == parse_cgroup(cgroup.read())[0]
    await client.close()
