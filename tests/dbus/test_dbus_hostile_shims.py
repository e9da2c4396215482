"""Whatever one local process sends the agent's socket, the bus view (Clients,
GetAll, nvsharectl status) keeps working for everyone else."""

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from dbus_next import Message

AGENT_TESTS = Path(__file__).resolve().parents[1] / "agent"
sys.path.insert(0, str(AGENT_TESTS))
from agent_harness import GPU0, ShimClient  # noqa: E402
from dbus_harness import TIMEOUT_S, nvsharectl, watch_properties_changed  # noqa: E402
from other_users import other_user_env, python_as  # noqa: E402

from nvshare_agent import dbus_names as names  # noqa: E402
from nvshare_agent.dbus_api import DBusApi  # noqa: E402
from nvshare_agent.dbus_connection import connect_bus  # noqa: E402
from nvshare_agent.dbus_contract import load_contract  # noqa: E402
from nvshare_agent.dbus_properties import clients_to_dbus  # noqa: E402
from nvshare_agent.protocol import ErrorCode  # noqa: E402
from nvshare_agent.settings import Settings  # noqa: E402
from nvshare_agent.settings_sources import SettingsOrigin  # noqa: E402
from nvshare_agent.snapshot import AgentSnapshot, ClientGpuSnapshot, ClientSnapshot  # noqa: E402

# uid_t and gid_t are unsigned: ids past 2**31 are valid (user namespaces,
# systemd-nspawn's private ranges).
HIGH_ID = 3_000_000_000


def test_memory_report_beyond_64_bits_is_refused_and_the_others_still_show(agent, bus):
    with (
        ShimClient(agent.socket_path, command="bystander"),
        ShimClient(agent.socket_path, command="overflow") as liar,
    ):
        liar.report_memory(GPU0, 2**64 - 1, 1)
        error = liar.expect_closed(timeout=5)
        assert error is not None and error.code == ErrorCode.PROTOCOL, error
        assert "64 bits" in error.text
        result = nvsharectl(bus.address, "clients", "--json")
        assert result.returncode == 0, result.stderr
        assert [client["command"] for client in json.loads(result.stdout)] == ["bystander"]


def test_client_with_ids_past_2_31_shows_as_they_are(agent, bus):
    script = (
        "import sys\nfrom agent_harness import ShimClient\n"
        f"client = ShimClient({str(agent.socket_path)!r}, command='high-ids')\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    shim = subprocess.Popen(
        python_as(
            ["setpriv", f"--reuid={HIGH_ID}", f"--regid={HIGH_ID}", "--clear-groups"], "-c", script
        ),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=other_user_env(),
    )
    try:
        assert shim.stdout.readline() == "ready\n"
        with ShimClient(agent.socket_path, command="bystander"):
            result = nvsharectl(bus.address, "clients", "--json")
            assert result.returncode == 0, result.stderr
            shown = {
                client["command"]: (client["uid"], client["gid"])
                for client in json.loads(result.stdout)
            }
            assert shown["high-ids"] == (HIGH_ID, HIGH_ID) and "bystander" in shown
    finally:
        shim.stdin.close()
        shim.wait(TIMEOUT_S)


def test_a_number_out_of_range_is_clamped_not_a_broken_property():
    # The last line of defence: whatever the core lets through, the Clients
    # property must still marshal, or no one can read any client.
    snapshot = AgentSnapshot(
        gpus=(),
        clients=(
            ClientSnapshot(-1, 2**32, 7, "odd", (ClientGpuSnapshot("GPU-x", "idle", 2**64, 0.0),)),
            ClientSnapshot(42, 1000, 1000, "fine", ()),
        ),
    )
    clients = clients_to_dbus(snapshot)
    Message(path="/x", member="M", signature=names.CLIENTS_SIGNATURE, body=[clients])._marshall()
    assert clients[0][:3] == [0, 2**32 - 1, 7] and clients[0][4][0][2] == 2**64 - 1
    assert clients[1][:4] == [42, 1000, 1000, "fine"]


class _StubAgent:
    """Just what the D-Bus adapter reads of the engine."""

    def __init__(self):
        self.settings = Settings()
        self.settings_origin = SettingsOrigin()
        self.clients = ()

    def snapshot(self):
        return AgentSnapshot(gpus=(), clients=self.clients)

    def gpu_statistics(self):
        return {}


async def test_a_property_the_bus_cannot_carry_does_not_hold_back_the_others(bus):
    stub = _StubAgent()
    service = await connect_bus(bus.address, TIMEOUT_S)
    api = DBusApi(service, stub, load_contract())
    watcher = await connect_bus(bus.address, TIMEOUT_S)
    try:
        service.add_message_handler(api.handle)
        signals = await watch_properties_changed(watcher, f"sender='{service.unique_name}'")
        stub.settings = Settings(time_quantum_s=7)
        stub.clients = (ClientSnapshot(1, 2, 3, None, ()),)  # no D-Bus string
        api.publish_changes()
        changed = (await asyncio.wait_for(signals.get(), 5)).body[1]
        # Clients cannot go; the others that changed do (ClientDetails: the client is new).
        assert "Clients" not in changed and changed["TimeQuantum"].value == 7
        assert set(changed) == {"TimeQuantum", "ClientDetails"}
    finally:
        watcher.disconnect()
        service.disconnect()
