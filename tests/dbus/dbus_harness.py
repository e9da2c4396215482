"""Fixtures for the D-Bus control plane: a real dbus-daemon with a private
config that mirrors the system bus (default-deny, our policy file included),
and the real agent as a subprocess on that bus and a temp socket.

Everything waits for conditions with generous timeouts; nothing sleeps to time."""

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from dbus_next import Message, MessageType

from nvshare_agent import dbus_names as names

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_harness import unix_socket_accepts
from other_users import other_user_env, python_as

REPO = Path(__file__).resolve().parents[2]
POLICY_FILE = REPO / "systemd" / f"{names.BUS_NAME}.conf"
ACTIVATION_FILE = REPO / "systemd" / f"{names.BUS_NAME}.service"
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
TIMEOUT_S = 30.0

# The default policy of Debian's /usr/share/dbus-1/system.conf: connect, but
# own nothing and call nothing unless a service's policy file punches a hole.
SYSTEM_DEFAULT_POLICY = """
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus"
           send_interface="org.freedesktop.DBus.Introspectable"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Properties"/>
    <deny send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"
          send_member="UpdateActivationEnvironment"/>
  </policy>
  <policy user="root">
    <allow send_destination="org.freedesktop.DBus"
           send_interface="org.freedesktop.DBus.Monitoring"/>
  </policy>
"""

# Lets anyone call anything on our name: used to show that the agent's own
# uid check refuses what a too-permissive policy lets through.
PERMISSIVE_POLICY = f"""
  <policy context="default">
    <allow send_destination="{names.BUS_NAME}"/>
  </policy>
"""


def wait_for(condition, what: str, timeout_s: float = TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


class DbusDaemon:
    """A private dbus-daemon listening on a socket that every uid can reach."""

    def __init__(self, directory: Path, extra_policy: str = "", servicedir: Path | None = None):
        self.directory = directory
        self.socket_path = directory / "bus.sock"
        self.address = f"unix:path={self.socket_path}"
        self.config_path = directory / "bus.conf"
        servicedir_line = f"<servicedir>{servicedir}</servicedir>" if servicedir else ""
        self.config_path.write_text(f"""<!DOCTYPE busconfig PUBLIC
 "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>nvshare-test-system</type>
  <listen>{self.address}</listen>
  <auth>EXTERNAL</auth>
  {servicedir_line}
  {SYSTEM_DEFAULT_POLICY}
  <include>{POLICY_FILE}</include>
  {extra_policy}
</busconfig>
""")
        self.process = None
        self.log_path = directory / "dbus-daemon.log"

    def start(self):
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            ["dbus-daemon", f"--config-file={self.config_path}", "--nofork", "--nopidfile"],
            stdout=log,
            stderr=log,
        )
        log.close()
        # Listening, not only bound: the socket file comes with bind(), and a connect before
        # the daemon's listen() is refused (seen under CI's load).
        wait_for(
            lambda: unix_socket_accepts(self.socket_path) or self.process.poll() is not None,
            "dbus-daemon listening",
        )
        assert self.process.poll() is None, f"dbus-daemon died: {self.log_path.read_text()}"

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=TIMEOUT_S)
        if self.socket_path.exists():
            self.socket_path.unlink()

    def name_has_owner(self, name: str = names.BUS_NAME) -> bool:
        result = busctl(
            self.address,
            "call",
            "org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus",
            "NameHasOwner",
            "s",
            name,
            check=False,
        )
        return result.returncode == 0 and result.stdout.strip() == "b true"


def busctl(address: str, *args: str, user: list | None = None, check: bool = True):
    command = [*(user or []), "busctl", f"--address={address}", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    if check and result.returncode != 0:
        raise AssertionError(f"{command} failed: {result.stderr}")
    return result


def busctl_on_agent(address: str, verb: str, *args: str, **kwargs):
    """busctl VERB on our bus name, object path and interface."""
    return busctl(
        address, verb, names.BUS_NAME, names.OBJECT_PATH, names.INTERFACE, *args, **kwargs
    )


def nvsharectl(address: str, *args: str, user: list | None = None):
    if user:  # another user may not enter the checkout (other_users.py)
        command, env = (
            python_as(user, "-m", "nvshare_cli", "--bus", address, *args),
            other_user_env(),
        )
    else:
        command = [sys.executable, "-m", "nvshare_cli", "--bus", address, *args]
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)


