"""`--version` of both programs prints pyproject.toml's version, installed or run from
the checkout."""

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from nvshare_agent import version as version_module

REPO = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


@pytest.mark.parametrize(
    "module, program", [("nvshare_agent", "nvshare-agent"), ("nvshare_cli", "nvsharectl")]
)
def test_version_prints_pyprojects_version(module, program):
    done = subprocess.run(
        [sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=30
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{program} {VERSION}\n", "")


def test_nvsharectl_version_wins_over_the_rest_of_the_line():
    # Eager: no bus is opened and a bad option after it is never read.
    done = subprocess.run(
        [sys.executable, "-m", "nvshare_cli", "--version", "--bus", "nowhere", "status"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (done.returncode, done.stdout) == (0, f"nvsharectl {VERSION}\n"), done.stderr


def test_without_installed_metadata_the_checkouts_pyproject_says(monkeypatch):
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    assert version_module.version() == VERSION
