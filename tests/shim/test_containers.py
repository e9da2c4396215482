"""The shim in containers: processes in their own root and PID namespace, with an
older glibc than the build host's, reaching the host's agent through its socket
directory bind-mounted at /run/nvshare (README.md, "Containers").

The container root is Debian bullseye (glibc 2.31, as Ubuntu 20.04's CUDA
images): debootstrap once per machine, cached like tests/packaging's root.  The
stand-in driver and its client are built inside it with its own gcc, so they
need nothing newer than the container has.  Each container is `unshare --pid
--mount` plus `chroot`, with the socket directory and the shim bind-mounted as
`docker run -v` would."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from shim_harness import PORTABLE_SHIM, REPO, SHIM, STANDIN_GPU, TIMEOUT_S, Call, read_calls
from test_gating import assert_kernels_never_overlap

sys.path.insert(0, str(REPO / "tests" / "packaging"))
from bookworm_container import chrooted, ensure_root_tarball

OLD_SUITE = "bullseye"
OLD_GLIBC = (2, 31)
OLD_INCLUDE = ("gcc", "libc6-dev", "make")
# Where the shim appears inside a container (the docker recipe's -v target).
SHIM_INSIDE = "/usr/lib/nvshare/libnvshare.so"
STANDIN_INSIDE = "/opt/standin"

_skip_without_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("debootstrap") or not shutil.which("unshare"),
    reason="needs root, debootstrap and unshare (packaging/deps-test.txt)",
)


def needs_root(test):
    return pytest.mark.root(pytest.mark.container(_skip_without_root(test)))


def glibc_versions_needed(library: Path) -> list[tuple[int, ...]]:
    """The GLIBC_x.y versions the library's undefined symbols ask for."""
    out = subprocess.run(
        ["readelf", "--wide", "-V", str(library)], capture_output=True, text=True, check=True
    ).stdout
    needs = out.split("Version needs section", 1)[1]
    return sorted(
        {tuple(map(int, v.split("."))) for v in re.findall(r"Name: GLIBC_([0-9.]+)", needs)}
    )


def needed_libraries(library: Path) -> set[str]:
    out = subprocess.run(
        ["readelf", "-d", str(library)], capture_output=True, text=True, check=True
    ).stdout
    return set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out))


def exported_symbols(library: Path) -> set[str]:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def test_portable_shim_needs_nothing_newer_than_glibc_2_17():
    assert max(glibc_versions_needed(PORTABLE_SHIM)) <= (2, 17), glibc_versions_needed(
        PORTABLE_SHIM
    )
    # Before glibc 2.34 dlopen and pthread_create are in these two, not in libc.
    assert {"libdl.so.2", "libpthread.so.0"} <= needed_libraries(PORTABLE_SHIM)
    assert exported_symbols(PORTABLE_SHIM) == exported_symbols(SHIM), (
        "the same objects, linked twice"
    )


def test_the_hosts_shim_loads_no_library_a_modern_process_does_not_already_have():
    # /etc/ld.so.preload loads it into every process on the node: on glibc 2.34 and later
    # libdl and libpthread are empty stubs, two file loads for nothing.
    assert needed_libraries(SHIM) == {"libc.so.6", "ld-linux-x86-64.so.2"}


class OldGlibcRoot:
    """A bullseye root with the stand-in driver and client built inside."""

    def __init__(self, path: Path):
        self.path = path

    def containerised(
        self, argv: list[str], *, socket_dir: Path, shim: Path, env: dict[str, str]
    ) -> list[str]:
        """argv in a container of this root, with the socket directory and the shim bind-mounted."""
        return chrooted(
            self.path,
            argv,
            binds=[(socket_dir, "/run/nvshare"), (shim, SHIM_INSIDE)],
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **env},
        )


