"""Share groups over D-Bus (io.github.nvshare.Shares1) and nvsharectl share: set, read
back, refused for a user outside nvshare-admin, kept across a restart; bad input is a
one-line error and the agent stays up."""

import concurrent.futures
import json

from dbus_harness import NOBODY, _start_agent, busctl, nvsharectl

from nvshare_agent import dbus_names as names

SHARES = "io.github.nvshare.Shares1"


def shares_call(address, *args, user=None):
    return busctl(
        address, "call", names.BUS_NAME, names.OBJECT_PATH, SHARES, *args, user=user, check=False
    )


def shares_property(address, name):
    result = busctl(
        address, "get-property", "--json=short", names.BUS_NAME, names.OBJECT_PATH, SHARES, name
    )
    return json.loads(result.stdout)["data"]


def test_a_share_is_set_read_back_and_kept_across_a_restart(world_dir, bus):
    agent = _start_agent(world_dir, bus)
    result = shares_call(
        bus.address, "SetShare", "sa{sv}", "user:4001", "2", "weight", "u", "2",
        "memory_cap_bytes", "t", str(4 << 30),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert shares_property(bus.address, "Shares") == {
        "user:4001": {
            "weight": {"type": "u", "data": 2},
            "memory_cap_bytes": {"type": "t", "data": 4 << 30},
        }
    }
    result = nvsharectl(bus.address, "share", "set", "user:4002", "--weight", "3")
    assert result.returncode == 0, result.stderr
    result = busctl(
        bus.address, "set-property", names.BUS_NAME, names.OBJECT_PATH, SHARES, "ShareBy", "s",
        "unit",
    )  # fmt: skip
    assert agent.stop() == 0
    restarted = _start_agent(world_dir, bus)
    try:
        shares = shares_property(bus.address, "Shares")
        assert shares["user:4001"]["weight"]["data"] == 2
        assert shares["user:4002"]["weight"]["data"] == 3
        assert shares_property(bus.address, "ShareBy") == "unit"
        shown = json.loads(nvsharectl(bus.address, "share", "--json").stdout)
        assert shown["share_by"] == "unit"
        assert shown["shares"]["user:4001"] == {"weight": 2, "memory_cap_bytes": 4 << 30}
        result = nvsharectl(bus.address, "share", "reset", "user:4001")
        assert result.returncode == 0, result.stderr
        assert "user:4001" not in shares_property(bus.address, "Shares")
    finally:
        assert restarted.stop() == 0


def test_a_user_outside_nvshare_admin_is_refused(bus, agent):
    result = shares_call(
        bus.address, "SetShare", "sa{sv}", "user:4001", "1", "weight", "u", "5", user=NOBODY
    )
    assert result.returncode != 0 and "Access denied" in result.stderr
    result = nvsharectl(bus.address, "share", "set", "user:4001", "--weight", "5", user=NOBODY)
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1
    assert shares_property(bus.address, "Shares") == {}


def test_bad_shares_get_a_one_line_error_and_the_agent_stays_up(bus, agent):
    for args, message in (
        (("SetShare", "sa{sv}", "process:42", "1", "weight", "u", "2"), "a share group is"),
        (("SetShare", "sa{sv}", "user:4001", "1", "weight", "u", "0"), "weight must be 1..1000"),
        (("SetShare", "sa{sv}", "user:4001", "1", "weight", "s", "x"), "of D-Bus type 'u'"),
        (("SetShare", "sa{sv}", "user:4001", "0"), "needs weight or memory_cap_bytes"),
        (("ResetShare", "s", "user:no-such-user-here"), "no user named"),
    ):
        result = shares_call(bus.address, *args)
        assert result.returncode != 0 and message in result.stderr, (args, result.stderr)
    result = nvsharectl(bus.address, "share", "set", "user:4001", "--weight", "0")
    assert result.returncode in (1, 2) and len(result.stderr.strip().splitlines()) == 1
    agent.assert_alive()


def test_status_json_and_the_metrics_show_the_groups(bus, agent):
    shares_call(bus.address, "SetShare", "sa{sv}", "user:4001", "1", "weight", "u", "2")
    status = json.loads(nvsharectl(bus.address, "status", "--json").stdout)
    assert status["share_by"] == "user" and status["shares"] == {"user:4001": {"weight": 2}}
    assert status["groups"] == []  # no GPU yet: no group on one
    from nvshare_metrics.exposition import exposition

    status["groups"] = [
        {"gpu": "GPU-x", "group": "user:4001", "weight": 2, "memory_cap_bytes": 0,
         "use": 0.9, "share": 0.66, "clients": 3},
    ]  # fmt: skip
    text = exposition(status)[0].decode()
    assert 'nvshare_share_of_gpu_time{gpu="GPU-x",group="user:4001"} 0.66' in text
    assert 'nvshare_share_weight{gpu="GPU-x",group="user:4001"} 2.0' in text


def test_groups_on_a_gpu_show_weight_cap_use_and_share_over_d_bus(bus, agent):
    import asyncio

    from agent_harness import GPU0, AsyncShimClient

    shares_call(bus.address, "SetShare", "sa{sv}", "user:0", "2", "weight", "u", "2",
                "memory_cap_bytes", "t", str(1 << 30))  # fmt: skip

    async def hold_and_look() -> tuple:
        client = await AsyncShimClient.connect(agent.socket_path, (GPU0,), command="trainer")
        client.request()
        await client.wait_grant()
        await asyncio.sleep(0.5)  # an older shim: the hold is its use
        loop = asyncio.get_running_loop()
        groups = await loop.run_in_executor(None, shares_property, bus.address, "Groups")
        shown = await loop.run_in_executor(None, nvsharectl, bus.address, "share")
        await client.close()
        return groups, shown.stdout

    groups, shown = asyncio.run(hold_and_look())
    assert len(groups) == 1, groups
    group = {key: item["data"] for key, item in groups[0].items()}
    assert group["group"] == "user:0" and group["weight"] == 2
    assert group["memory_cap_bytes"] == 1 << 30 and group["clients"] == 1
    assert 0 < group["use"] < 0.2 and group["share"] > 0.5
    assert "  weight 2  memory cap 1.0 GiB  user:0 (root)\n" in shown
    # The GPU's groups as a table: the figures whole, the group last; the one group
    # had all the GPU time the groups used, whatever the agent's minute figure says.
    table = shown[shown.index("  WEIGHT") :].splitlines()
    assert table[0].split() == ["WEIGHT", "CAP", "USE", "SHARE", "CLIENTS", "GROUP"]
    assert table[1].split()[:3] == ["2", "1.0", "GiB"] and " 100 %  " in table[1]
    assert table[1].endswith("  1  user:0 (root)"), shown
    assert "SHARE: of the GPU time the groups used here over the last minute" in shown


def test_bad_nvsharectl_share_arguments_are_one_line_and_exit_2(bus, agent):
    for args in (
        ("share", "set", "user:4001"),
        ("share", "set", "user:4001", "--memory-cap", "lots"),
        ("share", "set", "user:4001", "--weight", "-3"),
    ):
        result = nvsharectl(bus.address, *args)
        assert result.returncode == 2, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)
    result = nvsharectl(bus.address, "share", "set", "process:42", "--weight", "2")
    assert result.returncode == 2 and "a share group is" in result.stderr  # InvalidArgument
    assert shares_property(bus.address, "Shares") == {}


