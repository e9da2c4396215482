"""Memory caps per replica (docs/kubernetes.md, "Memory caps"): with
--memory-cap-per-replica, a container given k of a GPU's n replicas gets
NVSHARE_MEMORY_CAP = k/n of the GPU's memory, which its shim enforces."""

from __future__ import annotations

import pytest

from nvshare_device_plugin.__main__ import parse_args
from nvshare_device_plugin.devices import (
    MEMORY_CAP_ENV,
    DeviceTable,
    NodePaths,
    allocate,
    replica_id,
    replica_memory_cap,
)

H100 = "GPU-0d84ee44-b797-1c71-8ccd-cefec22161de"
GIB = 1 << 30
NODE = NodePaths(socket_dir="/run/nvshare", shim="/usr/lib/nvshare/libnvshare-portable.so")


def test_k_of_n_replicas_are_worth_k_nths_of_the_memory_in_whole_mib():
    assert replica_memory_cap(1, 10, 80 * GIB) == 8 * GIB
    assert replica_memory_cap(10, 10, 80 * GIB) == 80 * GIB
    assert replica_memory_cap(1, 3, 80 * GIB) == 27306 << 20  # 26.67 GiB, down to a MiB
    for given, replicas in ((0, 10), (11, 10)):
        with pytest.raises(ValueError):
            replica_memory_cap(given, replicas, 80 * GIB)


def test_a_container_gets_its_cap_in_the_environment_only_when_asked():
    capped = DeviceTable(10, memory_cap_per_replica=True)
    capped.observe([H100], {H100: 80 * GIB})
    given = allocate(capped, [replica_id(H100, 0), replica_id(H100, 1)], NODE)
    assert given.envs[MEMORY_CAP_ENV] == str(16 * GIB)
    plain = DeviceTable(10)
    plain.observe([H100], {H100: 80 * GIB})
    assert MEMORY_CAP_ENV not in allocate(plain, [replica_id(H100, 0)], NODE).envs
    unknown = DeviceTable(10, memory_cap_per_replica=True)
    unknown.observe([H100])  # NVML gave no size: no cap rather than a wrong one
    assert MEMORY_CAP_ENV not in allocate(unknown, [replica_id(H100, 0)], NODE).envs


def test_the_option_turns_it_on(tmp_path):
    shim = tmp_path / "libnvshare.so"
    shim.touch()
    common = ["--kubelet-dir", str(tmp_path), "--shim-path", str(shim)]
    assert parse_args([*common, "--memory-cap-per-replica"]).memory_cap_per_replica
    assert not parse_args(common).memory_cap_per_replica
