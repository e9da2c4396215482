"""A stand-in kubelet for the device plugin's tests (a test fixture, as
tests/standin/ is the stand-in driver): the kubelet's side of the device-plugin
API v1beta1, over real gRPC, in a directory of its own.

- It serves Registration on DIR/kubelet.sock and takes a registration as the
  kubelet does: API version v1beta1, an extended resource name (DOMAIN/NAME).
- Then, as the kubelet does, it connects to the socket the plugin named, asks
  for its options and keeps a ListAndWatch stream open, recording every list.
- It is a client of the plugin's service: Allocate, GetPreferredAllocation.
- restart() is a kubelet restart: it stops, deletes the sockets in the
  directory (the kubelet deletes everything there but its checkpoint file) and
  listens on a new kubelet.sock.

It runs in the tests' process (StandinKubelet), or as a program where only
Debian's python3-grpcio is at hand (the booted container's test):
`python3 standin_kubelet.py DIR` serves until its stdin closes (or SIGTERM) and
prints one JSON object a line: {"registered": {...}}, {"devices": [[ID,
HEALTH], ...]}; a line "allocate ID..." on its stdin is answered with
{"allocate": {...}} or {"error": "CODE: details"}.  Closing stdin is how a test
stops it: a signal to `nsenter` would not reach it.
"""

from __future__ import annotations

import json
import queue
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc

from nvshare_device_plugin.v1beta1 import api_pb2, api_pb2_grpc

KUBELET_SOCKET = "kubelet.sock"
CHECKPOINT = "kubelet_internal_checkpoint"
RPC_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Registration:
    request: api_pb2.RegisterRequest
    received_at: float  # time.monotonic()


class _RegistrationService(api_pb2_grpc.RegistrationServicer):
    def __init__(self, kubelet: StandinKubelet):
        self.kubelet = kubelet

    def Register(self, request, context):
        problem = self.kubelet.registration_problem(request)
        if problem:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        self.kubelet.accept(request)
        return api_pb2.Empty()


class StandinKubelet:
    def __init__(self, directory: Path, refuse_registrations: int = 0):
        self.directory = directory
        self.socket = directory / KUBELET_SOCKET
        self.registrations: queue.Queue[Registration] = queue.Queue()
        self.device_lists: queue.Queue[list[tuple[str, str]]] = queue.Queue()
        self.options: api_pb2.DevicePluginOptions | None = None
        self.listening_since = 0.0  # time.monotonic() when kubelet.sock last appeared
        self.refusals_left = refuse_registrations
        self._server: grpc.Server | None = None
        self._plugin_channel: grpc.Channel | None = None
        self._plugin: api_pb2_grpc.DevicePluginStub | None = None

    # ------------------------------------------------------------ the kubelet's life

    def start(self) -> StandinKubelet:
        self.directory.mkdir(parents=True, exist_ok=True)
        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_RegistrationServicer_to_server(_RegistrationService(self), server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        self.listening_since = time.monotonic()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(None).wait()
            self._server = None
        if self._plugin_channel is not None:
            self._plugin_channel.close()  # ends the ListAndWatch stream
            self._plugin_channel = self._plugin = None

    def restart(self) -> None:
        self.stop()
        for entry in self.directory.iterdir():
            if entry.name != CHECKPOINT and not entry.is_dir():
                entry.unlink()
        self.start()

    # ------------------------------------------------------------ registration

    def registration_problem(self, request: api_pb2.RegisterRequest) -> str | None:
        if self.refusals_left > 0:
            self.refusals_left -= 1
            return "refused by the test"
        if request.version != "v1beta1":
            return f"unsupported API version {request.version!r}"
        domain, slash, name = request.resource_name.partition("/")
        if not (domain and slash and name):
            return f"{request.resource_name!r} is not an extended resource name"
        if "/" in request.endpoint or not request.endpoint:
            return f"endpoint {request.endpoint!r} is not a file name in {self.directory}"
        return None

    def accept(self, request: api_pb2.RegisterRequest) -> None:
        self.registrations.put(Registration(request, time.monotonic()))
        if self._plugin_channel is not None:
            self._plugin_channel.close()
        self._plugin_channel = grpc.insecure_channel(f"unix://{self.directory / request.endpoint}")
        self._plugin = api_pb2_grpc.DevicePluginStub(self._plugin_channel)
        threading.Thread(target=self._follow, args=(self._plugin,), daemon=True).start()

    def _follow(self, plugin: api_pb2_grpc.DevicePluginStub) -> None:
        try:
            self.options = plugin.GetDevicePluginOptions(api_pb2.Empty(), timeout=RPC_TIMEOUT_S)
            for response in plugin.ListAndWatch(api_pb2.Empty()):
                self.device_lists.put([(device.ID, device.health) for device in response.devices])
        except (grpc.RpcError, ValueError):
            pass  # the stream ended, or its channel closed: the plugin or this kubelet went away

    def wait_for_registration(self, timeout: float = 15) -> Registration:
        try:
            return self.registrations.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no registration within {timeout:g} s") from None

    def next_devices(self, timeout: float = 15) -> list[tuple[str, str]]:
        try:
            return self.device_lists.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no ListAndWatch update within {timeout:g} s") from None

    # ------------------------------------------------------------ a client of the plugin

    @property
    def plugin(self) -> api_pb2_grpc.DevicePluginStub:
        assert self._plugin is not None, "no plugin has registered"
        return self._plugin

    def allocate(self, *containers: list[str]) -> api_pb2.AllocateResponse:
        request = api_pb2.AllocateRequest(
            container_requests=[
                api_pb2.ContainerAllocateRequest(devices_ids=devices) for devices in containers
            ]
        )
        return self.plugin.Allocate(request, timeout=RPC_TIMEOUT_S)

    def preferred(self, available: list[str], must_include: list[str], size: int) -> list[str]:
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=available,
                    must_include_deviceIDs=must_include,
                    allocation_size=size,
                )
            ]
        )
        response = self.plugin.GetPreferredAllocation(request, timeout=RPC_TIMEOUT_S)
        return list(response.container_responses[0].deviceIDs)


def allocation_as_dict(container: api_pb2.ContainerAllocateResponse) -> dict:
    return {
        "envs": dict(container.envs),
        "mounts": [
            {
                "container_path": mount.container_path,
                "host_path": mount.host_path,
                "read_only": mount.read_only,
            }
            for mount in container.mounts
        ],
    }


def main(argv: list[str]) -> int:
    kubelet = StandinKubelet(Path(argv[1])).start()
    printing = threading.Lock()

    def say(event: dict) -> None:
        with printing:
            print(json.dumps(event), flush=True)

    def forward_registrations() -> None:
        while True:
            request = kubelet.registrations.get().request
            say(
                {
                    "registered": {
                        "version": request.version,
                        "endpoint": request.endpoint,
                        "resource_name": request.resource_name,
                        "preferred_allocation": request.options.get_preferred_allocation_available,
                    }
                }
            )

    def forward_device_lists() -> None:
        while True:
            say({"devices": kubelet.device_lists.get()})

    for forward in (forward_registrations, forward_device_lists):
        threading.Thread(target=forward, daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        for line in sys.stdin:
            command, *device_ids = line.split()
            if command != "allocate":
                say({"error": f"unknown command {command!r}"})
                continue
            try:
                response = kubelet.allocate(device_ids)
                say({"allocate": allocation_as_dict(response.container_responses[0])})
            except grpc.RpcError as e:
                say({"error": f"{e.code().name}: {e.details()}"})
        return 0
    finally:
        kubelet.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