def test_shares_set_at_once_each_keep_the_others(bus, agent):
    # Each SetShare once merged into the table as it was before the other's save, and the
    # second one's save dropped the first's group, both callers told it worked.
    groups = [f"user:{4001 + i}" for i in range(6)]
    with concurrent.futures.ThreadPoolExecutor(len(groups)) as pool:
        results = list(
            pool.map(
                lambda g: shares_call(
                    bus.address, "SetShare", "sa{sv}", g, "1", "weight", "u", "2"
                ),
                groups,
            )
        )
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    assert sorted(shares_property(bus.address, "Shares")) == groups


def _my_figures(address: str) -> dict:
    """This process's own figures on the GPU, as nvsharectl status --json shows them
    (each of its connections' entries carries the process's)."""
    status = json.loads(nvsharectl(address, "status", "--json").stdout)
    return status["clients"][0]["gpus"][0]


def _my_group(address: str) -> dict:
    """This process's group on the GPU (the fake shims run here, as root), each figure
    as busctl gives it: {"type": ..., "data": ...}."""
    (mine,) = [g for g in shares_property(address, "Groups") if g["group"]["data"] == "user:0"]
    return mine


def test_groups_count_gpu_time_and_waits_with_their_gone_clients_over_d_bus(bus, agent):
    import time

    from agent_harness import ShimClient
    from dbus_harness import busctl_on_agent, property_data, wait_for

    # On, a long quantum: the waiter waits its turn behind the holder (cause "turn").
    busctl_on_agent(bus.address, "set-property", "AntiThrashMode", "s", "on")
    busctl_on_agent(bus.address, "set-property", "TimeQuantum", "u", "3600")
    holder = ShimClient(agent.socket_path, command="holder")
    holder.request()
    holder.wait_grant()
    waiter = ShimClient(agent.socket_path, command="waiter")
    waiter.request()
    wait_for(lambda: property_data(bus.address, "Gpus")[0][4], "the waiter queued")
    try:
        time.sleep(0.3)  # an older shim: the hold is its GPU time
        # Both connections are this process: its figures are theirs together.
        theirs = _my_figures(bus.address)
        mine = _my_group(bus.address)
        assert (mine["gpu_seconds"]["type"], mine["waited_s"]["type"]) == ("d", "a{sd}")
        assert mine["clients"]["data"] == 2
        assert mine["gpu_seconds"]["data"] >= theirs["gpu_seconds"] >= 0.3
        assert mine["waited_s"]["data"]["turn"] >= theirs["waited_s"]["turn"] >= 0.3

        holder.close()  # gone while holding: the waiter is granted
        waiter.wait_grant(timeout=10)
        wait_for(lambda: len(property_data(bus.address, "Clients")) == 1, "the holder gone")
        after = _my_group(bus.address)
        assert after["clients"]["data"] == 1
        # What the holder did stays with its group: nothing went back.
        assert after["gpu_seconds"]["data"] >= mine["gpu_seconds"]["data"]
        assert after["waited_s"]["data"]["turn"] >= mine["waited_s"]["data"]["turn"]
        # The process keeps what its gone connection did (agent/process_past.py).
        left = _my_figures(bus.address)
        assert left["gpu_seconds"] >= theirs["gpu_seconds"]
        assert left["waited_s"]["turn"] >= theirs["waited_s"]["turn"]

        status = json.loads(nvsharectl(bus.address, "status", "--json").stdout)
        (shown,) = status["groups"]
        assert shown["gpu_seconds"] >= after["gpu_seconds"]["data"]
        assert shown["waited_s"]["turn"] >= after["waited_s"]["data"]["turn"]
    finally:
        waiter.close()
        holder.close()
