"""The .deb installed with apt into a clean bookworm root booted with systemd.

One container for the module; the tests run in file order, each one stage of
an operator's life with the package: install, first client, settings over
D-Bus, the preload, the device plugin meeting a (stand-in) kubelet, a
notebook-style client, who is who (another user's transient systemd unit) in
nvsharectl and in a Prometheus scrape of the metrics socket, a restart under
load, the operator's preload switch across an upgrade, purge.  The container
has a network of its own (a loopback device), so the metrics socket's
127.0.0.1:9402 is not the host's.
"""

from __future__ import annotations

import gzip
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import tomllib
from pathlib import Path

import pytest
from bookworm_container import Container, copy_source_tree, ensure_root_tarball, wait_for

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "agent"))
from other_users import readable_python_path  # noqa: E402
from test_man_pages import OPTION, mentions, rendered  # noqa: E402

SHIM = "/usr/lib/x86_64-linux-gnu/libnvshare.so"
PORTABLE_SHIM = "/usr/lib/x86_64-linux-gnu/nvshare/libnvshare-portable.so"
BUS = [
    "io.github.nvshare.Scheduler1",
    "/io/github/nvshare/Scheduler1",
    "io.github.nvshare.Scheduler1",
]
ADMIN_UID, NOTEBOOK_UID = 1000, 1001
CLIENT = "/usr/local/bin/standin-client"
UNITS = ("nvshare.socket", "nvshare.service")
PLUGIN_UNITS = ("nvshare-device-plugin.path", "nvshare-device-plugin.service")
METRICS_UNITS = ("nvshare-metrics.socket", "nvshare-metrics@.service")
METRICS_URL = "http://127.0.0.1:9402/metrics"
KUBELET_DIR = "/var/lib/kubelet/device-plugins"
# The test's own files inside the container: readable by the units, which see
# neither /root (ProtectHome=) nor the container's /tmp (a tmpfs of its own).
TEST_FILES = "/usr/local/lib/nvshare-test"

pytestmark = [
    pytest.mark.root,
    pytest.mark.container,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("debootstrap") or not shutil.which("systemd-nspawn"),
        reason="needs root, debootstrap and systemd-container (packaging/deps-test.txt)",
    ),
]


@pytest.fixture(scope="module")
def deb(stage) -> Path:
    with stage("build the .deb (make deb)"):
        subprocess.run(["make", "-C", str(REPO), "deb"], check=True, capture_output=True)
    debs = sorted((REPO / "build").glob("nvshare_*_amd64.deb"))
    assert debs, "make deb produced no build/nvshare_*_amd64.deb"
    return debs[-1]


@pytest.fixture(scope="module")
def container(stage, bootable, deb):
    with stage("bookworm root (debootstrap, or the cached tarball)"):
        tarball = ensure_root_tarball(print)
    workdir = Path(tempfile.mkdtemp(prefix="nvshare-container-", dir="/var/tmp"))
    box = None
    try:
        with stage("unpack the root"):
            box = Container.unpack(tarball, workdir)
        with stage("boot systemd in systemd-nspawn"):
            box.boot(private_network=True)
        # /root, not /tmp: systemd mounts a fresh tmpfs on the container's /tmp.
        shutil.copy(deb, box.path("/root/nvshare.deb"))
        standin = REPO / "tests/standin/build"
        if not (standin / "libcuda.so.1").exists():
            subprocess.run(["make", "-C", str(REPO), "standin"], check=True, capture_output=True)
        # The stand-in plays the NVIDIA driver: installed system-wide as the
        # real libcuda.so.1 is, so a client with a scrubbed environment finds it.
        shutil.copy(standin / "libcuda.so.1", box.path("/usr/lib/x86_64-linux-gnu/libcuda.so.1"))
        shutil.copy(standin / "client_linked", box.path(CLIENT))
        box.run(["ldconfig"])
        box.run(["useradd", "--uid", str(ADMIN_UID), "alice"])
        box.run(["useradd", "--uid", str(NOTEBOOK_UID), "notebook"])
        yield box
    finally:
        if box is not None:
            with stage("power off the container"):
                box.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)


