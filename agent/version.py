"""The version that pyproject.toml gives, for `--version` of nvshare-agent and nvsharectl."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

DISTRIBUTION = "nvshare"


def version() -> str:
    """The installed package's version (the .deb, or the checkout's editable install);
    run from a checkout without an install, pyproject.toml's own line."""
    # Here, not at the top: importlib.metadata costs ~10 ms, and the agent starts often
    # (socket activation, restarts) while --version is asked for rarely.
    from importlib import metadata

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


class VersionAction(argparse.Action):
    """`--version` for argparse, looked up only when asked for (argparse's own takes
    the text when the parser is made)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"{parser.prog} {version()}", file=sys.stdout)
        parser.exit()
