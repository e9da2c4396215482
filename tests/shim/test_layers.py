"""tools/check_shim_layers.py: the shim's files call and include only downwards
(shim/layers.txt), and the check fails when one does not.

The failing cases run the check over a copy of shim/ (sources, layer table and
built objects) with one file made wrong; an upward call is compiled into that
copy's object, since the check reads calls from the objects."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "shim"
CHECK = REPO / "tools" / "check_shim_layers.py"


def run_check(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CHECK), *map(str, args)], capture_output=True, text=True, timeout=60
    )


def compile_object(source: Path, obj: Path) -> None:
    subprocess.run(
        ["gcc", "-std=gnu11", "-fPIC", "-O2", "-pthread", "-c"]
        + ["-include", str(source.parent / "glibc_baseline.h"), f"-I{source.parent}"]
        + [str(source), "-o", str(obj)],
        check=True,
    )


@pytest.fixture
def shim_copy(tmp_path) -> Path:
    copy = tmp_path / "shim"
    copy.mkdir()
    for path in SHIM.iterdir():
        if path.suffix in (".c", ".h") or path.name == "layers.txt":
            shutil.copy(path, copy)
    (copy / "build").mkdir()
    for obj in (SHIM / "build").glob("*.o"):
        shutil.copy(obj, copy / "build")
    return copy


def test_the_shim_calls_and_includes_only_downwards():
    done = run_check()
    assert (done.returncode, done.stdout) == (0, ""), done.stdout + done.stderr


def test_the_copy_checks_clean_before_it_is_made_wrong(shim_copy):
    done = run_check("--shim", shim_copy)
    assert (done.returncode, done.stdout) == (0, ""), done.stdout + done.stderr


def test_an_upward_include_fails(shim_copy):
    log_c = shim_copy / "log.c"
    log_c.write_text(
        log_c.read_text().replace(
            '#include "log.h"\n', '#include "log.h"\n#include "lock_client.h"\n', 1
        )
    )
    done = run_check("--shim", shim_copy)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "shim/log.c:3: includes lock_client.h (layer client) from layer base"
    ], done.stdout


def test_an_upward_call_fails(shim_copy):
    # memory_accounting.c (layer state) starting the client (lifecycle.c, layer top), as
    # memory.c used to: declared by hand, with no #include, so only the objects show it.
    accounting = shim_copy / "memory_accounting.c"
    accounting.write_text(
        accounting.read_text()
        + "\nvoid nvshare_client_start(void);\n"
        + "void nvshare_memory_start_client(void)\n{\n    nvshare_client_start();\n}\n"
    )
    compile_object(accounting, shim_copy / "build" / "memory_accounting.o")
    done = run_check("--shim", shim_copy)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "shim/memory_accounting.c: calls nvshare_client_start in shim/lifecycle.c "
        "(layer top) from layer state"
    ], done.stdout


def test_a_file_missing_from_the_layer_table_fails(shim_copy):
    (shim_copy / "newcomer.c").write_text("int nvshare_newcomer;\n")
    compile_object(shim_copy / "newcomer.c", shim_copy / "build" / "newcomer.o")
    done = run_check("--shim", shim_copy)
    assert done.returncode == 1
    assert "shim/newcomer.c: not in the layer table (layers.txt)" in done.stdout.splitlines()


def test_files_of_one_layer_calling_each_other_in_a_circle_fail(tmp_path):
    shim = tmp_path / "shim"
    (shim / "build").mkdir(parents=True)
    (shim / "glibc_baseline.h").write_text("")
    (shim / "layers.txt").write_text("base glibc_baseline.h one two\n")
    (shim / "one.c").write_text("void two(void);\nvoid one(void)\n{\n    two();\n}\n")
    (shim / "two.c").write_text("void one(void);\nvoid two(void)\n{\n    one();\n}\n")
    for name in ("one", "two"):
        compile_object(shim / f"{name}.c", shim / "build" / f"{name}.o")
    done = run_check("--shim", shim)
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        "shim/one.c: calls in a circle with shim/two.c (layer base)"
    ], done.stdout
