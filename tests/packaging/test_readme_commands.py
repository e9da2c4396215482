"""README.md's two commands, as a new admin runs them, on a fresh Debian 12 root booted with
systemd: `apt-get install -y make && make install` and `... && make check`, in either order.
Afterwards `apt purge nvshare` and `apt autoremove` leave nothing of what the install brought,
also from a copy that is no git checkout (`git archive`); `make check-clean` takes away what
`make deps` (make check's first step) brought, and nothing else.

Opt-in (NVSHARE_TEST_README=1): the root is fresh, so apt and pip fetch everything over the
network, and `make check` inside runs the whole suite; the containers it makes itself
(tests marked container) cannot nest in this one and are left out there."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import tomllib
from pathlib import Path

import pytest
from bookworm_container import Container, copy_source_tree, ensure_root_tarball

REPO = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
# A fresh Debian 12 as an admin gets it, booted: nothing of nvshare's build or tests.
FRESH = ("systemd", "systemd-sysv", "dbus")
OWNER_UID = 1000
CHECKOUT = "/home/admin/nvshare"
# What must not be on the install's last screen (issue 28).
ALARMING = ("Cannot find package", "useless dependency", "is still *beta*", "unsandboxed")

pytestmark = [
    pytest.mark.root,
    pytest.mark.container,
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("NVSHARE_TEST_README") != "1",
        reason="opt-in: NVSHARE_TEST_README=1 (needs the network, takes many minutes)",
    ),
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("systemd-nspawn"),
        reason="needs root, debootstrap and systemd-container",
    ),
]


GIT_CHECKOUT = "git checkout"
GIT_ARCHIVE = "git archive"  # a release tarball: the tracked files, no .git


@pytest.fixture
def fresh(request, stage, bootable):
    """The fresh root booted, with the checkout under test in the admin's home: a git
    checkout, or (parametrized indirectly) what `git archive` makes of one."""
    source = getattr(request, "param", GIT_CHECKOUT)
    with stage("fresh bookworm root (debootstrap once, then cached)"):
        tarball = ensure_root_tarball(print, include=FRESH)
    workdir = Path(tempfile.mkdtemp(prefix="nvshare-readme-", dir="/var/tmp"))
    box = Container.unpack(tarball, workdir)
    try:
        box.boot()
        box.run(["useradd", "--uid", str(OWNER_UID), "--create-home", "admin"])
        checkout = box.path(CHECKOUT)
        copy_source_tree(REPO, checkout)
        # README.md: "from this git checkout": make deb takes the files git knows.
        git = ["git", "-C", str(checkout), "-c", "user.name=admin", "-c", "user.email=admin@node"]
        subprocess.run([*git, "init", "-q"], check=True)
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", "the checkout under test"], check=True)
        if source == GIT_ARCHIVE:
            archive = subprocess.run([*git, "archive", "HEAD"], capture_output=True, check=True)
            shutil.rmtree(checkout)
            checkout.mkdir()
            subprocess.run(["tar", "-x", "-C", str(checkout)], input=archive.stdout, check=True)
        box.run(["chown", "-R", f"{OWNER_UID}:{OWNER_UID}", CHECKOUT])
        box.run(["chmod", "0700", "/home/admin"])  # Debian 12's default for a home
        yield box
    finally:
        box.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)


def packages(box: Container) -> dict[str, str]:
    """Installed package -> 'manual' or 'auto'."""
    listed = box.run(["dpkg-query", "-W", "-f=${db:Status-Abbrev} ${binary:Package}\\n"]).stdout
    installed = {line.split()[1] for line in listed.splitlines() if line.startswith("ii")}
    auto = set(box.run(["apt-mark", "showauto"]).stdout.split())
    return {name: "auto" if name in auto else "manual" for name in installed}


# Certificates this host trusts for its HTTPS (a proxy's own root, where one
# stands between it and PyPI): the node in the container reaches PyPI as this
# host does, or make check's pip fails there on a self-signed certificate.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
INSIDE_CA_BUNDLE = "/etc/nvshare-test-host-ca.pem"


# What make check runs inside: containers do not nest here.  The whole suite runs once per
# stage (install, then check: beside the installed agent); the other order checks how the
# two commands go together, with the tests that take no seconds of their own.
WHOLE_SUITE = "-m 'not container'"
QUICK_SUITE = "-m 'not container and not slow'"


def readme_command(box: Container, target: str, stage, suite: str = WHOLE_SUITE) -> str:
    # NVSHARE_TEST_README_PYTEST_ARGS narrows make check inside (a few test files, while
    # mending one).
    env = {"PYTEST_ARGS": os.environ.get("NVSHARE_TEST_README_PYTEST_ARGS", suite)}
    if HOST_CA_BUNDLE.is_file():
        shutil.copyfile(HOST_CA_BUNDLE, box.path(INSIDE_CA_BUNDLE))
        env["PIP_CERT"] = INSIDE_CA_BUNDLE
    with stage(f"apt-get install -y make && make {target}"):
        result = box.run(
            ["sh", "-c", f"apt-get install -y -q make >/dev/null && make {target}"],
            cwd=CHECKOUT,
            check=False,
            timeout=3600,
            env=env,
        )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    return output


def assert_installed_and_said_so(box: Container, output: str) -> None:
    last_screen = "\n".join(output.splitlines()[-24:])
    assert f"nvshare {VERSION} is installed." in last_screen, last_screen
    assert "socket:  nvshare.socket listens on /run/nvshare/scheduler.sock" in last_screen
    assert "every process started from now on loads it" in last_screen
    assert "nvsharectl status" in last_screen
    for line in ALARMING:
        assert line not in output, line
    assert box.run(["nvsharectl", "--version"]).stdout == f"nvsharectl {VERSION}\n"


def assert_the_owner_can_clean(box: Container) -> None:
    root_owned = box.run(["find", CHECKOUT, "-uid", "0"]).stdout.split()
    assert root_owned == [], root_owned[:20]
    box.run(
        ["setpriv", f"--reuid={OWNER_UID}", f"--regid={OWNER_UID}", "--clear-groups"]
        + ["make", "-C", CHECKOUT, "clean"]
    )


def purge_and_autoremove(box: Container) -> None:
    box.run(["apt-get", "purge", "-y", "nvshare"], timeout=600)
    box.run(["apt-get", "autoremove", "--purge", "-y"], timeout=600)


def assert_purge_and_autoremove_leave_what_was_there(box: Container, before: dict) -> None:
    purge_and_autoremove(box)
    after = packages(box)
    # make itself is the admin's (README's first half); the rest came with nvshare.
    left = sorted(set(after) - set(before) - {"make"})
    assert left == [], left


@pytest.mark.parametrize("order", ["install-then-check", "check-then-install"])
def test_the_readmes_two_commands_pass_in_either_order(fresh, stage, order):
    before = packages(fresh)
    for target in ("install", "check") if order == "install-then-check" else ("check", "install"):
        connects_before = agent_connects(fresh)
        suite = WHOLE_SUITE if order == "install-then-check" else QUICK_SUITE
        output = readme_command(fresh, target, stage, suite)
        if target == "install":
            assert_installed_and_said_so(fresh, output)
        else:
            # The node's agent ran through the whole suite (install first): no test's
            # process may have asked it for the GPU (issue 45).
            assert agent_connects(fresh) == connects_before
        assert_the_owner_can_clean(fresh)
    assert packages(fresh).get("nvshare") == "manual", before


def agent_connects(box: Container) -> list[str]:
    """The node agent's `connect pid=…` lines in the journal (none before an install)."""
    journal = box.run(
        ["journalctl", "-u", "nvshare.service", "-o", "cat", "--no-pager"], check=False
    ).stdout
    return [line for line in journal.splitlines() if re.search(r"\bconnect pid=", line)]