@pytest.fixture(scope="module")
def old_root(tmp_path_factory) -> OldGlibcRoot:
    tarball = ensure_root_tarball(print, suite=OLD_SUITE, include=OLD_INCLUDE)
    base = tmp_path_factory.mktemp("bullseye")
    if os.statvfs(base).f_flag & os.ST_NODEV:
        # The root's /dev/null is a device node, which a nodev /tmp (systemd's tmp.mount,
        # many CI runners) will not open: unpack it beside the cached tarball instead.
        base = Path(tempfile.mkdtemp(prefix="bullseye-", dir=tarball.parent))
        if os.statvfs(base).f_flag & os.ST_NODEV:
            pytest.skip(f"{tmp_path_factory.getbasetemp()} and {tarball.parent} are nodev")
    path = base / "root"
    path.mkdir()
    subprocess.run(["tar", "-C", str(path), "-xf", str(tarball)], check=True)
    (path / "run" / "nvshare").mkdir(parents=True)
    (path / SHIM_INSIDE.lstrip("/")).parent.mkdir(parents=True)
    (path / SHIM_INSIDE.lstrip("/")).touch()  # a mount point for the bind mount
    shutil.copytree(
        REPO / "tests" / "standin",
        path / STANDIN_INSIDE.lstrip("/"),
        ignore=shutil.ignore_patterns("build"),
    )
    built = subprocess.run(
        [
            "chroot",
            str(path),
            "make",
            "-s",
            "-C",
            STANDIN_INSIDE,
            "build/libcuda.so.1",
            "build/client_linked",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    glibc = subprocess.run(
        ["chroot", str(path), "ldd", "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert f"{OLD_GLIBC[0]}.{OLD_GLIBC[1]}" in glibc.splitlines()[0], glibc
    yield OldGlibcRoot(path)
    shutil.rmtree(base, ignore_errors=True)


@needs_root
@pytest.mark.parametrize(
    "shim,loads", [(PORTABLE_SHIM, True), (SHIM, False)], ids=["portable", "host-build"]
)
def test_a_process_that_never_uses_cuda_runs_unchanged_under_an_old_glibc(
    old_root, world, shim, loads
):
    argv = old_root.containerised(
        ["sh", "-c", "echo hello; ls /run/nvshare >/dev/null"],
        socket_dir=world.socket_dir,
        shim=shim,
        env={"LD_PRELOAD": SHIM_INSIDE},
    )
    result = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    if loads:
        assert (result.returncode, result.stdout, result.stderr) == (0, "hello\n", "")
    else:
        # Why the portable build exists: the host's finds no dlopen where glibc before
        # 2.34 keeps it, and a preloaded object that cannot bind stops the process before main.
        assert result.returncode != 0 and "undefined symbol: dlopen" in result.stderr, result


@needs_root
def test_processes_in_two_containers_take_turns_through_the_hosts_agent(old_root, world, agent):
    logs, containers = [], []
    for index in range(2):
        log_inside = f"/tmp/standin-{index}.log"
        logs.append(old_root.path / log_inside.lstrip("/"))
        env = {
            "LD_PRELOAD": SHIM_INSIDE,
            "LD_LIBRARY_PATH": f"{STANDIN_INSIDE}/build",
            "STANDIN_LOG": log_inside,
            "STANDIN_KERNEL_US": "20000",
        }
        # No NVSHARE_SOCKET: the shim finds the agent at its default path, as in a real container.
        argv = old_root.containerised(
            [f"{STANDIN_INSIDE}/build/client_linked", "--loops", "2", "--launches", "10"],
            socket_dir=world.socket_dir,
            shim=PORTABLE_SHIM,
            env=env,
        )
        containers.append(
            subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    results = [c.communicate(timeout=TIMEOUT_S) for c in containers]
    for (stdout, stderr), container in zip(results, containers):
        assert container.returncode == 0, (stdout, stderr)
        fields = dict(p.split("=", 1) for p in stdout.split())
        assert (fields["result"], fields["managed"], fields["pid"]) == ("ok", "1", "1"), (
            stdout,
            stderr,
        )

    agent.wait_for_log(r"INFO disconnect pid=\d+", count=2)
    host_pids = [
        int(p) for p in re.findall(rf"INFO connect pid=(\d+) .*gpus={STANDIN_GPU}", agent.log())
    ]
    assert len(set(host_pids)) == 2 and 1 not in host_pids, agent.log()
    grants = [int(p) for p in re.findall(rf"grant gpu={STANDIN_GPU} pid=(\d+)", agent.log())]
    assert set(grants) == set(host_pids), agent.log()
    # Both containers' processes are PID 1 to themselves: tell their calls apart by log.
    merged = sorted(
        (
            Call(index + 1, c.tid, c.function, c.t, c.fields)
            for index, log in enumerate(logs)
            for c in read_calls(log)
        ),
        key=lambda c: c.t,
    )
    for index in (1, 2):
        starts = sum(c.pid == index and c.function == "@kernel_start" for c in merged)
        done = sum(c.pid == index and c.function == "@kernel_done" for c in merged)
        assert starts == done >= 2 * 10, f"container {index}: {starts} kernels started, {done} done"
    assert_kernels_never_overlap(merged)
