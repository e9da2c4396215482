"""A clean Debian bookworm root booted with real systemd as PID 1.

debootstrap (minbase, plus what the package depends on, so `apt install
./nvshare.deb` needs no network) runs once per machine; the finished root is
kept as a tarball under /var/cache/nvshare-ci/, keyed by the package list, and
each test run unpacks a fresh copy (seconds).  systemd-nspawn boots it;
commands run inside through `nsenter -t <container PID 1> -a`.

Measured on the CI machines: nspawn needs --register=no (no machined there)
and --keep-unit (no systemd on the host to make a scope).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

CACHE_DIR = Path(os.environ.get("NVSHARE_CI_CACHE", "/var/cache/nvshare-ci"))
MIRROR = os.environ.get("NVSHARE_CI_MIRROR", "http://deb.debian.org/debian")
SUITE = "bookworm"
# systemd and the bus to boot; the package's dependencies (python3-ply only
# because debootstrap cannot pick a virtual package for python3-pycparser).
INCLUDE = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "passwd",
    "python3",
    "python3-cffi",
    "python3-ply",
    "python3-dbus-next",
    "python3-sdnotify",
    "python3-typer",
    # What tests/shim runs besides the clients, for its run under the installed preload.
    "binutils",
    "gcc",
    "libc6-dev",
    "make",
    "valgrind",
    "python3-grpcio",
    "python3-protobuf",
    "python3-prometheus-client",
)
INSIDE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ContainerError(RuntimeError):
    pass


# Capabilities a booted container needs here (capability(7) numbers): nspawn's
# namespaces and mounts, and the container's own loopback device.
_NEEDED_CAPABILITIES = {21: "CAP_SYS_ADMIN", 12: "CAP_NET_ADMIN"}
WHERE_THE_FULL_SUITE_RUNS = (
    "the whole suite runs as root on a Debian 12 machine or VM, or in a privileged container "
    "(docker run --privileged) whose cgroup it may write (README, Tests)"
)


@functools.cache
def why_containers_cannot_boot() -> str | None:
    """Why systemd-nspawn cannot boot a container here, or None.  Inside a container
    (make check in docker, a nested nspawn) it cannot without CAP_SYS_ADMIN and
    CAP_NET_ADMIN (without the second nspawn goes on with no loopback device, and
    every test that connects to 127.0.0.1 inside fails: "Network is unreachable"),
    nor without a cgroup of its own to make the container's in ("Failed to create
    /../payload subcgroup").  Checked, then tried once: nspawn runs /usr/bin/true on
    a volatile copy of this root, which needs what a boot needs."""
    if os.geteuid() != 0:
        return "booting a container needs root"
    missing = [
        tool for tool in ("debootstrap", "systemd-nspawn", "nsenter") if not shutil.which(tool)
    ]
    if missing:
        return f"{', '.join(missing)} not installed (packaging/deps-test.txt)"
    effective = 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            effective = int(line.split()[1], 16)
    lacking = [name for bit, name in _NEEDED_CAPABILITIES.items() if not effective >> bit & 1]
    if lacking:
        return (
            f"this process lacks {' and '.join(lacking)}, which systemd-nspawn needs "
            f"(inside a container that was not given them?); {WHERE_THE_FULL_SUITE_RUNS}"
        )
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        path = line.split(":", 2)[2] if line.count(":") >= 2 else ""
        if line.startswith("0::") and (path == "/.." or path.startswith("/../")):
            return (
                f"this process's cgroup ({path}) is outside its cgroup namespace, so systemd-nspawn "
                f"cannot make the container's cgroup; {WHERE_THE_FULL_SUITE_RUNS}"
            )
    try:
        probe = subprocess.run(
            [
                "systemd-nspawn",
                "--register=no",
                "--keep-unit",
                "--quiet",
                "--private-network",
                "--volatile=yes",
                "--directory=/",
                "/usr/bin/true",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"systemd-nspawn did not run /usr/bin/true within 60 s; {WHERE_THE_FULL_SUITE_RUNS}"
    if probe.returncode != 0:
        said = (probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"])[-1]
        return f"systemd-nspawn cannot start a container here ({said}); {WHERE_THE_FULL_SUITE_RUNS}"
    return None


def skip_unless_containers_boot() -> None:
    """pytest.skip, with the reason, where no container can boot (issue 36: make
    check inside a container ended with 22 errors and no hint)."""
    import pytest

    reason = why_containers_cannot_boot()
    if reason:
        pytest.skip(f"no booted container here: {reason}")


def _root_tarball(suite: str, include: tuple[str, ...]) -> Path:
    key = hashlib.sha256(" ".join((suite, MIRROR) + include).encode()).hexdigest()[:12]
    return CACHE_DIR / f"{suite}-minbase-{key}.tar"


def ensure_root_tarball(log, suite: str = SUITE, include: tuple[str, ...] = INCLUDE) -> Path:
    """The cached root, made with debootstrap when missing.  Another suite and
    package list (tests/shim's older-glibc root) get a tarball of their own."""
    tarball = _root_tarball(suite, include)
    if tarball.exists():
        return tarball
    (CACHE_DIR / "debs").mkdir(parents=True, exist_ok=True)
    # One debootstrap at a time: two test runs at once (two checkouts) share debs/, and
    # when two made the same root together both failed.
    with open(CACHE_DIR / "debootstrap.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if tarball.exists():  # made by the run we waited for
            return tarball
        return _debootstrap_root(log, tarball, suite, include)


def _debootstrap_root(log, tarball: Path, suite: str, include: tuple[str, ...]) -> Path:
    work = Path(tempfile.mkdtemp(prefix="debootstrap-", dir=CACHE_DIR))
    try:
        root = work / "root"
        result = subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--cache-dir={CACHE_DIR / 'debs'}",
                "--include=" + ",".join(include),
                suite,
                str(root),
                MIRROR,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            log_tail = ""
            log_file = root / "debootstrap" / "debootstrap.log"
            if log_file.exists():
                log_tail = log_file.read_text(errors="replace")[-2000:]
            raise ContainerError(f"debootstrap failed: {result.stderr[-2000:]}\n{log_tail}")
        if "systemd" in include:
            # Boot quietly: no login prompt on the console the test never reads.
            (root / "etc/systemd/system/console-getty.service").symlink_to("/dev/null")
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(root), "-cf", str(partial), "."], check=True)
        partial.rename(tarball)  # a tarball under its final name is complete
        log(f"cached {tarball}")
        return tarball
    finally:
        shutil.rmtree(work, ignore_errors=True)


