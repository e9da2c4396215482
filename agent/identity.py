"""Who a client is, beyond its pid and uid: the user's name, and where the node
says the process comes from (its systemd unit, its container or pod), read
from /proc/PID/cgroup.

identify() blocks (the user database may be LDAP through NSS): the engine
calls it off the event loop, once per connection.  A process that has already
exited, or a node that cannot tell, gives empty strings: status then shows
what it always showed.
"""

from __future__ import annotations

import pwd
import re
from dataclasses import dataclass

# Beyond this, a cgroup file is not one a process has.
MAX_CGROUP_BYTES = 64 * 1024

_UNIT = re.compile(r"[^/]+\.(service|scope)$")
# Container runtimes' scopes under systemd: docker-<id>.scope, cri-containerd-<id>.scope,
# crio-<id>.scope, libpod-<id>.scope (podman); and cgroupfs' /docker/<id>.
_CONTAINER = re.compile(
    r"(?:^|/)(docker|cri-containerd|crio|libpod)[-/]([0-9a-f]{12,64})(?:\.scope)?$"
)
# kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/...
_POD = re.compile(r"kubepods[^/]*-pod([0-9a-f_]{36})\.slice|/pod([0-9a-f-]{36})/")


@dataclass(frozen=True, slots=True)
class ClientIdentity:
    user: str = ""  # the uid's name, "" when the user database has none
    unit: str = ""  # its systemd unit (jupyter-alice-singleuser.service, session-3.scope)
    container: str = ""  # "pod:<uid>", "docker:<id>", ... (ids cut to 12 characters)


def parse_cgroup(text: str) -> tuple[str, str]:
    """(unit, container) from the text of /proc/PID/cgroup (v2, or v1's systemd line)."""
    path = ""
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, cgroup_path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            path = cgroup_path  # cgroup v2: the one line that matters
            break
        if controllers == "name=systemd":
            path = cgroup_path
    unit = ""
    for part in reversed(path.split("/")):
        if _UNIT.match(part):
            unit = part
            break
    container = ""
    pod = _POD.search(path)
    found = _CONTAINER.search(path)
    if pod:
        pod_uid = (pod.group(1) or pod.group(2)).replace("_", "-")
        container = f"pod:{pod_uid}"
        if found:
            container += f"/{found.group(2)[:12]}"
    elif found:
        runtime = {"cri-containerd": "containerd", "libpod": "podman"}.get(found.group(1))
        container = f"{runtime or found.group(1)}:{found.group(2)[:12]}"
    if container and unit.startswith(("docker-", "cri-containerd-", "crio-", "libpod-")):
        unit = ""  # the scope only repeats the container's id
    return unit, container


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return ""


def uid_of(name: str) -> int | None:
    """The uid of a user name (a share group named user:NAME), None when unknown."""
    try:
        return pwd.getpwnam(name).pw_uid
    except (KeyError, ValueError):
        return None


def identify(pid: int, uid: int, proc: str = "/proc") -> ClientIdentity:
    try:
        with open(f"{proc}/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            unit, container = parse_cgroup(f.read(MAX_CGROUP_BYTES))
    except OSError:
        unit, container = "", ""
    return ClientIdentity(user_name(uid), unit, container)
