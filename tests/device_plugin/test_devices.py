"""The device plugin's core, without gRPC: the devices it advertises and their
health, the allocation it prefers, and what Allocate gives a container."""

from __future__ import annotations

import pytest

from nvshare_device_plugin.devices import (
    CONTAINER_SHIM_PATH,
    CONTAINER_SOCKET_DIR,
    HEALTHY,
    UNHEALTHY,
    ContainerAllocation,
    Device,
    DevicesSpanGpus,
    DeviceTable,
    GpuUnhealthy,
    HealthChange,
    Mount,
    NodePaths,
    Replica,
    RequestRefused,
    UnknownDevices,
    allocate,
    parse_replica_id,
    preferred_allocation,
    replica_id,
)

H100 = "GPU-0d84ee44-b797-1c71-8ccd-cefec22161de"
L4 = "GPU-11111111-2222-3333-4444-555555555555"
NODE = NodePaths(
    socket_dir="/run/nvshare", shim="/usr/lib/x86_64-linux-gnu/nvshare/libnvshare-portable.so"
)


def table_of(*gpus: str, replicas: int = 3) -> DeviceTable:
    table = DeviceTable(replicas)
    table.observe(gpus)
    return table


def ids(gpu: str, *indices: int) -> list[str]:
    return [replica_id(gpu, index) for index in indices]


def test_each_gpu_is_advertised_as_replicas_named_by_its_uuid():
    table = DeviceTable(replicas=3)
    changes = table.observe([H100, L4])
    assert changes == [HealthChange(H100, HEALTHY), HealthChange(L4, HEALTHY)]
    assert table.devices() == [
        Device(f"{H100}::0", HEALTHY),
        Device(f"{H100}::1", HEALTHY),
        Device(f"{H100}::2", HEALTHY),
        Device(f"{L4}::0", HEALTHY),
        Device(f"{L4}::1", HEALTHY),
        Device(f"{L4}::2", HEALTHY),
    ]
    # The kubelet allows 63 characters in an ID.
    assert all(len(device.id) <= 63 for device in DeviceTable(1000).devices() + table.devices())
    assert len(replica_id(H100, 999)) <= 63


def test_gpus_are_listed_in_the_order_nvml_first_showed_them():
    table = DeviceTable(replicas=1)
    table.observe([L4])
    table.observe([H100, L4])
    assert [device.id for device in table.devices()] == [f"{L4}::0", f"{H100}::0"]


def test_a_gpu_that_leaves_the_inventory_turns_unhealthy_and_back_when_it_returns():
    table = table_of(H100, L4, replicas=2)
    assert table.observe([H100]) == [HealthChange(L4, UNHEALTHY)]
    assert [device.health for device in table.devices()] == [HEALTHY, HEALTHY, UNHEALTHY, UNHEALTHY]
    assert table.gpu_health(L4) == UNHEALTHY
    assert table.observe([H100]) == []  # no change, nothing to stream
    assert table.observe([L4, H100]) == [HealthChange(L4, HEALTHY)]
    assert all(device.health == HEALTHY for device in table.devices())


def test_an_inventory_nvml_cannot_read_makes_every_gpu_unhealthy():
    table = table_of(H100, L4)
    assert table.observe([]) == [HealthChange(H100, UNHEALTHY), HealthChange(L4, UNHEALTHY)]
    assert {device.health for device in table.devices()} == {UNHEALTHY}
    assert len(table.devices()) == 6  # still listed: the kubelet keeps counting them


def test_a_node_without_gpus_advertises_nothing():
    table = DeviceTable(replicas=10)
    assert table.observe([]) == []
    assert table.devices() == []


def test_replicas_must_be_at_least_one():
    with pytest.raises(ValueError):
        DeviceTable(0)


@pytest.mark.parametrize(
    "device_id, replica",
    [
        (f"{H100}::0", Replica(H100, 0)),
        (f"{H100}::12", Replica(H100, 12)),
        (H100, None),
        (f"{H100}::", None),
        (f"{H100}::-1", None),
        (f"{H100}::x", None),
        ("MIG-5c3f2a11-0000-4000-8000-000000000001::0", None),
        ("nvidia0", None),
        ("", None),
    ],
)
def test_replica_ids_parse_and_other_ids_do_not(device_id, replica):
    assert parse_replica_id(device_id) == replica


def test_the_table_knows_only_replicas_of_gpus_it_has_seen():
    table = table_of(H100, replicas=3)
    assert table.knows(f"{H100}::2")
    assert not table.knows(f"{H100}::3")
    assert not table.knows(f"{L4}::0")
    assert not table.knows("GPU-whatever")


