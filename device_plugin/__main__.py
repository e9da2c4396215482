"""nvshare-device-plugin: advertises each GPU to the kubelet as --replicas
devices of one extended resource (docs/kubernetes.md).

Exit codes: 0 stopped cleanly (SIGTERM, SIGINT), 1 failed, 2 bad usage, 3
another process serves the plugin's socket (a second plugin on the node).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import signal
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

from nvshare_agent import eventlog, nvml, protocol
from nvshare_agent.one_line_parser import OneLineParser
from nvshare_agent.protocol import format_uuid

from .devices import DeviceTable, NodePaths
from .kubelet import EndpointTaken, KubeletLink
from .service import DevicePluginService, DeviceWatch

log = eventlog.events

PROG = "nvshare-device-plugin"
DEFAULT_KUBELET_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_RESOURCE_NAME = "nvshare.com/gpu"
DEFAULT_REPLICAS = 10
# Each replica is one device in every ListAndWatch message the kubelet reads.
MAX_REPLICAS = 1000
# The directory of the agent's socket (its name comes from the one header).
DEFAULT_SOCKET_DIR = Path(protocol.DEFAULT_SOCKET_PATH).parent
# Where the package puts the shim for containers (glibc 2.17 and later).
DEFAULT_SHIM_PATH = (
    Path("/usr/lib")
    / (sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu")
    / "nvshare"
    / "libnvshare-portable.so"
)
DEFAULT_INVENTORY_INTERVAL_S = 10.0

# The kubelet takes an extended resource name: a DNS subdomain, "/", and a name
# of at most 63 characters; nothing in kubernetes.io, nothing "requests.".
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def resource_name_problem(name: str) -> str | None:
    domain, slash, short = name.partition("/")
    if not slash or not _DOMAIN.fullmatch(domain) or len(domain) > 253:
        return f"{name!r} is not DOMAIN/NAME with DOMAIN a DNS name such as nvshare.com"
    if not _NAME.fullmatch(short) or len(short) > 63:
        return f"{name!r}: the part after '/' must be 1 to 63 letters, digits, '-', '_' or '.'"
    if (
        domain == "kubernetes.io"
        or domain.endswith(".kubernetes.io")
        or name.startswith("requests.")
    ):
        return f"{name!r} is reserved by Kubernetes"
    return None


def parse_args(argv=None) -> argparse.Namespace:
    parser = OneLineParser(
        prog=PROG,
        description="Advertise each GPU to the kubelet as N devices, which containers share "
        "under nvshare.",
    )
    parser.add_argument(
        "--kubelet-dir",
        type=Path,
        default=DEFAULT_KUBELET_DIR,
        metavar="DIR",
        help=f"the kubelet's device-plugin directory (default {DEFAULT_KUBELET_DIR})",
    )
    parser.add_argument(
        "--resource-name",
        default=DEFAULT_RESOURCE_NAME,
        metavar="NAME",
        help=f"the extended resource to advertise (default {DEFAULT_RESOURCE_NAME})",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=DEFAULT_REPLICAS,
        metavar="N",
        help=f"devices per GPU, 1 to {MAX_REPLICAS} (default {DEFAULT_REPLICAS})",
    )
    parser.add_argument(
        "--memory-cap-per-replica",
        action="store_true",
        help="each replica is also worth 1/replicas of its GPU's memory: a container given "
        "k replicas may allocate at most k/replicas of it (NVSHARE_MEMORY_CAP, enforced by "
        "the shim)",
    )
    parser.add_argument(
        "--socket-dir",
        type=Path,
        default=DEFAULT_SOCKET_DIR,
        metavar="DIR",
        help=f"the agent's socket directory on the node, mounted into containers at "
        f"/run/nvshare (default {DEFAULT_SOCKET_DIR})",
    )
    parser.add_argument(
        "--shim-path",
        type=Path,
        default=DEFAULT_SHIM_PATH,
        metavar="FILE",
        help=f"the shim to mount into containers (default {DEFAULT_SHIM_PATH})",
    )
    parser.add_argument(
        "--inventory-interval",
        type=float,
        default=DEFAULT_INVENTORY_INTERVAL_S,
        metavar="SECONDS",
        help="how often to read the GPUs from NVML; a GPU that is gone turns Unhealthy "
        f"(default {DEFAULT_INVENTORY_INTERVAL_S:g})",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help="also log every list sent and every preferred allocation",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    args = parser.parse_args(argv)
    problem = arguments_problem(args)
    if problem:
        parser.exit(2, f"{parser.prog}: error: {problem}\n")
    return args


def package_version() -> str:
    try:
        return metadata.version("nvshare")
    except metadata.PackageNotFoundError:
        return "(version unknown)"


def arguments_problem(args: argparse.Namespace) -> str | None:
    if not 1 <= args.replicas <= MAX_REPLICAS:
        return f"--replicas must be 1 to {MAX_REPLICAS}, got {args.replicas}"
    problem = resource_name_problem(args.resource_name)
    if problem:
        return f"--resource-name {problem}"
    if not args.kubelet_dir.is_dir():
        return f"--kubelet-dir {args.kubelet_dir}: no such directory (is a kubelet installed?)"
    for option, path in (("--socket-dir", args.socket_dir), ("--shim-path", args.shim_path)):
        if not path.is_absolute():
            return f"{option} {path}: give an absolute path (the kubelet mounts it)"
    if not args.shim_path.is_file():
        return f"--shim-path {args.shim_path}: no such file (is the nvshare package installed?)"
    if not 0 < args.inventory_interval <= 3600:
        return f"--inventory-interval must be more than 0 and at most 3600, got {args.inventory_interval:g}"
    return None


async def read_inventory_now(watch: DeviceWatch, problem_before: str | None) -> str | None:
    """One NVML reading into the table; returns NVML's problem, if any.  A GPU
    NVML cannot show (NVML failing included) is one the node cannot use."""
    gpus, problem = await nvml.read_inventory()
    if problem != problem_before:
        if problem:
            log.warning("GPU inventory: %s", problem)
        elif problem_before:
            log.info("GPU inventory: NVML answers again")
    memory = {format_uuid(gpu.uuid): gpu.memory_total_bytes for gpu in gpus}
    for change in await watch.observe([format_uuid(gpu.uuid) for gpu in gpus], memory):
        log.info("%s is %s", change.gpu_uuid, change.health)
    return problem


async def read_inventory_every(watch: DeviceWatch, interval_s: float, problem: str | None) -> None:
    while True:
        await asyncio.sleep(interval_s)
        problem = await read_inventory_now(watch, problem)


async def run(args: argparse.Namespace) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    watch = DeviceWatch(DeviceTable(args.replicas, args.memory_cap_per_replica))
    # The first reading comes before registering, so the kubelet's first list has the GPUs.
    problem = await read_inventory_now(watch, None)
    service = DevicePluginService(watch, NodePaths(str(args.socket_dir), str(args.shim_path)))
    link = KubeletLink(args.kubelet_dir, args.resource_name, service)
    stop_requested = asyncio.create_task(stopping.wait())
    tasks = [
        asyncio.create_task(read_inventory_every(watch, args.inventory_interval, problem)),
        asyncio.create_task(link.keep_registered()),
    ]
    try:
        # The tasks run until cancelled: one that ends has crashed, and takes the
        # plugin down with its traceback (systemd starts it again).
        done, _ = await asyncio.wait([stop_requested, *tasks], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in [stop_requested, *tasks]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await link.close()
    for task in done - {stop_requested}:
        task.result()
    log.info("stopped")


def main(argv=None) -> int:
    args = parse_args(argv)
    eventlog.setup(args.debug)
    try:
        asyncio.run(run(args))
    except EndpointTaken as e:
        log.error("%s", e)
        return 3
    finally:
        eventlog.events.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
