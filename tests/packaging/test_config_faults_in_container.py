"""What an admin meets when something is wrong, with the .deb in a booted bookworm
container (issue 36): a bad /etc/nvshare/nvshare.conf never leaves the node
unscheduled, and nvsharectl says at once why an agent that cannot start does not
answer.  Its own container, so that nothing the other container tests do (and no
start they count) stands between the bad file and the first client.  The tests run
in file order, each a stage."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from bookworm_container import Container, ensure_root_tarball, wait_for
from test_deb_in_container import (
    BUS,
    CLIENT,
    NOTEBOOK_UID,
    as_user,
    http_request,
    scraped_samples,
    unit_property,
)

REPO = Path(__file__).resolve().parents[2]
CONFIG = "/etc/nvshare/nvshare.conf"
GOOD = "[scheduler]\ntime_quantum = 12\n"
# Line 3 is wrong; the 20 of line 2 must not apply either: the last good file's 12 does.
BAD = "[scheduler]\ntime_quantum = 20\nanti_thrash = sometimes\n"
FIXED = "[scheduler]\ntime_quantum = 20\nanti_thrash = on\n"
WHERE = f"config {CONFIG} line 3: anti_thrash: anti-thrash must be on, off or auto, got 'sometimes'"
# How long clients keep coming to the agent that runs with the bad file.
CLIENTS_FOR_S = 60

pytestmark = [
    pytest.mark.root,
    pytest.mark.container,
    pytest.mark.slow,
    pytest.mark.skipif(
        not shutil.which("debootstrap") or not shutil.which("systemd-nspawn"),
        reason="needs root, debootstrap and systemd-container (packaging/deps-test.txt)",
    ),
]


@pytest.fixture(scope="module")
def box(stage, bootable):
    with stage("build the .deb (make deb)"):
        subprocess.run(["make", "-C", str(REPO), "deb", "standin"], check=True, capture_output=True)
    deb = sorted((REPO / "build").glob("nvshare_*_amd64.deb"))[-1]
    with stage("bookworm root (debootstrap, or the cached tarball)"):
        tarball = ensure_root_tarball(print)
    workdir = Path(tempfile.mkdtemp(prefix="nvshare-faults-", dir="/var/tmp"))
    container = None
    try:
        container = Container.unpack(tarball, workdir)
        with stage("boot systemd in systemd-nspawn"):
            container.boot(private_network=True)
        shutil.copy(deb, container.path("/root/nvshare.deb"))
        standin = REPO / "tests/standin/build"
        shutil.copy(
            standin / "libcuda.so.1", container.path("/usr/lib/x86_64-linux-gnu/libcuda.so.1")
        )
        shutil.copy(standin / "client_linked", container.path(CLIENT))
        container.run(["ldconfig"])
        container.run(["useradd", "--uid", str(NOTEBOOK_UID), "notebook"])
        with stage("apt install ./nvshare.deb"):
            container.run(
                ["apt-get", "install", "-y", "--no-install-recommends", "/root/nvshare.deb"],
                timeout=300,
            )
        yield container
    finally:
        if container is not None:
            with stage("power off the container"):
                container.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)


def write_config(box: Container, text: str) -> None:
    box.path(CONFIG).parent.mkdir(exist_ok=True)
    box.path(CONFIG).write_text(text)


def get_property(box: Container, name: str):
    """The value as busctl's JSON gives it."""
    return json.loads(box.run(["busctl", "--json=short", "get-property", *BUS, name]).stdout)[
        "data"
    ]


def journal(box: Container, *units: str) -> str:
    args = [arg for unit in units for arg in ("-u", unit)]
    return box.run(["journalctl", "--no-pager", "-o", "cat", *args]).stdout


def run_client(box: Container) -> subprocess.CompletedProcess:
    """A CUDA process of another user, under the preloaded shim only."""
    return box.run(
        as_user(NOTEBOOK_UID, [CLIENT, "--duration-ms", "1000", "--sleep-ms", "20"]),
        check=False,
        timeout=120,
    )


def test_a_good_config_is_served_and_kept_as_the_last_good_one(box):
    write_config(box, GOOD)
    assert run_client(box).returncode == 0
    assert unit_property(box, "nvshare.service", "ActiveState") == "active"
    assert get_property(box, "TimeQuantum") == 12
    assert box.path("/var/lib/nvshare/last-good.conf").read_text() == GOOD
    box.run(["systemctl", "stop", "nvshare.service"])


def test_with_a_bad_config_clients_are_scheduled_for_a_minute_and_nothing_restarts(box, stage):
    write_config(box, BAD)
    grants_before = journal(box, "nvshare.service").count("grant gpu=")
    with stage(f"clients for {CLIENTS_FOR_S} s against the agent with a bad config"):
        began = time.monotonic()
        first = run_client(box)  # the socket starts the agent, as on a node after boot
        main_pid = unit_property(box, "nvshare.service", "MainPID")
        runs = [first]
        while time.monotonic() - began < CLIENTS_FOR_S:
            runs.append(run_client(box))
    for run in runs:
        assert run.returncode == 0, run.stderr[-1500:]
        # Scheduled: never told the agent is away or silent (then it runs unscheduled).
        assert "cannot reach the nvshare agent" not in run.stderr, run.stderr[-1500:]
        assert "has not answered" not in run.stderr, run.stderr[-1500:]
    grants = journal(box, "nvshare.service").count("grant gpu=") - grants_before
    assert grants >= len(runs), (grants, len(runs))
    # The same agent all along: no restart, so no start limit to meet.
    assert unit_property(box, "nvshare.service", "MainPID") == main_pid
    assert unit_property(box, "nvshare.service", "NRestarts") == "0"
    assert unit_property(box, "nvshare.service", "ActiveState") == "active"
    assert unit_property(box, "nvshare.socket", "ActiveState") == "active"  # running: served
    assert box.run(["test", "-S", "/run/nvshare/scheduler.sock"], check=False).returncode == 0
    everything = journal(box, "nvshare.service", "nvshare.socket")
    assert "start-limit-hit" not in everything and "repeated too quickly" not in everything
    # The last good file's settings, not the bad file's nor the defaults.
    assert get_property(box, "TimeQuantum") == 12


