"""What the build and the tests leave, and what they need (issue 36): make's C
targets say in one line what to install when the compiler is gone (make install
takes it away again), and make check records what it installs so that one
command, make check-clean, takes it away."""

from __future__ import annotations

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
