"""An agent on a node runs for months while every CUDA process that starts connects and
leaves, many of them by crashing.  After a thousand connections that leave in every way
there is, the agent holds the file descriptors it held before, shows no client and no
GPU it learned from them on the bus, and its log has no traceback."""

import os
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))
from agent_harness import GPU0, ShimClient
from dbus_harness import property_data, wait_for

from nvshare_agent import dbus_names as names
from nvshare_agent import protocol
from nvshare_agent.protocol import MessageType

ROUNDS = 150  # seven connections each


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _sockets_on(pid: int, socket_path) -> int:
    """The agent's sockets named by the scheduler's path: its listener and one per connection
    it has not closed (an accepted socket carries its listener's name in /proc/net/unix)."""
    with open("/proc/net/unix") as table:
        inodes = {
            int(fields[6])
            for fields in (line.split() for line in table)
            if len(fields) == 8 and fields[7] == str(socket_path)
        }
    held = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            held += os.stat(f"/proc/{pid}/fd/{fd}").st_ino in inodes
        except FileNotFoundError:
            pass  # closed while we looked
    return held


def _one_round(socket_path) -> None:
    # Takes the lock and gives it back, as a shim does.
    with ShimClient(socket_path, command="polite") as polite:
        polite.request()
        polite.release(polite.wait_grant())

    # Dies holding the lock, with another process queued behind it that dies too.
    holder = ShimClient(socket_path, command="crashes-holding")
    holder.request()
    holder.wait_grant()
    waiter = ShimClient(socket_path, command="crashes-waiting")
    waiter.request()
    waiter.close()
    holder.close()

    # Connects and leaves without a word.
    ShimClient(socket_path, hello=False).close()

    # Sends garbage: the agent answers with an ERROR frame and closes.
    with ShimClient(socket_path, hello=False) as garbage:
        garbage.send_raw(b"\xde\xad\xbe\xef" * 16)
        assert isinstance(garbage.expect_closed(), protocol.Error)

    # Names a GPU this node does not have and reports memory on it.
    stranger_gpu = uuid.uuid4().bytes
    with ShimClient(socket_path, gpus=(stranger_gpu,), command="stranger") as stranger:
        stranger.report_memory(stranger_gpu, 1 << 30)

    # Leaves in the middle of a frame.
    with ShimClient(socket_path, hello=False) as cut_off:
        cut_off.send_raw(protocol.encode_lock(MessageType.LOCK_REQUEST, GPU0)[:7])


def test_a_thousand_clients_leaving_every_way_leave_nothing_behind(agent, bus):
    pid = agent.process.pid
    _one_round(agent.socket_path)  # whatever the agent opens on first use, it opens now
    wait_for(
        lambda: _sockets_on(pid, agent.socket_path) == 1,
        "the first round's connections to be closed",
    )
    # The GPU inventory is read by a child process whose pipes close when it is done.
    wait_for(
        lambda: "no GPU inventory" in agent.log() or "gpu uuid=" in agent.log(), "the GPU inventory"
    )
    fds_before = _open_fds(pid)
    gpus_before = property_data(bus.address, names.PROP_GPUS)

    for _ in range(ROUNDS):
        _one_round(agent.socket_path)

    wait_for(lambda: _sockets_on(pid, agent.socket_path) == 1, "every connection to be closed")
    agent.assert_alive()
    assert property_data(bus.address, names.PROP_CLIENTS) == []
    assert property_data(bus.address, names.PROP_GPUS) == gpus_before
    assert _open_fds(pid) == fds_before
    # Still serving: the next client gets the lock at once.
    with ShimClient(agent.socket_path, command="after") as after:
        after.request()
        after.release(after.wait_grant())
    assert "Traceback" not in agent.log()