def as_user(uid: int, argv: list[str]) -> list[str]:
    """argv as another user with nothing inherited: how a spawner starts a notebook."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "env", "-i"] + argv


def unit_property(box: Container, unit: str, name: str) -> str:
    return box.run(["systemctl", "show", "-P", name, unit]).stdout.strip()


def nvshare_clients(box: Container) -> list[dict]:
    result = box.run(["nvsharectl", "clients", "--json"], check=False)
    return json.loads(result.stdout) if result.returncode == 0 else []


def metrics_instances(box: Container) -> list[str]:
    """The nvshare-metrics@ instances systemd knows of, running or left behind."""
    listed = box.run(
        ["systemctl", "list-units", "--all", "--plain", "--no-legend", "nvshare-metrics@*"]
    )
    return [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]


# One HTTP request to the metrics socket from inside the container: METHOD PATH [ACCEPT].
HTTP_REQUEST = """
import http.client, json, sys
connection = http.client.HTTPConnection("127.0.0.1", 9402, timeout=60)
headers = {"Accept": sys.argv[3]} if len(sys.argv) > 3 else {}
connection.request(sys.argv[1], sys.argv[2], headers=headers)
response = connection.getresponse()
print(json.dumps({"status": response.status, "headers": dict(response.getheaders()),
                  "body": response.read().decode()}))
"""
# A scrape read by the container's own prometheus_client (Debian's, the package's
# dependency): [name, labels, value] per sample.
PARSE_SCRAPE = """
import json, sys
from prometheus_client.parser import text_string_to_metric_families
print(json.dumps([[s.name, s.labels, s.value]
                  for family in text_string_to_metric_families(sys.stdin.read())
                  for s in family.samples]))
