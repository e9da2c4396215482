"""nvshare-device-plugin as a process, against the stand-in kubelet over real
gRPC: registration, ListAndWatch, health, Allocate, GetPreferredAllocation,
kubelet restarts, refused requests, and its command line."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import grpc
import pytest
from plugin_harness import H100, L4
from standin_kubelet import StandinKubelet

ENDPOINT = "nvshare.com-gpu.sock"


def replicas(gpu: str, count: int, health: str = "Healthy") -> list[tuple[str, str]]:
    return [(f"{gpu}::{index}", health) for index in range(count)]


def registered(kubelet: StandinKubelet):
    """The plugin's registration and the first device list the kubelet got after it."""
    registration = kubelet.wait_for_registration()
    return registration.request, kubelet.next_devices()


def test_the_plugin_registers_its_resource_and_socket_with_the_kubelet(
    kubelet, kubelet_dir, start_plugin
):
    start_plugin()
    request, _ = registered(kubelet)
    assert request.version == "v1beta1"
    assert request.resource_name == "nvshare.com/gpu"
    assert request.endpoint == ENDPOINT
    assert (kubelet_dir / ENDPOINT).is_socket()
    assert request.options.get_preferred_allocation_available
    assert not request.options.pre_start_required
    # The kubelet asks again over the plugin's socket; the answers agree.
    assert kubelet.options == request.options


def test_list_and_watch_advertises_ten_replicas_of_each_of_two_gpus(kubelet, start_plugin):
    start_plugin()
    _, devices = registered(kubelet)
    # The stand-in NVML also lists a MIG instance: not a whole GPU, not advertised.
    assert devices == replicas(H100, 10) + replicas(L4, 10)


def test_replicas_and_resource_name_are_configurable(kubelet, start_plugin):
    start_plugin("--replicas", "3", "--resource-name", "example.org/shared-gpu")
    request, devices = registered(kubelet)
    assert request.resource_name == "example.org/shared-gpu"
    assert request.endpoint == "example.org-shared-gpu.sock"
    assert devices == replicas(H100, 3) + replicas(L4, 3)


def test_allocate_gives_the_gpu_the_agent_socket_directory_and_the_shim(
    kubelet, start_plugin, shim_file
):
    start_plugin("--socket-dir", "/run/nvshare")
    registered(kubelet)
    response = kubelet.allocate([f"{L4}::3"], [f"{H100}::0", f"{H100}::7"])
    first, second = response.container_responses
    assert dict(first.envs) == {
        "NVIDIA_VISIBLE_DEVICES": L4,
        "LD_PRELOAD": "/usr/lib/nvshare/libnvshare.so",
    }
    assert [(m.container_path, m.host_path, m.read_only) for m in first.mounts] == [
        ("/run/nvshare", "/run/nvshare", True),
        ("/usr/lib/nvshare/libnvshare.so", str(shim_file), True),
    ]
    assert not first.devices  # the GPU's device nodes are NVIDIA's runtime's to add
    assert second.envs["NVIDIA_VISIBLE_DEVICES"] == H100


def test_preferred_allocation_packs_a_request_onto_one_gpu_the_least_shared(kubelet, start_plugin):
    start_plugin("--replicas", "4")
    registered(kubelet)
    # Three of the H100's replicas are taken: the L4 is the least shared.
    available = [f"{H100}::3"] + [f"{L4}::{index}" for index in range(4)]
    assert kubelet.preferred(available, [], 2) == [f"{L4}::0", f"{L4}::1"]
    # A replica the container already holds keeps it on that GPU.
    assert kubelet.preferred(available, [f"{H100}::0"], 2) == [f"{H100}::0", f"{H100}::3"]


def test_a_gpu_that_leaves_the_inventory_turns_unhealthy_on_the_stream_and_comes_back(
    kubelet, start_plugin, hide_gpus
):
    plugin = start_plugin("--replicas", "2")
    registered(kubelet)
    hide_gpus(L4)
    assert kubelet.next_devices() == replicas(H100, 2) + replicas(L4, 2, "Unhealthy")
    with pytest.raises(grpc.RpcError) as refused:
        kubelet.allocate([f"{L4}::0"])
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert L4 in refused.value.details()
    hide_gpus()
    assert kubelet.next_devices() == replicas(H100, 2) + replicas(L4, 2)
    plugin.wait_for_log(f"INFO {L4} is Unhealthy")