# ---------------------------------------------------------------- preferred allocation


def test_preferred_allocation_packs_a_request_onto_the_gpu_with_most_free_replicas():
    available = ids(H100, 2) + ids(L4, 0, 1, 2)  # H100's 0 and 1 are taken
    assert preferred_allocation(available, [], 2) == ids(L4, 0, 1)
    assert preferred_allocation(available, [], 1) == ids(L4, 0)


def test_preferred_allocation_takes_the_lowest_uuid_on_a_tie_and_the_lowest_replicas():
    available = ids(L4, 2, 0, 1) + ids(H100, 2, 1, 0)
    assert preferred_allocation(available, [], 2) == ids(H100, 0, 1)


def test_preferred_allocation_keeps_must_include_and_fills_from_its_gpu():
    available = ids(H100, 0, 1, 2) + ids(L4, 0, 1, 2)
    # L4 has as many free, but the container already holds one of the H100's.
    assert preferred_allocation(available, ids(H100, 1), 3) == ids(H100, 1, 0, 2)


def test_preferred_allocation_is_shorter_when_no_gpu_has_enough_free():
    available = ids(H100, 0, 1) + ids(L4, 2)
    assert preferred_allocation(available, [], 3) == ids(H100, 0, 1)


def test_preferred_allocation_with_must_include_already_full_returns_it():
    assert preferred_allocation(ids(H100, 0, 1), ids(H100, 1), 1) == ids(H100, 1)


def test_preferred_allocation_never_picks_ids_that_are_not_replicas():
    assert preferred_allocation(["nvidia0", "nvidia1"], [], 1) == []
    assert preferred_allocation(["nvidia0", *ids(L4, 0)], [], 1) == ids(L4, 0)
    assert preferred_allocation([], [], 2) == []


# ---------------------------------------------------------------- allocate


def test_allocate_gives_the_gpu_the_agent_socket_directory_and_the_shim():
    table = table_of(H100, L4)
    assert allocate(table, ids(L4, 1), NODE) == ContainerAllocation(
        envs={"NVIDIA_VISIBLE_DEVICES": L4, "LD_PRELOAD": CONTAINER_SHIM_PATH},
        mounts=(
            Mount(CONTAINER_SOCKET_DIR, "/run/nvshare", read_only=True),
            Mount(CONTAINER_SHIM_PATH, NODE.shim, read_only=True),
        ),
    )
    assert CONTAINER_SHIM_PATH == "/usr/lib/nvshare/libnvshare.so"  # README.md's recipe
    assert CONTAINER_SOCKET_DIR == "/run/nvshare"  # where the shim looks


def test_allocate_of_several_replicas_of_one_gpu_gives_that_gpu():
    given = allocate(table_of(H100, L4), ids(H100, 0, 2), NODE)
    assert given.envs["NVIDIA_VISIBLE_DEVICES"] == H100


def test_a_node_socket_dir_elsewhere_is_still_mounted_where_the_shim_looks():
    given = allocate(table_of(H100), ids(H100, 0), NodePaths("/srv/nvshare", "/opt/shim.so"))
    assert given.mounts == (
        Mount("/run/nvshare", "/srv/nvshare", read_only=True),
        Mount(CONTAINER_SHIM_PATH, "/opt/shim.so", read_only=True),
    )


def one_line(error: Exception) -> str:
    text = str(error)
    assert text and "\n" not in text
    return text


def test_allocate_refuses_devices_of_two_gpus():
    with pytest.raises(DevicesSpanGpus) as refused:
        allocate(table_of(H100, L4), ids(H100, 0) + ids(L4, 0), NODE)
    assert H100 in one_line(refused.value) and L4 in str(refused.value)


@pytest.mark.parametrize("device_id", [f"{L4}::0", f"{H100}::3", "nvidia0", ""])
def test_allocate_refuses_ids_it_does_not_advertise(device_id):
    with pytest.raises(UnknownDevices) as refused:
        allocate(table_of(H100), [f"{H100}::0", device_id], NODE)
    assert repr(device_id) in one_line(refused.value)


def test_allocate_refuses_a_gpu_that_left_the_inventory():
    table = table_of(H100, L4)
    table.observe([H100])
    with pytest.raises(GpuUnhealthy) as refused:
        allocate(table, ids(L4, 0), NODE)
    assert L4 in one_line(refused.value)


def test_allocate_refuses_a_container_that_asks_for_nothing():
    with pytest.raises(RequestRefused) as refused:
        allocate(table_of(H100), [], NODE)
    one_line(refused.value)