class AgentProcess:
    def __init__(self, directory: Path, bus_address: str):
        self.socket_path = directory / "scheduler.sock"
        self.state_dir = directory / "state"
        self.log_path = directory / "agent.log"
        self.command = [
            sys.executable,
            "-m",
            "nvshare_agent",
            "--bus",
            bus_address,
            "--socket",
            str(self.socket_path),
            "--state-dir",
            str(self.state_dir),
            "--config",
            str(directory / "absent.conf"),
        ]
        self.process = None

    def start(self):
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def assert_alive(self):
        assert self.process.poll() is None, f"agent exited: {self.log()}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM, as systemd stops it; returns the exit status."""
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


@pytest.fixture
def world_dir():
    """A temp dir that the unprivileged test user can traverse (pytest's
    tmp_path is private to root)."""
    directory = Path(tempfile.mkdtemp(prefix="nvshare-dbus-"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def _start_bus(world_dir, extra_policy=""):
    daemon = DbusDaemon(world_dir, extra_policy)
    daemon.start()
    return daemon


def _start_agent(world_dir, daemon):
    agent = AgentProcess(world_dir, daemon.address)
    agent.start()
    wait_for(
        lambda: daemon.name_has_owner() or agent.process.poll() is not None,
        "the agent to own its bus name",
    )
    agent.assert_alive()
    wait_for(agent.socket_path.exists, "the agent's socket")
    return agent


@pytest.fixture
def bus(world_dir):
    daemon = _start_bus(world_dir)
    yield daemon
    daemon.stop()


@pytest.fixture
def agent(world_dir, bus):
    process = _start_agent(world_dir, bus)
    yield process
    process.assert_alive()  # whatever the test sent, the agent is still serving
    assert process.stop() == 0, process.log()  # and leaves the bus cleanly


@pytest.fixture
def permissive_bus(world_dir):
    daemon = _start_bus(world_dir, PERMISSIVE_POLICY)
    yield daemon
    daemon.stop()


@pytest.fixture
def agent_on_permissive_bus(world_dir, permissive_bus):
    process = _start_agent(world_dir, permissive_bus)
    yield process
    process.assert_alive()
    process.stop()


def dbus_send(
    address: str,
    member: str,
    *args: str,
    user: list | None = None,
    interface: str = "org.freedesktop.DBus.Properties",
):
    """dbus-send to the agent; unlike busctl it prints the D-Bus error name."""
    command = [
        *(user or []),
        "dbus-send",
        f"--bus={address}",
        f"--dest={names.BUS_NAME}",
        "--print-reply",
        names.OBJECT_PATH,
        f"{interface}.{member}",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)


def set_property(address: str, prop_name: str, typed_value: str, user: list | None = None):
    """typed_value in dbus-send syntax, e.g. uint32:5, boolean:false, string:abc."""
    return dbus_send(
        address,
        "Set",
        f"string:{names.INTERFACE}",
        f"string:{prop_name}",
        f"variant:{typed_value}",
        user=user,
    )


def get_property(address: str, prop_name: str, user: list | None = None) -> str:
    """The value as busctl prints it, e.g. 'u 30' or 'b true'."""
    return busctl_on_agent(address, "get-property", prop_name, user=user).stdout.strip()


def property_data(address: str, prop_name: str):
    """The value as busctl's JSON gives it: numbers, strings, and lists for arrays and structs."""
    result = busctl(
        address,
        "--json=short",
        "get-property",
        names.BUS_NAME,
        names.OBJECT_PATH,
        names.INTERFACE,
        prop_name,
    )
    return json.loads(result.stdout)["data"]


async def watch_properties_changed(connection, match: str) -> asyncio.Queue:
    """Subscribes a dbus-next connection to the PropertiesChanged signals that `match`
    (more of a match rule, e.g. "path='...'") picks; returns the queue they arrive on."""
    changes: asyncio.Queue = asyncio.Queue()
    connection.add_message_handler(
        lambda m: (
            changes.put_nowait(m)
            if m.message_type == MessageType.SIGNAL and m.member == "PropertiesChanged"
            else None
        )
    )
    await connection.call(
        Message(
            destination="org.freedesktop.DBus",
            path="/org/freedesktop/DBus",
            interface="org.freedesktop.DBus",
            member="AddMatch",
            signature="s",
            body=[
                f"type='signal',interface='org.freedesktop.DBus.Properties',"
                f"member='PropertiesChanged',{match}"
            ],
        )
    )
    return changes
