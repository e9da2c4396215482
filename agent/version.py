"""The version that pyproject.toml gives, for `--version` of nvshare-agent and nvsharectl."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "nvshare"


def version() -> str:
    """The installed package's version (the .deb, or the checkout's editable install);
    run from a checkout without an install, pyproject.toml's own line."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    # In a checkout this file is agent/version.py, beside ../pyproject.toml.
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        found = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.MULTILINE)
    except OSError:
        found = None
    return found.group(1) if found else "unknown"
