"""Keeps the plugin served in the kubelet's directory and registered with the
kubelet.

The kubelet's contract (Kubernetes' "Device Plugins" page): a plugin serves the
DevicePlugin service on a UNIX socket in the kubelet's device-plugin directory,
then calls Registration.Register on kubelet.sock there, naming that socket.
When the kubelet restarts it deletes the sockets in the directory, its own
included, and listens on a new kubelet.sock; until the plugin serves and
registers again, the node has none of its devices.

Both sockets are watched by polling stat() every WATCH_INTERVAL_S: Debian's
Python has no inotify binding, five stat() calls a second cost nothing, and a
restarted kubelet is registered with again well within a second.  A socket is
told apart from its successor at the same path by inode and change time (a
file system may hand a freed inode number straight to the next file).
"""

from __future__ import annotations

import asyncio
import os
import socket
import stat
from pathlib import Path

import grpc

from nvshare_agent import eventlog

from .service import DevicePluginService, plugin_options
from .v1beta1 import api_pb2, api_pb2_grpc

log = eventlog.events

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
WATCH_INTERVAL_S = 0.2
REGISTER_TIMEOUT_S = 5.0
# After a failed Register the same kubelet is asked again after WATCH_INTERVAL_S, then twice
# as long after each failure up to RETRY_INTERVAL_S; a new one at once.  A kubelet makes its
# socket before it serves on it: a socket that refuses connections is no attempt.
RETRY_INTERVAL_S = 2.0
# A kubelet socket that refuses connections this long is logged (once): a kubelet that died.
REFUSED_REPORT_S = 5.0

SocketIdentity = tuple[int, int, int]


class EndpointTaken(RuntimeError):
    """Another process serves the plugin's socket: this one must not take it
    back, or the two would take turns replacing each other's socket."""


def socket_identity(path: Path) -> SocketIdentity | None:
    """What tells this socket apart from another one at the same path; None
    when there is no socket there."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISSOCK(status.st_mode):
        return None
    return (status.st_dev, status.st_ino, status.st_ctime_ns)


def someone_serves(path: Path) -> bool:
    """A connection to a UNIX socket is accepted or refused at once (never waits: a
    full listen backlog reads as not served, looked at again at the next watch)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def endpoint_name(resource_name: str) -> str:
    """The plugin's socket in the kubelet's directory: nvshare.com/gpu -> nvshare.com-gpu.sock."""
    return resource_name.replace("/", "-") + ".sock"


class KubeletLink:
    def __init__(self, kubelet_dir: Path, resource_name: str, service: DevicePluginService):
        self.resource_name = resource_name
        self.service = service
        self.endpoint = kubelet_dir / endpoint_name(resource_name)
        self.kubelet_socket = kubelet_dir / KUBELET_SOCKET
        self.server: grpc.aio.Server | None = None
        self.served: SocketIdentity | None = None
        self.registered_with: SocketIdentity | None = None
        self.last_attempt: SocketIdentity | None = None
        self.retry_at = 0.0
        self.retry_after_s = WATCH_INTERVAL_S
        self.refused: tuple[SocketIdentity, float] | None = None  # the socket, since when
        self.problem: str | None = None

    async def keep_registered(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(WATCH_INTERVAL_S)

    async def check(self) -> None:
        """Serves again if our socket is gone, registers again if the kubelet's is
        new.  Raises EndpointTaken when another process serves our socket's path
        (the systemd unit and the DaemonSet both running on one node)."""
        endpoint = socket_identity(self.endpoint)
        if self.served is None or endpoint != self.served:
            if endpoint is not None and someone_serves(self.endpoint):
                raise EndpointTaken(
                    f"another process serves {self.endpoint}: is a second nvshare device plugin "
                    "running on this node (the systemd unit and the DaemonSet)?"
                )
            await self._serve()
            if self.served is None:
                return
        kubelet = socket_identity(self.kubelet_socket)
        if kubelet is None or kubelet == self.registered_with:
            return
        now = asyncio.get_running_loop().time()
        if kubelet == self.last_attempt and now < self.retry_at:
            return
        if not someone_serves(self.kubelet_socket):
            # Made, not yet served (or left by a kubelet that died): looked at again at
            # the next watch, not after a backoff.  A kubelet slow to serve its new
            # socket once met attempts that doubled the wait to 1.6 s past its start.
            if self.refused is None or self.refused[0] != kubelet:
                self.refused = (kubelet, now)
            elif now - self.refused[1] >= REFUSED_REPORT_S:
                self._report(
                    f"nobody serves the kubelet's socket {self.kubelet_socket} (is the "
                    "kubelet running?); registering once it does"
                )
            return
        self.refused = None
        if kubelet == self.last_attempt:
            self.retry_after_s = min(2 * self.retry_after_s, RETRY_INTERVAL_S)
        else:
            self.retry_after_s = WATCH_INTERVAL_S
        self.last_attempt, self.retry_at = kubelet, now + self.retry_after_s
        await self._register(kubelet)

    async def close(self) -> None:
        await self._stop_serving()
        if self.served is not None and socket_identity(self.endpoint) == self.served:
            self.endpoint.unlink(missing_ok=True)
        self.served = None

    async def _serve(self) -> None:
        if self.server is not None:
            log.info("%s is gone (the kubelet restarted?): serving a new one", self.endpoint)
        await self._stop_serving()
        server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.service, server)
        try:
            # gRPC replaces a socket file left at the path (ours, from a previous run).
            if server.add_insecure_port(f"unix://{self.endpoint}") == 0:
                raise RuntimeError("no port bound")
            await server.start()
        except RuntimeError as e:
            await server.stop(None)
            self._report(f"cannot serve on {self.endpoint}: {e}")
            return
        self.server, self.served = server, socket_identity(self.endpoint)
        self.registered_with = None  # the kubelet must learn of the new socket
        log.info("serving %s on %s", self.resource_name, self.endpoint)

    async def _stop_serving(self) -> None:
        if self.server is not None:
            # Ends the old ListAndWatch streams; the kubelet opens new ones.
            await self.server.stop(None)
            self.server = None

    async def _register(self, kubelet: SocketIdentity) -> None:
        request = api_pb2.RegisterRequest(
            version=API_VERSION,
            endpoint=self.endpoint.name,
            resource_name=self.resource_name,
            options=plugin_options(),
        )
        async with grpc.aio.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
            try:
                await api_pb2_grpc.RegistrationStub(channel).Register(
                    request, timeout=REGISTER_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as e:
                self._report(
                    f"the kubelet at {self.kubelet_socket} did not take the registration "
                    f"({e.code().name}: {e.details()}); trying again, at most every "
                    f"{RETRY_INTERVAL_S:g} s"
                )
                return
        self.registered_with = kubelet
        self.problem = None
        log.info(
            "registered %s with the kubelet at %s (%d devices)",
            self.resource_name,
            self.kubelet_socket,
            len(self.service.watch.table.devices()),
        )

    def _report(self, problem: str) -> None:
        """Logs a problem once, not on every retry."""
        if problem != self.problem:
            log.warning("%s", problem)
            self.problem = problem