def copy_source_tree(repo: Path, dest: Path) -> None:
    """Copies to dest the files that make deb builds the package from
    (packaging/source-files.sh: those git tracks and the untracked ones it does
    not ignore; in a tree without .git, those .gitignore does not ignore)."""
    listed = subprocess.run(
        [str(repo / "packaging/source-files.sh")], capture_output=True, check=True
    ).stdout
    for name in (entry.decode() for entry in listed.split(b"\0") if entry):
        if (repo / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / name, dest / name)


def chrooted(
    root: Path, argv: list[str], *, binds, env: dict[str, str], mount_proc: bool = False
) -> list[str]:
    """The host command line that runs argv as a container of an unpacked root (no
    systemd inside): its own PID and mount namespaces, each (host path, path inside)
    of binds mounted as `docker run -v` would, /proc of its own if asked, and a clean
    environment.  Run as root; the mounts end with the namespace."""
    steps = [
        shlex.join(["mount", "--rbind", str(source), f"{root}{target}"]) for source, target in binds
    ]
    if mount_proc:
        steps.append(shlex.join(["mount", "-t", "proc", "proc", f"{root}/proc"]))
    steps.append(
        "exec "
        + shlex.join(
            ["chroot", str(root), "env", "-i", *[f"{k}={v}" for k, v in env.items()], *argv]
        )
    )
    return ["unshare", "--pid", "--fork", "--mount", "sh", "-c", " && ".join(steps)]