"""


def metrics_journal(box: Container) -> str:
    return box.run(["journalctl", "--no-pager", "-o", "cat", "-u", "nvshare-metrics@*"]).stdout


def http_request(box: Container, method: str, path: str, *accept: str) -> dict:
    return json.loads(box.run(["python3", "-c", HTTP_REQUEST, method, path, *accept]).stdout)


def scraped_samples(box: Container, text: str) -> list:
    return json.loads(box.run(["python3", "-c", PARSE_SCRAPE], input=text).stdout)


def test_apt_installs_the_package_and_enables_the_socket(container, stage):
    with stage("apt install ./nvshare.deb"):
        container.run(
            ["apt-get", "install", "-y", "--no-install-recommends", "/root/nvshare.deb"],
            timeout=300,
        )
    assert unit_property(container, "nvshare.socket", "ActiveState") == "active"
    assert unit_property(container, "nvshare.socket", "SubState") == "listening"
    assert unit_property(container, "nvshare.socket", "UnitFileState") == "enabled"
    # Nothing connected yet: the agent is not running.
    assert unit_property(container, "nvshare.service", "ActiveState") == "inactive"
    assert container.run(["getent", "group", "nvshare-admin"]).returncode == 0
    metrics_user = container.run(["getent", "passwd", "nvshare-metrics"]).stdout.split(":")
    assert metrics_user[5:] == ["/nonexistent", "/usr/sbin/nologin\n"], metrics_user
    # The metrics socket listens too; nothing runs behind it until a scrape.
    assert unit_property(container, "nvshare-metrics.socket", "ActiveState") == "active"
    assert unit_property(container, "nvshare-metrics.socket", "SubState") == "listening"
    assert unit_property(container, "nvshare-metrics.socket", "UnitFileState") == "enabled"
    assert unit_property(container, "nvshare-metrics.socket", "Listen") == "127.0.0.1:9402 (Stream)"
    assert metrics_instances(container) == []


def test_the_admin_group_exists_before_dbus_reads_the_policy_naming_it(container):
    # dbus-daemon reloads its configuration as soon as the policy file is
    # unpacked; with the group made only in the postinst, it dropped the
    # admin rule then, and refused its members until some later reload.
    dbus_log = container.run(["journalctl", "--no-pager", "-o", "cat", "-u", "dbus.service"]).stdout
    assert "Reloaded configuration" in dbus_log
    assert 'Unknown group "nvshare-admin"' not in dbus_log, dbus_log


def test_installed_units_pass_systemd_analyze_verify(container):
    result = container.run(
        ["systemd-analyze", "verify"]
        + [f"/lib/systemd/system/{unit}" for unit in UNITS + PLUGIN_UNITS + METRICS_UNITS],
        check=False,
    )
    assert result.returncode == 0 and result.stdout + result.stderr == "", result.stderr


def test_the_units_documentation_and_the_readme_links_resolve(container):
    urls = [
        url
        for unit in UNITS + PLUGIN_UNITS + METRICS_UNITS
        # A template has properties only as an instance.
        for url in unit_property(container, unit.replace("@.", "@0."), "Documentation").split()
    ]
    assert len(urls) == 6
    for url in urls:
        assert url.startswith("file:") and container.path(url[len("file:") :]).is_file(), url
    readme = container.path("/usr/share/doc/nvshare/README.md").read_text()
    links = set(re.findall(r"\]\((docs/[\w.]+\.md)\)", readme))
    assert links
    for link in links:
        assert container.path(f"/usr/share/doc/nvshare/{link}").is_file(), link
    # docs/kubernetes.md links the manifests, installed beside docs/.
    kubernetes = container.path("/usr/share/doc/nvshare/docs/kubernetes.md").read_text()
    manifests = set(re.findall(r"\]\(\.\./(kubernetes/[\w.-]+)\)", kubernetes))
    assert len(manifests) == 3, manifests
    for link in manifests:
        assert container.path(f"/usr/share/doc/nvshare/{link}").is_file(), link


def test_manual_pages_are_installed_and_name_every_option_of_the_installed_programs(
    container, tmp_path
):
    # tests/test_man_pages.py checks the pages against the checkout; this is
    # bookworm's typer and argparse, as installed, against the installed pages,
    # read the same way.
    for program, page in (
        ("nvsharectl", "/usr/share/man/man1/nvsharectl.1.gz"),
        ("nvshare-agent", "/usr/share/man/man8/nvshare-agent.8.gz"),
        ("nvshare-device-plugin", "/usr/share/man/man8/nvshare-device-plugin.8.gz"),
        ("nvshare-metrics", "/usr/share/man/man8/nvshare-metrics.8.gz"),
    ):
        source = tmp_path / Path(page).stem
        source.write_bytes(gzip.decompress(container.path(page).read_bytes()))
        text = rendered(source)
        accepted = set(OPTION.findall(container.run([program, "--help"]).stdout))
        assert "--help" in accepted, program
        missing = [name for name in sorted(accepted) if not mentions(text, name)]
        assert missing == [], f"{page} does not name {missing}"


def test_first_client_starts_the_agent_which_reports_ready_and_status(container, stage):
    with stage("first connection starts nvshare.service"):
        container.run(
            [
                "python3",
                "-c",
                "import socket; s = socket.socket(socket.AF_UNIX); "
                "s.connect('/run/nvshare/scheduler.sock')",
            ]
        )
        # Type=notify: "active" only after the agent sent READY=1.
        wait_for(
            lambda: unit_property(container, "nvshare.service", "ActiveState") == "active",
            60,
            "nvshare.service to become active",
        )
    assert wait_for(
        lambda: unit_property(container, "nvshare.service", "StatusText"),
        30,
        "a STATUS= line from the agent",
    )
    assert unit_property(container, "nvshare.service", "NRestarts") == "0"


def test_set_tq_over_dbus_is_read_back_by_busctl(container):
    container.run(["nvsharectl", "set-tq", "10"])
    result = container.run(["busctl", "get-property"] + BUS + ["TimeQuantum"])
    assert result.stdout.split() == ["u", "10"]


def test_unprivileged_user_is_refused(container):
    container.run(["usermod", "-aG", "nvshare-admin", "alice"])
    outsider = container.run(
        as_user(NOTEBOOK_UID, ["/usr/bin/nvsharectl", "set-tq", "20"]), check=False
    )
    assert outsider.returncode == 1
    assert "permission denied" in outsider.stderr.lower()
    by_busctl = container.run(
        as_user(
            NOTEBOOK_UID, ["/usr/bin/busctl", "set-property"] + BUS + ["TimeQuantum", "u", "20"]
        ),
        check=False,
    )
    assert by_busctl.returncode != 0 and "denied" in by_busctl.stderr.lower()
    # Reading is for everyone; the value did not change.
    read = container.run(
        as_user(NOTEBOOK_UID, ["/usr/bin/busctl", "get-property"] + BUS + ["TimeQuantum"])
    )
    assert read.stdout.split() == ["u", "10"]
    # A member of nvshare-admin may (setpriv --clear-groups, so name the group).
    admin = container.run(
        [
            "setpriv",
            f"--reuid={ADMIN_UID}",
            f"--regid={ADMIN_UID}",
            "--groups=nvshare-admin",
            "env",
            "-i",
            "/usr/bin/nvsharectl",
            "set-tq",
            "12",
        ],
        check=False,
    )
    assert admin.returncode == 0, admin.stderr
    container.run(["nvsharectl", "set-tq", "10"])


def test_preload_holds_the_shim_and_ordinary_programs_still_work(container):
    entries = container.path("/etc/ld.so.preload").read_text().split()
    assert entries.count(SHIM) == 1
    for argv in (["/bin/true"], ["python3", "-c", "print('hello')"], ["apt-get", "check"]):
        result = container.run(argv, check=False)
        assert result.returncode == 0, (argv, result.stderr)
        assert "ld.so" not in result.stderr and "[nvshare]" not in result.stderr, result.stderr
    # The shim really is in every new process.
    maps = container.run(["cat", "/proc/self/maps"]).stdout
    assert SHIM in maps


def test_the_programs_print_the_version_in_pyproject(container):
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for program, name in (
        ("/usr/bin/nvsharectl", "nvsharectl"),
        ("/usr/bin/nvshare-agent", "nvshare-agent"),
        ("/usr/bin/nvshare-metrics", "nvshare-metrics"),
    ):
        assert container.run([program, "--version"]).stdout == f"{name} {version}\n"


def test_the_shim_tests_pass_under_the_installed_preload(container, stage):
    # Where admins run the suite: a node whose /etc/ld.so.preload names the installed
    # shim, which then loads into every test process too, beside the checkout's build.
    assert SHIM in container.path("/etc/ld.so.preload").read_text().split()
    checkout = container.path("/root/nvshare")
    copy_source_tree(REPO, checkout)
    for built in ("shim/build", "tests/standin/build"):
        shutil.copytree(REPO / built, checkout / built, symlinks=True)
    # The venv's Python packages (pytest, the pinned libraries), for the container's
    # python3: Debian's 3.11, as the venv's.
    shutil.copytree(readable_python_path(), container.path("/root/pylib"))
    with stage("tests/shim under the installed preload"):
        result = container.run(
            [
                "python3",
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-n",
                "2",
                "-m",
                "not container",
                "tests/shim",
            ],
            env={"PYTHONPATH": "/root/pylib", "PYTHONDONTWRITEBYTECODE": "1"},
            cwd="/root/nvshare",
            check=False,
            timeout=900,
        )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_the_portable_shim_on_top_of_the_preloaded_one_leaves_one_in_charge(container):
    # README.md's container recipe sets LD_PRELOAD to this file; run on the node itself
    # the process has both, and the preloaded one hooks it.
    result = container.run(
        [CLIENT, "--loops", "2"], env={"LD_PRELOAD": PORTABLE_SHIM, "NVSHARE_DEBUG": "1"}
    )
    assert "result=ok managed=1" in result.stdout, result
    assert "another copy of libnvshare.so came first" in result.stderr, result.stderr
    maps = container.run(["cat", "/proc/self/maps"], env={"LD_PRELOAD": PORTABLE_SHIM}).stdout
    assert SHIM in maps and PORTABLE_SHIM in maps


def test_the_device_plugin_stays_inactive_on_a_node_without_a_kubelet(container):
    assert not container.path(KUBELET_DIR).exists()
    path_unit, service = PLUGIN_UNITS
    assert unit_property(container, path_unit, "UnitFileState") == "enabled"
    assert unit_property(container, path_unit, "ActiveState") == "active"  # waiting
    assert unit_property(container, service, "ActiveState") == "inactive"
    # The postinst started it; its condition said no.
    assert unit_property(container, service, "ConditionResult") == "no"
    assert plugin_processes(container) == ""


def plugin_processes(container: Container) -> str:
    found = container.run(
        ["sh", "-c", "grep -l 'nvshare-[d]evice-plugin' /proc/[0-9]*/cmdline || true"]
    )
    return found.stdout.strip()


class StandinKubeletInContainer:
    """tests/device_plugin/standin_kubelet.py run by the container's python3
    (Debian's python3-grpcio, the installed package's stubs); its JSON lines
    are read as they come."""

    def __init__(self, container: Container):
        script = f"{TEST_FILES}/standin_kubelet.py"
        self.process = container.popen(
            ["python3", script, KUBELET_DIR],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.events: queue.Queue[dict] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.events.put(json.loads(line))

    def next_event(self, kind: str, timeout: float = 60) -> object:
        while True:
            try:
                event = self.events.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(
                    f"no {kind!r} from the stand-in kubelet within {timeout:g} s"
                ) from None
            if kind in event:
                return event[kind]

    def send(self, line: str) -> None:
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def stop(self) -> str:
        # Its stdin closing ends it; a signal would only reach nsenter, which
        # would leave it running inside with our pipes open.
        self.process.stdin.close()
        self.process.wait(timeout=30)
        return self.process.stderr.read()


def test_the_device_plugin_starts_and_registers_once_a_kubelet_is_there(container, stage):
    # The GPUs come from the stand-in pynvml, which the unit is given in place of
    # the package's copy of the real one (there is no NVML in the container).
    for name in ("device_plugin/standin_kubelet.py", "agent/fake_nvml/pynvml.py"):
        target = container.path(f"{TEST_FILES}/{Path(name).name}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / "tests" / name, target)
    dropin = container.path("/etc/systemd/system/nvshare-device-plugin.service.d/test.conf")
    dropin.parent.mkdir(parents=True)
    dropin.write_text(f"[Service]\nEnvironment=PYTHONPATH={TEST_FILES}\n")
    container.run(["systemctl", "daemon-reload"])
    service = PLUGIN_UNITS[1]
    kubelet = StandinKubeletInContainer(container)
    try:
        with stage("stand-in kubelet appears, the path unit starts the plugin, it registers"):
            registered = kubelet.next_event("registered")
        assert registered == {
            "version": "v1beta1",
            "endpoint": "nvshare.com-gpu.sock",
            "resource_name": "nvshare.com/gpu",
            "preferred_allocation": True,
        }
        devices = kubelet.next_event("devices")
        assert len(devices) == 20 and {health for _, health in devices} == {"Healthy"}
        assert devices[0] == ["GPU-0d84ee44-b797-1c71-8ccd-cefec22161de::0", "Healthy"]
        assert unit_property(container, service, "ActiveState") == "active"
        assert unit_property(container, service, "ConditionResult") == "yes"

        kubelet.send("allocate GPU-11111111-2222-3333-4444-555555555555::4")
        given = kubelet.next_event("allocate")
        assert given["envs"] == {
            "NVIDIA_VISIBLE_DEVICES": "GPU-11111111-2222-3333-4444-555555555555",
            "LD_PRELOAD": "/usr/lib/nvshare/libnvshare.so",
        }
        assert given["mounts"] == [
            {"container_path": "/run/nvshare", "host_path": "/run/nvshare", "read_only": True},
            {
                "container_path": "/usr/lib/nvshare/libnvshare.so",
                "host_path": PORTABLE_SHIM,
                "read_only": True,
            },
        ]
        kubelet.send("allocate GPU-11111111-2222-3333-4444-555555555555::0 nvidia0")
        assert kubelet.next_event("error").startswith("NOT_FOUND: unknown device ID 'nvidia0'")
    finally:
        err = kubelet.stop()
        dropin.unlink()  # from here on the unit runs as installed
        container.run(["systemctl", "daemon-reload"])
    assert "Traceback" not in err, err
    journal = container.run(["journalctl", "--no-pager", "-o", "cat", "-u", service]).stdout
    print(f"{service}'s journal:\n{journal}")
    assert "registered nvshare.com/gpu with the kubelet" in journal, journal
    assert "Traceback" not in journal, journal
    assert unit_property(container, service, "NRestarts") == "0"
    # The kubelet left; the plugin waits for the next one.
    assert unit_property(container, service, "ActiveState") == "active"


def test_notebook_style_client_registers_and_survives_an_agent_restart(container, stage):
    # Another uid, an empty environment: only /etc/ld.so.preload brings the shim.
    client = container.popen(
        as_user(NOTEBOOK_UID, [CLIENT, "--duration-ms", "20000", "--sleep-ms", "20"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def registered():
            return [c for c in nvshare_clients(container) if c.get("uid") == NOTEBOOK_UID]

        with stage("stand-in client registers with the agent"):
            wait_for(registered, 60, "the notebook client in `nvsharectl clients`")
        status = container.run(["nvsharectl", "status"]).stdout
        assert str(registered()[0]["pid"]) in status, status

        with stage("systemctl restart nvshare with the client connected"):
            old_pid = unit_property(container, "nvshare.service", "MainPID")
            container.run(["systemctl", "restart", "nvshare.service"])
            assert unit_property(container, "nvshare.service", "MainPID") != old_pid
            # The socket never went away, so the shim reconnects and registers again.
            assert unit_property(container, "nvshare.socket", "ActiveState") == "active"
            wait_for(registered, 60, "the client to register with the restarted agent")
        out, err = client.communicate(timeout=120)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    assert client.returncode == 0, f"client failed across the restart: {out[-500:]} {err[-1500:]}"
    assert unit_property(container, "nvshare.service", "NRestarts") == "0"


def test_status_names_the_user_and_unit_of_another_users_transient_unit(container, stage):
    # Who is who (issue 28): a process that systemd-run started as a transient unit of
    # another user shows with that user's name and its unit, in text and in JSON.
    unit = "nvshare-who-test"
    container.run(
        [
            "systemd-run",
            "--quiet",
            "--uid=notebook",
            f"--unit={unit}",
            CLIENT,
            "--duration-ms",
            "120000",
            "--sleep-ms",
            "20",
        ]
    )
    try:

        def in_the_unit():
            return [c for c in nvshare_clients(container) if c.get("unit") == f"{unit}.service"]

        with stage("a client in a transient unit of user notebook registers"):
            (client,) = wait_for(in_the_unit, 60, f"a client of {unit}.service")
        pid = client["pid"]
        assert (client["user"], client["uid"], client["container"]) == (
            "notebook",
            NOTEBOOK_UID,
            "",
        )
        assert unit_property(container, f"{unit}.service", "MainPID") == str(pid)

        status = json.loads(container.run(["nvsharectl", "status", "--json"]).stdout)
        (listed,) = [c for c in status["clients"] if c["pid"] == pid]
        assert (listed["user"], listed["unit"]) == ("notebook", f"{unit}.service")
        row = re.compile(rf"^\s*{pid}\s+notebook\s+.*\[{unit}\]$", re.MULTILINE)
        text = container.run(["nvsharectl", "status"]).stdout
        assert row.search(text), text
        table = container.run(["nvsharectl", "clients"]).stdout
        assert table.splitlines()[0].split()[:2] == ["PID", "USER"] and row.search(table), table

        # The same in a scrape of the installed metrics socket, read by Debian's
        # prometheus_client: each client's identity as nvsharectl gives it.
        with stage("scrape the metrics socket (one nvshare-metrics@ instance)"):
            answer = http_request(container, "GET", "/metrics")
        assert answer["status"] == 200, answer
        assert answer["headers"]["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        samples = scraped_samples(container, answer["body"])
        clients = json.loads(container.run(["nvsharectl", "clients", "--json"]).stdout)
        assert ["nvshare_agent_up", {}, 1.0] in samples, metrics_journal(container)
        scraped = [labels for name, labels, _ in samples if name == "nvshare_client_info"]
        keys = ("pid", "uid", "user", "command", "unit", "container")
        assert sorted(scraped, key=str) == sorted(
            ({key: str(c[key]) for key in keys} for c in clients), key=str
        )
        assert {"pid": str(pid), "uid": str(NOTEBOOK_UID), "user": "notebook"}.items() <= next(
            labels for labels in scraped if labels["pid"] == str(pid)
        ).items()
        holding_or_not = [
            labels["state"]
            for name, labels, value in samples
            if name == "nvshare_client_state" and labels["pid"] == str(pid) and value == 1
        ]
        assert len(holding_or_not) == 1  # one state per GPU it uses
    finally:
        container.run(["systemctl", "stop", f"{unit}.service"], check=False)


def test_the_metrics_socket_answers_each_request_in_an_instance_that_leaves_nothing(container):
    assert http_request(container, "GET", "/nope")["status"] == 404
    refused = http_request(container, "POST", "/metrics")
    assert refused["status"] == 405 and refused["headers"]["Allow"] == "GET, HEAD"
    openmetrics = http_request(container, "GET", "/metrics", "application/openmetrics-text")
    assert openmetrics["body"].endswith("# EOF\n")
    # Each instance ended, and CollectMode= left none listed, failed or not.
    wait_for(lambda: metrics_instances(container) == [], 30, "the instances to end")
    journal = metrics_journal(container)
    print(f"nvshare-metrics@*'s journal:\n{journal}")
    assert len(re.findall(r"request refused status=404 method='GET' target='/nope'", journal)) == 1
    assert len(re.findall(r"request refused status=405 method='POST'", journal)) == 1
    assert "Traceback" not in journal and "agent did not answer" not in journal, journal
    # Written by the exporter itself, as its own user.
    uid = container.run(["id", "-u", "nvshare-metrics"]).stdout.strip()
    records = container.run(
        ["journalctl", "-u", "nvshare-metrics@*", "-o", "json", "--output-fields=_UID,MESSAGE"]
    ).stdout.splitlines()
    refusals = [json.loads(r) for r in records if "request refused" in r]
    assert len(refusals) == 2 and {r["_UID"] for r in refusals} == {uid}, refusals


def test_operator_preload_switch_survives_an_upgrade(container, stage):
    container.run(["nvsharectl", "preload", "disable"])
    assert (
        SHIM not in container.path("/etc/ld.so.preload").read_text()
        if container.path("/etc/ld.so.preload").exists()
        else True
    )
    with stage("apt reinstall (the upgrade path of the maintainer scripts)"):
        container.run(["apt-get", "install", "-y", "--reinstall", "/root/nvshare.deb"], timeout=300)
    preload = container.path("/etc/ld.so.preload")
    assert not preload.exists() or SHIM not in preload.read_text().split()
    assert "disabled" in container.run(["nvsharectl", "preload", "status"]).stdout
    container.run(["nvsharectl", "preload", "enable"])
    assert preload.read_text().split().count(SHIM) == 1
    assert "enabled" in container.run(["nvsharectl", "preload", "status"]).stdout


# Connects to the agent's socket every 10 ms until /root/probe-stop exists; prints
# how many connects failed and why.
SOCKET_PROBE = """
import collections, os, socket, time
failed = collections.Counter()
while not os.path.exists('/root/probe-stop'):
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect('/run/nvshare/scheduler.sock')
    except OSError as error:
        failed[error.strerror] += 1
    finally:
        probe.close()
    time.sleep(0.01)
