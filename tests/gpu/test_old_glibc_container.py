"""The portable shim in containers of an older distribution, on the real GPU.

The root (Debian bullseye, glibc 2.31) comes from tests/gpu/make_old_glibc_root.sh
as a tarball named by NVSHARE_OLD_GLIBC_ROOT: the GPU machine cannot reach a
mirror to make one.  Each container is `unshare --pid --mount` plus `chroot`,
with what a GPU container runtime and README.md's recipe bind-mount: the
driver's libcuda.so.1, /dev, /sys, the agent's socket directory at /run/nvshare
and libnvshare-portable.so; LD_PRELOAD names the shim."""

import os
import pathlib
import re
import subprocess
import sys

import pytest
from json_program import bench

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "packaging"))
from bookworm_container import chrooted  # noqa: E402

ROOT_TARBALL = os.environ.get("NVSHARE_OLD_GLIBC_ROOT", "")
DRIVER_DIR_INSIDE = "/usr/local/nvidia/lib64"

pytestmark = pytest.mark.skipif(
    not ROOT_TARBALL,
    reason="NVSHARE_OLD_GLIBC_ROOT names no root tarball (tests/gpu/make_old_glibc_root.sh)",
)


def host_libcuda() -> pathlib.Path:
    listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    found = re.findall(r"libcuda\.so\.1 \(libc6,x86-64\) => (\S+)", listing)
    assert found, listing
    return pathlib.Path(found[0]).resolve()


@pytest.fixture
def old_root(tmp_path, shim_library):
    root = tmp_path / "root"
    root.mkdir()
    subprocess.run(["tar", "-C", str(root), "-xJf", ROOT_TARBALL], check=True)
    subprocess.run(
        [
            "nvcc",
            "-cubin",
            "-arch=native",
            "-o",
            str(root / "add_one.cubin"),
            str(HERE / "add_one.cu"),
        ],
        check=True,
    )
    (root / DRIVER_DIR_INSIDE.lstrip("/") / "libcuda.so.1").touch()
    return root


def containerised(root: pathlib.Path, socket_dir: pathlib.Path, argv: list[str]) -> list[str]:
    binds = [
        (socket_dir, "/run/nvshare"),
        (bench.PORTABLE_SHIM, "/usr/lib/nvshare/libnvshare.so"),
        (host_libcuda(), f"{DRIVER_DIR_INSIDE}/libcuda.so.1"),
        ("/dev", "/dev"),
        ("/sys", "/sys"),
    ]
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LD_LIBRARY_PATH": DRIVER_DIR_INSIDE,
        "LD_PRELOAD": "/usr/lib/nvshare/libnvshare.so",
        "NVSHARE_DEBUG": "1",
    }
    return chrooted(root, argv, binds=binds, env=env, mount_proc=True)


def test_two_old_glibc_containers_share_the_gpu_through_the_hosts_agent(old_root, start_agent):
    agent = start_agent(time_quantum_s=1, idle_release_ms=200)
    glibc = subprocess.run(
        ["chroot", str(old_root), "ldd", "--version"], capture_output=True, text=True
    ).stdout
    assert "2.31" in glibc.splitlines()[0], glibc
    argv = ["old_glibc_client", "/add_one.cubin", str(64 << 20), "300"]  # 256 MiB each
    containers = [
        subprocess.Popen(
            containerised(old_root, agent.socket.parent, argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [container.communicate(timeout=120) for container in containers]
    for (out, err), container in zip(outputs, containers):
        assert container.returncode == 0, out + err[-3000:]
        assert "result=ok wrong=0 managed=1 pid=1" in out, out + err[-3000:]
        assert "connected to the agent at /run/nvshare/scheduler.sock" in err, err[-3000:]
    connects = [int(event["pid"]) for event in agent.events("connect")]
    assert len(set(connects)) == 2 and 1 not in connects, agent.log()
    assert {int(event["pid"]) for event in agent.events("grant")} == set(connects), agent.log()
