"""The device plugin's core: which devices it advertises and their health, the
allocation it prefers, and what Allocate gives a container.

No gRPC, NVML, clock or file system here: service.py feeds in the GPUs NVML
sees and turns the answers into the kubelet's messages (docs/kubernetes.md).

Each physical GPU is advertised as `replicas` devices named "<GPU UUID>::<n>",
n = 0 .. replicas-1.  A replica is a seat at the GPU, not a slice of it:
nvshare gives every process the whole GPU memory and lets them take turns, so
all replicas of one GPU give a container the same GPU.  With memory caps per
replica (--memory-cap-per-replica), each replica is also worth 1/replicas of
the GPU's memory: a container given k replicas gets NVSHARE_MEMORY_CAP, k/replicas
of the GPU's memory, which its shim enforces (docs/kubernetes.md, "Memory caps").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# The kubelet's words for a device's health (its v1beta1 constants.go).
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

REPLICA_SEPARATOR = "::"
# Where a container finds the shim and the agent's socket directory: the
# paths of README.md's "Containers" recipe.  The shim looks for its socket in
# /run/nvshare whatever the node's directory is called.
CONTAINER_SHIM_PATH = "/usr/lib/nvshare/libnvshare.so"
CONTAINER_SOCKET_DIR = "/run/nvshare"
# The shim's own memory cap per GPU (shim/config.c), in bytes.
MEMORY_CAP_ENV = "NVSHARE_MEMORY_CAP"


class RequestRefused(ValueError):
    """A kubelet request the plugin cannot honour; the message is one line."""


class UnknownDevices(RequestRefused):
    pass


class DevicesSpanGpus(RequestRefused):
    pass


class GpuUnhealthy(RequestRefused):
    pass


@dataclass(frozen=True, slots=True)
class Device:
    id: str
    health: str


@dataclass(frozen=True, slots=True)
class Replica:
    gpu_uuid: str
    index: int


@dataclass(frozen=True, slots=True)
class HealthChange:
    gpu_uuid: str
    health: str


def replica_id(gpu_uuid: str, index: int) -> str:
    return f"{gpu_uuid}{REPLICA_SEPARATOR}{index}"


def parse_replica_id(device_id: str) -> Replica | None:
    """The GPU and replica a device ID names, or None when it is not one of ours."""
    gpu_uuid, separator, index = device_id.rpartition(REPLICA_SEPARATOR)
    if not separator or not gpu_uuid.startswith("GPU-") or not index.isdecimal():
        return None
    return Replica(gpu_uuid, int(index))


class DeviceTable:
    """Every GPU seen since the plugin started, each advertised as `replicas`
    devices.  A GPU that leaves the inventory stays listed, Unhealthy: the
    kubelet then gives none of its devices to new containers, and still
    accounts for those it gave out.  It is Healthy again once NVML shows it."""

    def __init__(self, replicas: int, memory_cap_per_replica: bool = False):
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, got {replicas}")
        self.replicas = replicas
        self.memory_cap_per_replica = memory_cap_per_replica
        # GPU UUID -> present in the last inventory; in the order first seen.
        self._present: dict[str, bool] = {}
        self._memory_bytes: dict[str, int] = {}  # GPU UUID -> its memory, as NVML said

    def observe(
        self, inventory: Sequence[str], memory_bytes: dict[str, int] | None = None
    ) -> list[HealthChange]:
        """Takes one reading of the inventory (GPU UUIDs in NVML's order, and each
        one's memory); returns the GPUs whose health changed, new GPUs included."""
        self._memory_bytes.update(memory_bytes or {})
        present = set(inventory)
        changes = []
        for gpu_uuid, was_present in self._present.items():
            if was_present != (gpu_uuid in present):
                changes.append(HealthChange(gpu_uuid, HEALTHY if not was_present else UNHEALTHY))
        for gpu_uuid in dict.fromkeys(inventory):
            if gpu_uuid not in self._present:
                changes.append(HealthChange(gpu_uuid, HEALTHY))
        for change in changes:
            self._present[change.gpu_uuid] = change.health == HEALTHY
        return changes

    def devices(self) -> list[Device]:
        return [
            Device(replica_id(gpu_uuid, index), HEALTHY if present else UNHEALTHY)
            for gpu_uuid, present in self._present.items()
            for index in range(self.replicas)
        ]

    def memory_cap(self, gpu_uuid: str, replicas_given: int) -> int | None:
        """What replicas_given replicas of the GPU are worth in memory; None when caps
        per replica are off or the GPU's memory is not known."""
        memory = self._memory_bytes.get(gpu_uuid, 0)
        if not self.memory_cap_per_replica or memory <= 0:
            return None
        return replica_memory_cap(replicas_given, self.replicas, memory)

    def gpu_health(self, gpu_uuid: str) -> str | None:
        """Healthy or Unhealthy, or None for a GPU never seen."""
        if gpu_uuid not in self._present:
            return None
        return HEALTHY if self._present[gpu_uuid] else UNHEALTHY

    def knows(self, device_id: str) -> bool:
        replica = parse_replica_id(device_id)
        return (
            replica is not None
            and replica.gpu_uuid in self._present
            and replica.index < self.replicas
        )


def preferred_allocation(
    available: Sequence[str], must_include: Sequence[str], size: int
) -> list[str]:
    """The devices the plugin would like a container to get: `size` replicas
    of one GPU, so that Allocate can honour the choice.

    - The devices the kubelet must include come first, and the rest come from
      the same GPU (that of the first of them).
    - Otherwise the GPU with the most free replicas, the lowest UUID on a tie:
      the kubelet counts devices per node, not per GPU, so only the plugin can
      spread containers over a node's GPUs, and each one fewer on a GPU is one
      fewer process taking turns with the others there.
    - Within a GPU, the lowest replica numbers first.

    When no GPU has `size` free replicas the answer is shorter than `size`: the
    kubelet fills it up from other GPUs, and Allocate refuses the result
    (DevicesSpanGpus), which fails the pod with that message.  IDs that are not
    this plugin's are never chosen.
    """
    chosen = list(dict.fromkeys(must_include))
    needed = size - len(chosen)
    if needed <= 0:
        return chosen
    free: dict[str, list[Replica]] = {}
    for device_id in dict.fromkeys(available):
        replica = parse_replica_id(device_id)
        if replica is not None and device_id not in chosen:
            free.setdefault(replica.gpu_uuid, []).append(replica)
    if chosen:
        home = parse_replica_id(chosen[0])
        gpu_uuid = home.gpu_uuid if home else None
    else:
        # max() keeps the first of equals: sorted, that is the lowest UUID.
        gpu_uuid = max(sorted(free), key=lambda gpu: len(free[gpu]), default=None)
    if gpu_uuid is None:
        return chosen
    replicas = sorted(free.get(gpu_uuid, []), key=lambda replica: replica.index)
    return chosen + [replica_id(r.gpu_uuid, r.index) for r in replicas[:needed]]


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    envs: dict[str, str]
    mounts: tuple[Mount, ...]


@dataclass(frozen=True, slots=True)
class NodePaths:
    """What a container gets from the node: the agent's socket directory and
    the portable shim (README.md, "Containers")."""

    socket_dir: str
    shim: str


def replica_memory_cap(replicas_given: int, replicas: int, memory_bytes: int) -> int:
    """k of a GPU's n replicas are worth k/n of its memory, rounded down to whole MiB
    (so that nvidia-smi and the shim's warning show a round figure)."""
    if not 1 <= replicas_given <= replicas:
        raise ValueError(f"{replicas_given} replicas of {replicas}")
    return memory_bytes * replicas_given // replicas >> 20 << 20


def allocate(table: DeviceTable, device_ids: Sequence[str], node: NodePaths) -> ContainerAllocation:
    """One container's share of an Allocate request.  Raises RequestRefused."""
    if not device_ids:
        raise RequestRefused("the container asked for no devices")
    unknown = [device_id for device_id in device_ids if not table.knows(device_id)]
    if unknown:
        raise UnknownDevices(
            f"unknown device ID {', '.join(map(repr, unknown))}: this plugin's IDs are "
            f"<GPU UUID>{REPLICA_SEPARATOR}0 to {table.replicas - 1} of the GPUs it advertises"
        )
    # Every ID is known, so each parses: the part before the separator is its GPU.
    gpus = list(
        dict.fromkeys(device_id.rpartition(REPLICA_SEPARATOR)[0] for device_id in device_ids)
    )
    if len(gpus) > 1:
        raise DevicesSpanGpus(
            f"the devices name {len(gpus)} GPUs ({', '.join(gpus)}); a container gets "
            "replicas of one GPU"
        )
    (gpu_uuid,) = gpus
    if table.gpu_health(gpu_uuid) != HEALTHY:
        raise GpuUnhealthy(f"{gpu_uuid} is Unhealthy: NVML no longer shows it on this node")
    envs = {
        # NVIDIA's container runtime gives the container this GPU (and its driver).
        "NVIDIA_VISIBLE_DEVICES": gpu_uuid,
        "LD_PRELOAD": CONTAINER_SHIM_PATH,
    }
    cap = table.memory_cap(gpu_uuid, len(set(device_ids)))
    if cap is not None:
        envs[MEMORY_CAP_ENV] = str(cap)
    return ContainerAllocation(
        envs=envs,
        mounts=(
            # The directory, not the socket file: a restart of nvshare.socket makes a
            # new socket there, which a mount of the file would miss.  Read-only is
            # enough to connect to a socket, and keeps the container from replacing it.
            Mount(CONTAINER_SOCKET_DIR, node.socket_dir, read_only=True),
            Mount(CONTAINER_SHIM_PATH, node.shim, read_only=True),
        ),
    )
