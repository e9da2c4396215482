"""What the build and the tests leave, and what they need (issue 36): make's C
targets say in one line what to install when the compiler is gone (make install
takes it away again), and make check records what it installs so that one
command, make check-clean, takes it away."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-s", "-C", str(REPO), *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("target", ["standin", "shim", "shim-asan"])
def test_a_c_target_without_a_compiler_says_what_to_install(target):
    result = make(target, "CC=/nonexistent/cc")
    assert result.returncode != 0
    ours = [line for line in result.stderr.splitlines() if line.startswith("nvshare:")]
    assert ours == [
        f"nvshare: make {target} needs a C compiler (/nonexistent/cc is missing; make install "
        "removed the build tools it brought): sudo apt-get install gcc make"
    ], result.stderr
    assert "No such file or directory" not in result.stderr


def test_what_make_check_installs_is_recorded_where_make_check_clean_reads_it():
    deps = make("-n", "deps").stdout
    clean = make("-n", "check-clean").stdout
    record = "/var/cache/nvshare-ci/check-deps-brought.txt"
    assert f"packaging/install-deps.sh --record {record} deps-build.txt deps-test.txt" in deps
    assert f"packaging/remove-brought.sh {record}" in clean
    assert "rm -rf /var/cache/nvshare-ci/" in clean
    assert "make check-clean" in (REPO / "README.md").read_text()


def source_files(top: Path) -> list[str]:
    listed = subprocess.run(
        [str(top / "packaging/source-files.sh")], capture_output=True, check=True, timeout=60
    ).stdout
    return sorted(name.decode() for name in listed.split(b"\0") if name)


def test_a_git_archive_inside_another_repository_is_built_from_its_own_files(tmp_path):
    # A release tarball unpacked in a home kept in git (issue 45: make install from a
    # git archive failed with "not a git repository").  safe.directory: make check
    # as root in someone's checkout.
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    copy = tmp_path / "nvshare-0.1.0"
    copy.mkdir()
    archive = subprocess.run(
        ["git", "-c", f"safe.directory={REPO}", "-C", str(REPO), "archive", "HEAD"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(copy)], input=archive, check=True)
    shutil.copy2(REPO / "packaging/source-files.sh", copy / "packaging/source-files.sh")
    (copy / "NOTES").write_text("the admin's own, not ignored\n")
    (copy / "build").mkdir()
    (copy / "build/deb.log").write_text("ignored (/build/)\n")
    (copy / "shim/leftover.o").write_text("ignored (*.o)\n")
    tracked = subprocess.run(
        ["git", "-c", f"safe.directory={REPO}", "-C", str(REPO)]
        + ["ls-tree", "-r", "--name-only", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    # (The script is this tree's, committed or not.)
    expected = {*filter(None, tracked), "packaging/source-files.sh", "NOTES"}
    assert source_files(copy) == sorted(expected)