@pytest.mark.parametrize("fresh", [GIT_CHECKOUT, GIT_ARCHIVE], indirect=True)
def test_install_then_purge_and_autoremove_leave_nothing_it_brought(fresh, stage):
    before = packages(fresh)
    output = readme_command(fresh, "install", stage)
    assert_installed_and_said_so(fresh, output)
    assert_the_owner_can_clean(fresh)
    assert_purge_and_autoremove_leave_what_was_there(fresh, before)


def dpkg_list(box: Container) -> list[str]:
    """What `dpkg -l` lists: each package dpkg knows in any state but not-installed,
    as its state and name ("ii gcc", "rc foo")."""
    listed = box.run(["dpkg-query", "-W", "-f=${db:Status-Abbrev} ${binary:Package}\\n"]).stdout
    return sorted(
        f"{state[:2]} {name}"
        for state, name in (line.split() for line in listed.splitlines())
        if not state.startswith(("un", "pn"))
    )


def make_target(box: Container, target: str, stage) -> str:
    with stage(f"make {target}"):
        result = box.run(["make", target], cwd=CHECKOUT, check=False, timeout=3600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    return output


# What make deps brings to a fresh root, among them what issue 45 found left behind.
MAKE_CHECK_TOOLS = ("gcc", "lintian", "valgrind", "debootstrap", "systemd-container")


def test_check_clean_takes_away_what_make_deps_brought_and_nothing_else(fresh, stage):
    # The admin's own before make check: git (manual, with what it needs) and python3,
    # marked automatic and needed by nothing; make deps wants both and brings neither.
    fresh.run(["apt-get", "install", "-y", "-q", "make", "git", "python3"], timeout=600)
    fresh.run(["apt-mark", "auto", "python3"])
    before, listed_before = packages(fresh), dpkg_list(fresh)
    make_target(fresh, "deps", stage)
    brought = set(packages(fresh)) - set(before)
    assert set(MAKE_CHECK_TOOLS) <= brought, sorted(brought)
    output = make_target(fresh, "check-clean", stage)
    assert f"nvshare: removed the {len(brought)} packages it had installed\n" in output, output
    assert dpkg_list(fresh) == listed_before
    assert packages(fresh) == before  # the marks too: python3 is still automatic
    assert not fresh.path("/var/cache/nvshare-ci").exists()


@pytest.mark.parametrize("purge", ["purge-then-check-clean", "check-clean-then-purge"])
def test_make_deps_install_check_clean_and_purge_leave_the_node_as_it_was(fresh, stage, purge):
    """README.md: make check keeps its tools until make check-clean, make install leaves
    nvshare until apt purge and apt autoremove; in either order the node is as before."""
    fresh.run(["apt-get", "install", "-y", "-q", "make"], timeout=600)
    before, listed_before = packages(fresh), dpkg_list(fresh)
    make_target(fresh, "deps", stage)
    assert_installed_and_said_so(fresh, make_target(fresh, "install", stage))
    if purge == "check-clean-then-purge":
        output = make_target(fresh, "check-clean", stage)
        assert "kept: what is installed needs them)" in output, output
        # What nvshare needs of make deps' packages stayed.
        assert fresh.run(["nvsharectl", "--version"]).stdout == f"nvsharectl {VERSION}\n"
        assert set(MAKE_CHECK_TOOLS).isdisjoint(packages(fresh))
    purge_and_autoremove(fresh)
    if purge == "purge-then-check-clean":
        make_target(fresh, "check-clean", stage)
    assert dpkg_list(fresh) == listed_before
    assert packages(fresh) == before


def test_an_install_whose_build_fails_leaves_nothing_it_brought(fresh, stage):
    pyproject = fresh.path(f"{CHECKOUT}/pyproject.toml")
    pyproject.write_text(pyproject.read_text().replace(f'"{VERSION}"', '"0.0.0-mismatch"', 1))
    fresh.run(["apt-get", "install", "-y", "-q", "make"], timeout=600)
    before = packages(fresh)
    with stage("make install, its build failing"):
        result = fresh.run(["make", "install"], cwd=CHECKOUT, check=False, timeout=3600)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-6000:]
    assert "pyproject.toml differs" in output, output[-6000:]
    assert "nvshare: removed the " in output, output[-6000:]
    assert packages(fresh) == before
