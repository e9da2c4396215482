"""`nvsharectl preload enable|disable|status`: the system-wide preload switch.

The file editing itself is not here: it is the package's
/usr/lib/nvshare/preload-entry script (packaging/preload-entry in the
checkout), the same one the maintainer scripts run, so there is one
implementation of "change /etc/ld.so.preload without ever leaving it broken".

The operator's choice is remembered by the file /etc/nvshare/preload-disabled
(present = off).  The package's postinst reads it on every install and
upgrade, so a node switched off stays off across upgrades.
"""

from __future__ import annotations

import os
import subprocess
import sysconfig
from dataclasses import dataclass
from pathlib import Path

PRELOAD_FILE = Path("/etc/ld.so.preload")
# The shim's multiarch path, as the package installs it (DEB_HOST_MULTIARCH).
SHIM_PATH = (
    Path("/usr/lib")
    / (sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu")
    / "libnvshare.so"
)
DISABLED_MARKER = Path("/etc/nvshare/preload-disabled")
INSTALLED_HELPER = Path("/usr/lib/nvshare/preload-entry")
# A checkout (editable install): cli/ sits beside packaging/.
CHECKOUT_HELPER = Path(__file__).resolve().parent.parent / "packaging" / "preload-entry"

MARKER_TEXT = (
    "# Written by `nvsharectl preload disable`: while this file exists, the nvshare\n"
    "# package leaves libnvshare.so out of /etc/ld.so.preload, upgrades included.\n"
    "# `nvsharectl preload enable` removes it.\n"
)


@dataclass(frozen=True)
class PreloadStatus:
    chosen: bool  # the operator's choice: on unless disabled
    listed: bool  # the shim is in the preload file now
    shim_path: Path
    preload_file: Path


def _helper() -> Path:
    for candidate in (INSTALLED_HELPER, CHECKOUT_HELPER):
        if candidate.is_file():
            return candidate
    raise RuntimeError(f"{INSTALLED_HELPER} is missing; reinstall the nvshare package")


def _run_helper(action: str, shim_path: Path, preload_file: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["/bin/sh", str(_helper()), action, str(shim_path), str(preload_file)],
        capture_output=True,
        text=True,
        check=False,
    )


def _require_writable(directory: Path) -> None:
    if not os.access(directory, os.W_OK):
        raise PermissionError(f"cannot write {directory}")


def _change(action: str, shim_path: Path, preload_file: Path) -> None:
    _require_writable(preload_file.parent)
    result = _run_helper(action, shim_path, preload_file)
    if result.returncode != 0:
        # The helper's own one-line reason, without its "preload-entry: " tag.
        reason = (result.stderr.strip().splitlines() or [f"{action} failed"])[-1]
        raise RuntimeError(reason.removeprefix("preload-entry: "))


def read_status(
    *,
    shim_path: Path = SHIM_PATH,
    preload_file: Path = PRELOAD_FILE,
    disabled_marker: Path = DISABLED_MARKER,
) -> PreloadStatus:
    result = _run_helper("has", shim_path, preload_file)
    if result.returncode not in (0, 1):
        raise RuntimeError(result.stderr.strip() or f"cannot read {preload_file}")
    return PreloadStatus(
        chosen=not disabled_marker.exists(),
        listed=result.returncode == 0,
        shim_path=shim_path,
        preload_file=preload_file,
    )


def enable(
    *,
    shim_path: Path = SHIM_PATH,
    preload_file: Path = PRELOAD_FILE,
    disabled_marker: Path = DISABLED_MARKER,
) -> str:
    """Lists the shim in the preload file and forgets an earlier `disable`."""
    # Add first: if the shim cannot be preloaded, the operator's old choice stays.
    _change("add", shim_path, preload_file)
    disabled_marker.unlink(missing_ok=True)
    return f"preload enabled: new processes load {shim_path} (via {preload_file})"


def disable(
    *,
    shim_path: Path = SHIM_PATH,
    preload_file: Path = PRELOAD_FILE,
    disabled_marker: Path = DISABLED_MARKER,
) -> str:
    """Removes the shim from the preload file and remembers that across upgrades."""
    _require_writable(
        disabled_marker.parent if disabled_marker.parent.exists() else disabled_marker.parent.parent
    )
    # Remember first: an upgrade running between the two steps must not re-add it.
    disabled_marker.parent.mkdir(parents=True, exist_ok=True)
    disabled_marker.write_text(MARKER_TEXT)
    _change("remove", shim_path, preload_file)
    return (
        f"preload disabled: new processes no longer load {shim_path}; "
        "running ones keep it until they exit"
    )


def status(
    *,
    shim_path: Path = SHIM_PATH,
    preload_file: Path = PRELOAD_FILE,
    disabled_marker: Path = DISABLED_MARKER,
) -> str:
    now = read_status(
        shim_path=shim_path, preload_file=preload_file, disabled_marker=disabled_marker
    )
    if now.chosen and now.listed:
        return f"preload enabled: {shim_path} is listed in {preload_file}"
    if not now.chosen and not now.listed:
        return "preload disabled (by `nvsharectl preload disable`)"
    if now.chosen:
        return (
            f"preload enabled, but {shim_path} is missing from {preload_file}: "
            "run `nvsharectl preload enable`"
        )
    return (
        f"preload disabled, but {shim_path} is still listed in {preload_file}: "
        "run `nvsharectl preload disable`"
    )