print(sum(failed.values()), dict(failed))
"""


def test_an_upgrade_keeps_the_socket_listening_and_restarts_the_agent(container, stage):
    container.run(
        [
            "python3",
            "-c",
            "import socket; socket.socket(socket.AF_UNIX).connect('/run/nvshare/scheduler.sock')",
        ]
    )
    wait_for(
        lambda: unit_property(container, "nvshare.service", "ActiveState") == "active",
        60,
        "nvshare.service to become active",
    )
    old_pid = unit_property(container, "nvshare.service", "MainPID")
    container.path("/root/probe-stop").unlink(missing_ok=True)
    probe = container.popen(
        ["python3", "-c", SOCKET_PROBE], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        with stage("apt reinstall while a client connects every 10 ms"):
            container.run(
                ["apt-get", "install", "-y", "--reinstall", "/root/nvshare.deb"], timeout=300
            )
        container.path("/root/probe-stop").touch()
        out, err = probe.communicate(timeout=60)
    finally:
        if probe.poll() is None:
            probe.kill()
            probe.wait()
    assert out.split()[0] == "0", f"connects failed during the upgrade: {out} {err[-500:]}"
    # The agent that ran the old code was replaced; the socket stayed up throughout.
    wait_for(
        lambda: unit_property(container, "nvshare.service", "ActiveState") == "active",
        60,
        "nvshare.service to be active again",
    )
    assert unit_property(container, "nvshare.service", "MainPID") not in (old_pid, "0")
    assert unit_property(container, "nvshare.socket", "ActiveState") == "active"
    # The upgrade restarted the metrics socket; a scrape runs the new code.
    assert unit_property(container, "nvshare-metrics.socket", "SubState") == "listening"
    assert http_request(container, "GET", "/metrics")["status"] == 200


def test_someone_elses_broken_preload_entry_does_not_block_ours(container):
    preload = container.path("/etc/ld.so.preload")
    container.run(["nvsharectl", "preload", "disable"])
    before = preload.read_text() if preload.exists() else ""
    preload.write_text(before + "/opt/gone/libfoo.so\n")
    try:
        # Every program now complains about /opt/gone/libfoo.so; the dry run of ours must
        # not count that against the shim (nor the postinst's, which runs the same helper).
        result = container.run(["nvsharectl", "preload", "enable"], check=False)
        assert result.returncode == 0, result.stderr
        assert preload.read_text().split() == before.split() + ["/opt/gone/libfoo.so", SHIM]
    finally:
        container.run(["/usr/lib/nvshare/preload-entry", "remove", "/opt/gone/libfoo.so"])
    assert preload.read_text().split().count(SHIM) == 1


def test_a_removal_called_off_after_the_prerm_puts_the_entry_back(container):
    # dpkg runs `prerm remove`, and when the removal fails afterwards, `postinst abort-remove`
    # (likewise deconfigure / abort-deconfigure); the package then stays installed.
    preload = container.path("/etc/ld.so.preload")
    for prerm, postinst in (("remove", "abort-remove"), ("deconfigure", "abort-deconfigure")):
        container.run(["/var/lib/dpkg/info/nvshare.prerm", prerm])
        assert not preload.exists() or SHIM not in preload.read_text().split()
        container.run(["/var/lib/dpkg/info/nvshare.postinst", postinst])
        assert preload.read_text().split().count(SHIM) == 1, postinst
    # An operator who disabled the preload keeps it off.
    container.run(["nvsharectl", "preload", "disable"])
    container.run(["/var/lib/dpkg/info/nvshare.prerm", "remove"])
    container.run(["/var/lib/dpkg/info/nvshare.postinst", "abort-remove"])
    assert not preload.exists() or SHIM not in preload.read_text().split()
    container.run(["nvsharectl", "preload", "enable"])
    # The prerm stopped the socket (a removal); the abort started it again.
    assert unit_property(container, "nvshare.socket", "ActiveState") == "active"


def test_purge_leaves_nothing_behind(container, stage):
    # Another entry of the operator's must survive the purge untouched.
    preload = container.path("/etc/ld.so.preload")
    preload.write_text(
        "# operator's comment\n/usr/lib/x86_64-linux-gnu/libc.so.6\n" + preload.read_text()
    )
    shipped = container.run(["dpkg-query", "-L", "nvshare"]).stdout.split()
    with stage("apt purge nvshare"):
        container.run(["apt-get", "purge", "-y", "nvshare"], timeout=300)
    assert preload.read_text() == "# operator's comment\n/usr/lib/x86_64-linux-gnu/libc.so.6\n"
    left = [p for p in shipped if container.path(p).exists() and not container.path(p).is_dir()]
    assert left == []
    for path in (
        "/etc/nvshare",
        "/var/lib/nvshare",
        "/run/nvshare",
        "/usr/lib/nvshare",
        "/etc/systemd/system/sockets.target.wants/nvshare.socket",
        "/etc/systemd/system/paths.target.wants/nvshare-device-plugin.path",
        "/etc/systemd/system/sockets.target.wants/nvshare-metrics.socket",
        f"{KUBELET_DIR}/nvshare.com-gpu.sock",  # the plugin removed its socket as it stopped
    ):
        assert not container.path(path).exists(), path
    units = container.run(["systemctl", "list-unit-files", "--no-legend", "nvshare*"], check=False)
    assert units.stdout.strip() == ""  # (and exit 1: no unit matched)
    assert (
        container.run(["systemctl", "show", "-P", "LoadState", "nvshare.service"]).stdout.strip()
        == "not-found"
    )
    assert container.run(["getent", "group", "nvshare-admin"], check=False).returncode == 2
    assert container.run(["getent", "passwd", "nvshare-metrics"], check=False).returncode == 2
    assert container.run(["getent", "group", "nvshare-metrics"], check=False).returncode == 2
    # No agent left running (minbase has no pgrep).
    agents = container.run(["sh", "-c", "grep -l 'nvshare-[a]gent' /proc/[0-9]*/cmdline || true"])
    assert agents.stdout.strip() == ""
    assert plugin_processes(container) == ""
    for unit in PLUGIN_UNITS + ("nvshare-metrics.socket",):
        assert unit_property(container, unit, "LoadState") == "not-found", unit
    assert metrics_instances(container) == []
    # Nothing listens on the metrics port any more.
    refused = container.run(
        ["python3", "-c", "import socket; socket.create_connection(('127.0.0.1', 9402), 5)"],
        check=False,
    )
    assert "ConnectionRefusedError" in refused.stderr, refused.stderr
    assert container.run(["dpkg-query", "-W", "nvshare"], check=False).returncode != 0


def test_lintian_reports_no_error_and_no_unexplained_warning(deb, stage):
    # Every remaining warning is overridden in packaging/debian/nvshare.lintian-overrides
    # and explained in docs/packaging.md.
    with stage("lintian"):
        result = subprocess.run(
            ["lintian", "--fail-on", "error,warning", str(deb)],
            capture_output=True,
            text=True,
            check=False,
        )
    assert result.returncode == 0, result.stdout + result.stderr