def test_nvml_failing_makes_every_gpu_unhealthy(kubelet, start_plugin, hide_gpus):
    start_plugin("--replicas", "1")
    registered(kubelet)
    hide_gpus(H100, L4)
    assert kubelet.next_devices() == replicas(H100, 1, "Unhealthy") + replicas(L4, 1, "Unhealthy")


def test_a_node_where_nvml_is_unavailable_registers_with_no_devices(kubelet, start_plugin):
    plugin = start_plugin(fake_nvml_mode="init-fails")
    _, devices = registered(kubelet)
    assert devices == []
    plugin.wait_for_log("NVML unavailable: Driver Not Loaded")


def test_a_restarted_kubelet_is_registered_with_again_within_a_second(
    kubelet, kubelet_dir, start_plugin
):
    start_plugin()
    registered(kubelet)
    for _ in range(3):
        kubelet.restart()  # deletes the plugin's socket too, as the kubelet does
        registration = kubelet.wait_for_registration(timeout=5)
        delay = registration.received_at - kubelet.listening_since
        assert delay < 1.0, f"registered {delay:.2f} s after the kubelet came back"
        assert (kubelet_dir / ENDPOINT).is_socket()
        # The kubelet talks to the plugin's new socket: a fresh stream and Allocate.
        assert kubelet.next_devices() == replicas(H100, 10) + replicas(L4, 10)
        assert kubelet.allocate([f"{H100}::1"]).container_responses[0].envs


def test_a_plugin_started_before_the_kubelet_registers_once_it_listens(kubelet_dir, start_plugin):
    plugin = start_plugin()
    time.sleep(0.5)  # the plugin is up, with no kubelet.sock to register with
    assert plugin.running()
    late = StandinKubelet(kubelet_dir).start()
    try:
        registration = late.wait_for_registration(timeout=5)
        # The plugin looks every 0.2 s; a loaded machine (CI's check-fast, four tests at once
        # on two cores, beside other work) took 1.44 s from listen() to the Register.  What
        # this tells apart: a plugin that registers once the socket is served, from one that
        # gave up on a kubelet that was not there when it started.
        assert registration.received_at - late.listening_since < 3.0
    finally:
        late.stop()


def test_a_kubelet_socket_made_long_before_it_is_served_is_registered_with_once_served(
    kubelet_dir, start_plugin
):
    # A kubelet binds kubelet.sock, then serves on that same socket: under load, a second
    # or more later.  Refused connections are no failed attempts: no backoff (it reached
    # 1.6 s and more), so the plugin's Register comes within a watch of the listen().
    made = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    made.bind(str(kubelet_dir / "kubelet.sock"))
    try:
        plugin = start_plugin()
        # Refused 5 s: said once in the log (the old backoff would be at 2 s by now).
        plugin.wait_for_log("nobody serves the kubelet's socket", timeout=15)
        assert plugin.running()
        made.listen()
        listening_since = time.monotonic()
        made.settimeout(5.0)
        while True:  # the probe's connection sends nothing; the Register's, HTTP/2's preface
            connection, _ = made.accept()
            connection.settimeout(1.0)
            try:
                first = connection.recv(3)
            except TimeoutError:
                first = b""
            finally:
                connection.close()
            if first == b"PRI":
                break
        assert time.monotonic() - listening_since < 1.0
        assert plugin.log().count("nobody serves the kubelet's socket") == 1
    finally:
        made.close()


def test_a_refused_registration_is_logged_once_and_tried_again(kubelet_dir, start_plugin):
    refusing = StandinKubelet(kubelet_dir, refuse_registrations=1).start()
    try:
        plugin = start_plugin()
        registration = refusing.wait_for_registration(timeout=10)
        assert registration.request.resource_name == "nvshare.com/gpu"
        log = plugin.wait_for_log("INVALID_ARGUMENT: refused by the test")
        assert log.count("did not take the registration") == 1
    finally:
        refusing.stop()