def test_systemctl_status_nvsharectl_the_journal_and_the_metrics_name_the_bad_line(box):
    status = box.run(
        ["systemctl", "status", "--full", "--no-pager", "nvshare.service"], check=False
    )
    assert f'Status: "CONFIG ERROR: {WHERE}' in status.stdout, status.stdout
    text = box.run(["nvsharectl", "status"]).stdout
    assert " ".join(line.strip() for line in text.split("\n\n")[0].splitlines()).startswith(
        f"CONFIG ERROR: {WHERE}; serving with the last good config "
        "(a copy in /var/lib/nvshare/last-good.conf)"
    ), text
    assert f"config error: {WHERE}" in journal(box, "nvshare.service")
    problem = get_property(box, "ConfigProblem")
    assert problem.startswith(f"{WHERE}; serving with the last good config"), problem
    scrape = http_request(box, "GET", "/metrics")
    assert scrape["status"] == 200
    samples = scraped_samples(box, scrape["body"])
    (error,) = [s for s in samples if s[0] == "nvshare_config_error"]
    assert error[1]["problem"].startswith(WHERE) and error[2] == 1.0, error


def test_fixing_the_file_and_restarting_once_brings_the_new_settings(box):
    write_config(box, FIXED)
    restart = box.run(["systemctl", "restart", "nvshare.service"], check=False)
    assert restart.returncode == 0, restart.stderr
    assert "repeated too quickly" not in restart.stderr
    assert unit_property(box, "nvshare.service", "ActiveState") == "active"
    assert get_property(box, "TimeQuantum") == 20
    assert get_property(box, "AntiThrashMode") == "on"
    assert get_property(box, "ConfigProblem") == ""
    assert "CONFIG ERROR" not in box.run(["nvsharectl", "status"]).stdout
    wait_for(
        lambda: "CONFIG" not in unit_property(box, "nvshare.service", "StatusText"),
        30,
        "a status line without the old problem",
    )
    assert box.path("/var/lib/nvshare/last-good.conf").read_text() == FIXED
    assert run_client(box).returncode == 0


def test_nvsharectl_status_says_within_2_s_why_an_agent_that_cannot_start_does_not_answer(box):
    # An override with a mistyped option: bad usage, exit 2, no restart.
    override = box.path("/etc/systemd/system/nvshare.service.d/typo.conf")
    override.parent.mkdir(parents=True, exist_ok=True)
    override.write_text("[Service]\nExecStart=\nExecStart=/usr/bin/nvshare-agent --bus sytem\n")
    box.run(["systemctl", "daemon-reload"])
    box.run(["systemctl", "stop", "nvshare.service"])
    try:
        began = time.monotonic()
        result = box.run(["nvsharectl", "status"], check=False, timeout=60)
        seconds = time.monotonic() - began
        assert result.returncode == 1, result.stdout + result.stderr
        assert seconds <= 2.0, (seconds, result.stderr)
        assert "nvshare.service cannot start: failed (failed), result exit-code, exit status 2" in (
            result.stderr
        ), result.stderr
        assert "--bus 'sytem' is not a D-Bus address" in result.stderr, result.stderr
        assert len(result.stderr.splitlines()) == 1, result.stderr
        print(f"nvsharectl status answered in {seconds:.2f} s: {result.stderr.strip()}")
        # Said again at once while the unit stays failed, to a user who may not read the
        # journal: the agent's own line comes from its STATUS=, which systemd keeps.
        began = time.monotonic()
        again = box.run(as_user(NOTEBOOK_UID, ["nvsharectl", "status"]), check=False, timeout=60)
        seconds = time.monotonic() - began
        print(f"as a user, nvsharectl status answered in {seconds:.2f} s")
        assert again.returncode == 1 and seconds <= 2.0, again.stderr
        assert again.stderr == result.stderr, again.stderr
    finally:
        override.unlink()
        box.run(["systemctl", "daemon-reload"])
        box.run(["systemctl", "reset-failed", "nvshare.service"], check=False)
    assert unit_property(box, "nvshare.socket", "SubState") == "listening"
    assert run_client(box).returncode == 0
    assert unit_property(box, "nvshare.service", "ActiveState") == "active"


def test_the_install_screen_names_commands_that_work_on_a_node_without_man(box):
    # A minimal Debian has no man (issue 36): make install's last screen said
    # "man nvsharectl" there.
    assert box.run(["sh", "-c", "command -v man"], check=False).returncode != 0
    shutil.copy(REPO / "packaging/say-installed.sh", box.path("/root/say-installed.sh"))
    screen = box.run(["sh", "/root/say-installed.sh"]).stdout
    assert "man nvsharectl" not in screen, screen
    assert "nvsharectl --help; /usr/share/doc/nvshare/README.md" in screen, screen
    assert box.path("/usr/share/doc/nvshare/README.md").exists()
    assert "/etc/ld.so.preload names /usr/lib/x86_64-linux-gnu/libnvshare.so" in screen, screen
