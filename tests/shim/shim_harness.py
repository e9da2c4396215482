"""Running the stand-in driver's clients under libnvshare.so, and reading what happened.

- Client: a client process (tests/standin/build/client_*) with the shim preloaded,
  the stand-in found as libcuda.so.1 and its call log in STANDIN_LOG.
- read_calls(path): the stand-in's call log as Call records, in the order the
  calls happened (every line is one O_APPEND write, so file order is time order
  across processes).
- GATED: the driver functions that run on the GPU and must wait for the lock.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "shim" / "build" / "libnvshare.so"
# The same objects for containers with an older glibc (shim/Makefile).
PORTABLE_SHIM = REPO / "shim" / "build" / "libnvshare-portable.so"
SHIM_ASAN = REPO / "shim" / "build" / "address" / "libnvshare.so"
STANDIN_BUILD = REPO / "tests" / "standin" / "build"
CLIENTS = ("linked", "dlsym", "procaddr")

# The stand-in's GPU 0, as NVML would print it ("Standin" + zeros + ordinal).
STANDIN_GPU = "GPU-5374616e-6469-6e00-0000-000000000000"

GATED = re.compile(
    r"^(cuLaunch(Kernel|KernelEx|CooperativeKernel)|cuGraphLaunch|cuMemcpy|cuMemset)"
)

# The shim's own variables and the stand-in's: tests set what they need, nothing leaks in.
_OWN_PREFIXES = ("NVSHARE_", "STANDIN_", "LD_PRELOAD", "LD_LIBRARY_PATH")

# Generous: CI is a loaded 2-core machine.
TIMEOUT_S = 60.0

NODE_PRELOAD_FILE = Path("/etc/ld.so.preload")


def build_alone(library: Path, *sources: Path, flags: tuple[str, ...] = ()) -> Path:
    """Some of the shim's files built into a library of their own, as the shim builds
    them, for tests that drive them directly (test_lock_machine.py, test_fair_look.py)."""
    source_dir = REPO / "shim"
    subprocess.run(
        ["gcc", "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared"]
        + ["-include", str(source_dir / "glibc_baseline.h"), f"-I{source_dir}", *flags]
        + [str(source) for source in sources]
        + ["-o", str(library)],
        check=True,
    )
    return library


def node_preloads_a_shim() -> bool:
    """Whether /etc/ld.so.preload names a libnvshare (an installed nvshare): then every
    process a test starts loads that copy too, after any LD_PRELOAD (ld.so(8))."""
    try:
        text = NODE_PRELOAD_FILE.read_text(errors="replace")
    except OSError:
        return False
    names = re.split(r"[\s:]+", "\n".join(line.split("#", 1)[0] for line in text.splitlines()))
    return any(Path(name).name.startswith("libnvshare") for name in names if name)


_HIDE_NODE_PRELOAD = 'mount --bind /dev/null /etc/ld.so.preload && exec "$@"'


def without_node_preload() -> list[str]:
    """A command prefix that runs a process as on a node without nvshare installed, for the
    tests that need one shim exactly (or none): in a mount namespace of its own where
    /etc/ld.so.preload reads empty.  No prefix on a node that preloads no shim.  Root
    makes the namespace; anyone else needs unprivileged user namespaces (Debian 12 has
    them), else the test skips."""
    if not node_preloads_a_shim():
        return []
    if os.geteuid() == 0:
        prefix = ["unshare", "--mount", "--propagation", "private"]
    else:
        prefix = ["unshare", "--user", "--map-current-user", "--mount"]
    prefix += ["sh", "-c", _HIDE_NODE_PRELOAD, "sh"]
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(
            "the node preloads an installed libnvshare and this user cannot hide it "
            f"from a test process ({probe.stderr.strip()[:200]})"
        )
    return prefix


@dataclass(frozen=True)
class Call:
    pid: int
    tid: int
    function: str
    t: float
    fields: dict = field(hash=False, compare=False)

    @property
    def gated(self) -> bool:
        return bool(GATED.match(self.function))


def read_calls(path: Path) -> list[Call]:
    calls = []
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return calls
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        fields = dict(p.split("=", 1) for p in parts[3:] if "=" in p)
        calls.append(
            Call(int(parts[0]), int(parts[1]), parts[2], float(fields.get("t", 0)), fields)
        )
    return calls


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_OWN_PREFIXES)}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def client_env(
    socket_path,
    standin_log,
    *,
    preload: str | None = str(SHIM),
    kernel_us: int = 1000,
    standin_build: Path = STANDIN_BUILD,
    **extra,
) -> dict:
    env = clean_env(
        LD_LIBRARY_PATH=str(standin_build),
        NVSHARE_SOCKET=str(socket_path),
        STANDIN_LOG=str(standin_log),
        STANDIN_KERNEL_US=str(kernel_us),
        **extra,
    )
    if preload:
        env["LD_PRELOAD"] = preload
    return env


class Client:
    """One client process; stdout/stderr go to files so nothing blocks on a pipe."""

    def __init__(
        self,
        workdir: Path,
        name: str,
        args=(),
        *,
        env: dict,
        prefix=(),
        label: str | None = None,
        standin_build: Path = STANDIN_BUILD,
    ):
        self.workdir = Path(workdir)
        label = label or f"{name}-{id(self):x}"
        self.stdout_path = self.workdir / f"{label}.out"
        self.stderr_path = self.workdir / f"{label}.err"
        self.argv = [*prefix, str(standin_build / f"client_{name}"), *map(str, args)]
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen(self.argv, stdout=out, stderr=err, env=env)
        self.pid = self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def wait(self, timeout: float = TIMEOUT_S) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(
                f"{self.argv} did not finish within {timeout:.0f} s\n{self.describe()}"
            )

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def warnings(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("[nvshare] warning:")]

    def result(self) -> dict:
        """The key=value pairs of the client's one result line."""
        lines = [line for line in self.stdout.splitlines() if line.startswith("client=")]
        assert len(lines) == 1, f"expected one result line\n{self.describe()}"
        return dict(p.split("=", 1) for p in lines[0].split())

    def describe(self) -> str:
        return f"--- stdout ---\n{self.stdout}--- stderr ---\n{self.stderr}"

    def finish_ok(self, timeout: float = TIMEOUT_S) -> dict:
        """Waits, asserts exit 0 and result=ok, returns the result line."""
        code = self.wait(timeout)
        assert code == 0, f"client exited {code}\n{self.describe()}"
        result = self.result()
        assert result["result"] == "ok", self.describe()
        return result

    def kill(self) -> None:
        if self.running():
            self.process.kill()
            self.process.wait()


_readable_build: tuple[Path, Path] | None = None


def readable_build() -> tuple[Path, Path]:
    """(the shim, the stand-in's build folder) copied where every user can read them, once
    per session: the tests that run clients as other uids must work from a checkout in
    a 0700 home (Debian 12's homes, /root), which those uids cannot enter."""
    global _readable_build
    if _readable_build is None:
        folder = Path(tempfile.mkdtemp(prefix="nvshare-tests-build-", dir="/tmp"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        standin = folder / "standin"
        standin.mkdir()
        for entry in STANDIN_BUILD.iterdir():
            if entry.name.startswith(("client_", "libcuda.so")) and not entry.is_dir():
                shutil.copy2(entry, standin / entry.name, follow_symlinks=True)
        shutil.copy2(SHIM, folder / SHIM.name)
        for root, _dirs, files in os.walk(folder):
            os.chmod(root, 0o755)
            for name in files:
                os.chmod(Path(root, name), 0o755)
        _readable_build = (folder / SHIM.name, standin)
    return _readable_build
