"""Python run as another user (nobody, an unprivileged uid) by a test.

The checkout, its .venv and pytest's temporary folders may sit where other users cannot
enter: Debian 12 makes home folders 0700, and pytest's base temporary folder is 0700. So
what such a process imports (the installed packages, nvshare_agent and nvshare_cli as the
editable install maps them, this folder's harness) is copied once per test session into a
folder every user can read, and the system's Python runs it."""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# What only builds and installs packages; nothing a test process imports.
LEFT_OUT = {"pip", "setuptools", "wheel", "pkg_resources", "_distutils_hack", "__pycache__"}

_readable_path: Path | None = None


def _copy_tree(source: Path, target: Path) -> None:
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))


def readable_python_path() -> Path:
    """The world-readable folder of everything a test's other-user process imports."""
    global _readable_path
    if _readable_path is None:
        folder = Path(tempfile.mkdtemp(prefix="nvshare-tests-other-users-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        site_packages = Path(sysconfig.get_paths()["purelib"])
        for entry in site_packages.iterdir():
            if (
                entry.name in LEFT_OUT
                or entry.name.startswith("__editable__")
                or entry.suffix == ".pth"
            ):
                continue
            if entry.is_dir():
                _copy_tree(entry, folder / entry.name)
            else:
                shutil.copy2(entry, folder / entry.name)
        for package in ("nvshare_agent", "nvshare_cli", "nvshare_metrics"):
            spec = importlib.util.find_spec(package)
            _copy_tree(Path(next(iter(spec.submodule_search_locations))), folder / package)
        shutil.copy2(HERE / "agent_harness.py", folder / "agent_harness.py")
        for root, dirs, files in os.walk(folder):
            for name in dirs + files + ["."]:
                os.chmod(Path(root, name), 0o755 if name == "." or name in dirs else 0o644)
        _readable_path = folder
    return _readable_path


def python_as(user: list[str], *args: str) -> list[str]:
    """A command running the system's Python as user (a setpriv prefix) on args; pass
    other_user_env() as its environment.  -P: the working folder (the test's, maybe in
    a 0700 home) is not put on sys.path; Python 3.11 stops with a PermissionError at the
    first import when the user cannot enter it (sudo make check in an admin's checkout)."""
    return [*user, os.path.realpath(sys.executable), "-s", "-P", *args]


def other_user_env(**extra: str) -> dict:
    return {
        **os.environ,
        "PYTHONPATH": str(readable_python_path()),
        "PYTHONDONTWRITEBYTECODE": "1",
        **extra,
    }
