"""The gRPC adapter: the kubelet's DevicePlugin service (v1beta1) around the
core in devices.py.  Every answer comes from the core; this module only
translates messages, and turns a refused request into a gRPC error with the
core's one-line reason (the server keeps serving)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import grpc

from nvshare_agent import eventlog

from . import devices
from .v1beta1 import api_pb2, api_pb2_grpc

log = eventlog.events

# What the kubelet is told when the core refuses: these show up in the pod's
# events (UnexpectedAdmissionError), so the code says whose fault it is.
REFUSAL_CODES = {
    devices.UnknownDevices: grpc.StatusCode.NOT_FOUND,
    devices.DevicesSpanGpus: grpc.StatusCode.INVALID_ARGUMENT,
    devices.GpuUnhealthy: grpc.StatusCode.FAILED_PRECONDITION,
}


def plugin_options() -> api_pb2.DevicePluginOptions:
    """Told the kubelet at registration and when it asks."""
    return api_pb2.DevicePluginOptions(
        pre_start_required=False, get_preferred_allocation_available=True
    )


class DeviceWatch:
    """The device table, and a version number that every change bumps, for the
    ListAndWatch streams to wait on."""

    def __init__(self, table: devices.DeviceTable):
        self.table = table
        self.version = 0
        self._changed = asyncio.Condition()

    async def observe(
        self, inventory: Sequence[str], memory_bytes: dict[str, int] | None = None
    ) -> list[devices.HealthChange]:
        changes = self.table.observe(inventory, memory_bytes)
        if changes:
            self.version += 1
            async with self._changed:
                self._changed.notify_all()
        return changes

    async def next_version(self, seen: int) -> int:
        """Returns as soon as the version is not `seen` (at once for a new stream)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.version != seen)
        return self.version


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    def __init__(self, watch: DeviceWatch, node: devices.NodePaths):
        self.watch = watch
        self.node = node

    async def GetDevicePluginOptions(self, request, context):
        return plugin_options()

    async def ListAndWatch(self, request, context) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        seen = -1
        while True:
            seen = await self.watch.next_version(seen)
            listed = [
                api_pb2.Device(ID=device.id, health=device.health)
                for device in self.watch.table.devices()
            ]
            log.debug("ListAndWatch: %d devices, version %d", len(listed), seen)
            yield api_pb2.ListAndWatchResponse(devices=listed)

    async def GetPreferredAllocation(self, request, context):
        # Never an error: the answer is only advice, and an error here fails the pod.
        responses = []
        for container in request.container_requests:
            chosen = devices.preferred_allocation(
                container.available_deviceIDs,
                container.must_include_deviceIDs,
                container.allocation_size,
            )
            log.debug(
                "GetPreferredAllocation(%d of %d available): %s",
                container.allocation_size,
                len(container.available_deviceIDs),
                ", ".join(chosen),
            )
            responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(self, request, context):
        responses = []
        for container in request.container_requests:
            try:
                given = devices.allocate(self.watch.table, container.devices_ids, self.node)
            except devices.RequestRefused as refused:
                log.warning("refused Allocate(%s): %s", ", ".join(container.devices_ids), refused)
                code = REFUSAL_CODES.get(type(refused), grpc.StatusCode.INVALID_ARGUMENT)
                await context.abort(code, str(refused))
            log.info(
                "Allocate(%s): GPU %s",
                ", ".join(container.devices_ids),
                given.envs["NVIDIA_VISIBLE_DEVICES"],
            )
            responses.append(
                api_pb2.ContainerAllocateResponse(
                    envs=given.envs,
                    mounts=[
                        api_pb2.Mount(
                            container_path=mount.container_path,
                            host_path=mount.host_path,
                            read_only=mount.read_only,
                        )
                        for mount in given.mounts
                    ],
                )
            )
        return api_pb2.AllocateResponse(container_responses=responses)

    async def PreStartContainer(self, request, context):
        # Not asked for (pre_start_required=False); answered in case a kubelet calls anyway.
        return api_pb2.PreStartContainerResponse()