@pytest.mark.parametrize(
    "containers, code, words",
    [
        ([[f"{H100}::0", f"{L4}::0"]], grpc.StatusCode.INVALID_ARGUMENT, [H100, L4, "one GPU"]),
        ([[f"{H100}::10"]], grpc.StatusCode.NOT_FOUND, [f"{H100}::10", "unknown"]),
        ([["nvidia0"]], grpc.StatusCode.NOT_FOUND, ["'nvidia0'"]),
        (
            [[f"{H100}::0"], ["GPU-00000000-0000-0000-0000-000000000000::0"]],
            grpc.StatusCode.NOT_FOUND,
            ["GPU-0000"],
        ),
        ([[]], grpc.StatusCode.INVALID_ARGUMENT, ["no devices"]),
    ],
)
def test_a_bad_allocate_is_a_grpc_error_and_the_plugin_keeps_serving(
    kubelet, start_plugin, containers, code, words
):
    plugin = start_plugin()
    registered(kubelet)
    with pytest.raises(grpc.RpcError) as refused:
        kubelet.allocate(*containers)
    assert refused.value.code() == code
    details = refused.value.details()
    assert "\n" not in details and all(word in details for word in words), details
    assert plugin.running()
    assert (
        kubelet.allocate([f"{L4}::9"]).container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == L4
    )
    plugin.wait_for_log("refused Allocate")


def test_a_second_plugin_on_the_same_socket_exits_3_and_the_first_keeps_serving(
    kubelet, kubelet_dir, start_plugin
):
    first = start_plugin()
    registered(kubelet)
    second = start_plugin()
    assert second.process.wait(30) == 3
    second.wait_for_log(f"another process serves {kubelet_dir / ENDPOINT}")
    assert first.running()
    assert kubelet.allocate([f"{H100}::0"]).container_responses[0].envs


def test_a_socket_left_by_a_plugin_that_died_is_taken_over(kubelet, kubelet_dir, start_plugin):
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(kubelet_dir / ENDPOINT))
    dead.close()  # the file stays, nobody listens
    start_plugin()
    registered(kubelet)
    assert kubelet.allocate([f"{L4}::0"]).container_responses[0].envs


def test_sigterm_stops_the_plugin_and_removes_its_socket(kubelet, kubelet_dir, start_plugin):
    plugin = start_plugin()
    registered(kubelet)
    assert plugin.stop() == 0
    assert not (kubelet_dir / ENDPOINT).exists()
    assert (kubelet_dir / "kubelet.sock").is_socket()  # the kubelet's is not ours to remove


@pytest.mark.parametrize(
    "args, message",
    [
        (["--replicas", "0"], "--replicas must be 1 to 1000, got 0"),
        (["--replicas", "ten"], "argument --replicas: invalid int value: 'ten'"),
        (["--resource-name", "gpu"], "--resource-name 'gpu' is not DOMAIN/NAME"),
        (["--resource-name", "kubernetes.io/gpu"], "reserved by Kubernetes"),
        (["--resource-name", "nvshare.com/"], "the part after '/'"),
        (["--kubelet-dir", "/nonexistent/device-plugins"], "no such directory"),
        (["--shim-path", "libnvshare.so"], "give an absolute path"),
        (["--shim-path", "/nonexistent/libnvshare.so"], "no such file"),
        (["--socket-dir", "run/nvshare"], "give an absolute path"),
        (["--inventory-interval", "0"], "--inventory-interval must be more than 0"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    ],
)
def test_bad_usage_is_one_line_and_exit_status_2(kubelet_dir, shim_file, args, message):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "nvshare_device_plugin",
            "--kubelet-dir",
            str(kubelet_dir),
            "--shim-path",
            str(shim_file),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(
        "nvshare-device-plugin: error: "
    ), result.stderr
    assert message in result.stderr


def test_version_and_help():
    for option in ("--version", "--help"):
        result = subprocess.run(
            [sys.executable, "-m", "nvshare_device_plugin", option],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert "nvshare-device-plugin" in result.stdout