class Container:
    """One booted container; `run` executes a command inside it as root."""

    def __init__(self, root: Path, console_log: Path):
        self.root = root
        self.console_log = console_log
        self.nspawn: subprocess.Popen | None = None
        self.leader_pid = 0

    @classmethod
    def unpack(cls, tarball: Path, workdir: Path) -> Container:
        root = workdir / "root"
        root.mkdir()
        subprocess.run(["tar", "-C", str(root), "-xf", str(tarball)], check=True)
        return cls(root, workdir / "console.log")

    def boot(self, timeout: float = 120, private_network: bool = False) -> None:
        """private_network: the container gets a loopback device of its own and no
        other, so what it listens on (127.0.0.1:9402) is not the host's."""
        with open(self.console_log, "wb") as console:
            self.nspawn = subprocess.Popen(
                [
                    "systemd-nspawn",
                    "--register=no",
                    "--keep-unit",
                    "--quiet",
                    "--console=passive",
                    *(["--private-network"] if private_network else []),
                    "-D",
                    str(self.root),
                    "-b",
                ],
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                env={"PATH": os.environ.get("PATH", INSIDE_PATH), "SYSTEMD_LOG_LEVEL": "info"},
            )
        deadline = time.monotonic() + timeout
        children = Path(f"/proc/{self.nspawn.pid}/task/{self.nspawn.pid}/children")
        while not self.leader_pid:
            if self.nspawn.poll() is not None:
                raise ContainerError("systemd-nspawn exited: " + self._console_tail())
            if time.monotonic() > deadline:
                raise ContainerError("no container PID 1 appeared: " + self._console_tail())
            # nspawn's child first sets up the namespaces, then execs systemd.
            for pid in children.read_text().split() if children.exists() else []:
                if _comm(pid) == "systemd":
                    self.leader_pid = int(pid)
            if not self.leader_pid:
                time.sleep(0.1)
        while True:
            # Before systemd has its bus up, systemctl answers nothing; retry.
            state = self.run(
                ["systemctl", "is-system-running", "--wait"],
                check=False,
                timeout=max(1.0, deadline - time.monotonic()),
            )
            if state.stdout.strip() in ("running", "degraded"):
                return
            if time.monotonic() > deadline or state.stdout.strip() in ("maintenance", "stopping"):
                raise ContainerError(
                    f"boot ended {state.stdout.strip()!r} {state.stderr.strip()!r}: "
                    + self._console_tail()
                )
            time.sleep(0.2)

    def run(
        self,
        argv: list[str],
        *,
        check: bool = True,
        timeout: float = 120,
        env: dict[str, str] | None = None,
        input: str | None = None,
        cwd: str | None = None,
    ) -> subprocess.CompletedProcess:
        """argv inside the container, as root, with a clean environment (in cwd, a path
        inside the container, when given)."""
        inside_env = {
            "PATH": INSIDE_PATH,
            "LANG": "C.UTF-8",
            "HOME": "/root",
            "DEBIAN_FRONTEND": "noninteractive",
            "SYSTEMD_PAGER": "",
            "SYSTEMD_COLORS": "0",
        }
        inside_env.update(env or {})
        command = (
            ["nsenter", "-t", str(self.leader_pid), "-a"]
            + ([f"--wd={self.path(cwd)}"] if cwd else [])
            + ["env", "-i"]
            + [f"{k}={v}" for k, v in inside_env.items()]
            + argv
        )
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False, input=input
        )
        if check and result.returncode != 0:
            raise ContainerError(
                f"{' '.join(argv)} exited {result.returncode}: "
                f"{result.stdout[-1500:]}{result.stderr[-1500:]}"
            )
        return result

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        """argv inside the container, running beside the test (no environment)."""
        return subprocess.Popen(["nsenter", "-t", str(self.leader_pid), "-a"] + argv, **kwargs)

    def path(self, inside: str) -> Path:
        """The host path of a path inside the container."""
        return self.root / inside.lstrip("/")

    def shutdown(self, timeout: float = 60) -> None:
        if self.nspawn is None:
            return
        if self.nspawn.poll() is None and self.leader_pid:
            # nspawn turns SIGTERM into an orderly poweroff of the container.
            self.nspawn.send_signal(signal.SIGTERM)
            try:
                self.nspawn.wait(timeout)
            except subprocess.TimeoutExpired:
                self.nspawn.kill()
                self.nspawn.wait()
        self.nspawn = None

    def _console_tail(self) -> str:
        try:
            return self.console_log.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no console log)"


def _comm(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def wait_for(condition, timeout: float, what: str, interval: float = 0.2):
    """Polls condition() until it returns something truthy; generous timeouts,
    no sleeps standing in for assertions."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
