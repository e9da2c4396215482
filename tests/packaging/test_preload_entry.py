"""packaging/preload-entry (the one editor of /etc/ld.so.preload) and
nvshare_cli.preload on top of it, against preload files in a temp dir."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from nvshare_cli import preload

REPO = Path(__file__).resolve().parents[2]
HELPER = REPO / "packaging" / "preload-entry"
# Any library ld.so preloads silently into /bin/true stands in for the shim.
LIBRARY = "/lib/x86_64-linux-gnu/libm.so.6"
OTHERS = "# site preloads\n/opt/a.so:/opt/b.so  # two on a line\n\n/opt/c.so\n"


def entry(action: str, preload_file: Path, library: str = LIBRARY) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["sh", str(HELPER), action, library, str(preload_file)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_add_appends_once_and_keeps_comments_and_other_entries(tmp_path):
    preload_file = tmp_path / "ld.so.preload"
    preload_file.write_text(OTHERS.rstrip("\n"))  # no final newline: ours still gets its own line
    assert entry("add", preload_file).returncode == 0
    assert entry("add", preload_file).returncode == 0
    assert preload_file.read_text() == OTHERS + LIBRARY + "\n"


def test_add_creates_the_file_when_missing_and_remove_deletes_it_again(tmp_path):
    preload_file = tmp_path / "ld.so.preload"
    assert entry("add", preload_file).returncode == 0
    assert preload_file.read_text() == LIBRARY + "\n"
    assert oct(preload_file.stat().st_mode & 0o777) == "0o644"
    assert entry("remove", preload_file).returncode == 0
    assert not preload_file.exists()


def test_remove_takes_exactly_our_name_and_leaves_the_rest_byte_for_byte(tmp_path):
    preload_file = tmp_path / "ld.so.preload"
    similar = LIBRARY + ".bak"
    preload_file.write_text(OTHERS + f"{LIBRARY}\n/opt/d.so {LIBRARY} # mixed\n{similar}\n")
    assert entry("remove", preload_file).returncode == 0
    assert preload_file.read_text() == OTHERS + f"/opt/d.so # mixed\n{similar}\n"
    assert entry("remove", preload_file).returncode == 0  # nothing left to do
    assert entry("has", preload_file).returncode == 1


def test_has_ignores_commented_out_names(tmp_path):
    preload_file = tmp_path / "ld.so.preload"
    preload_file.write_text(f"# {LIBRARY}\n")
    assert entry("has", preload_file).returncode == 1
    preload_file.write_text(f"/opt/a.so:{LIBRARY}\n")
    assert entry("has", preload_file).returncode == 0


def test_add_refuses_a_missing_or_unloadable_library_and_leaves_the_file_alone(tmp_path):
    preload_file = tmp_path / "ld.so.preload"
    preload_file.write_text(OTHERS)
    missing = entry("add", preload_file, str(tmp_path / "gone.so"))
    assert missing.returncode == 1 and "no such file" in missing.stderr
    broken = tmp_path / "broken.so"
    broken.write_text("not an ELF object\n")
    refused = entry("add", preload_file, str(broken))
    assert refused.returncode == 1 and "refusing to preload" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert preload_file.read_text() == OTHERS
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.so", "ld.so.preload"]


def test_bad_usage_exits_2_and_relative_paths_are_refused(tmp_path):
    assert (
        subprocess.run(["sh", str(HELPER), "frobnicate", LIBRARY], capture_output=True).returncode
        == 2
    )
    relative = entry("add", tmp_path / "ld.so.preload", "libm.so.6")
    assert relative.returncode == 1 and "absolute path" in relative.stderr


def test_the_file_is_replaced_by_rename_never_rewritten_in_place(tmp_path):
    preload_file = tmp_path / "ld.so.preload"
    preload_file.write_text(OTHERS)
    preload_file.chmod(0o640)
    before = preload_file.stat().st_ino
    assert entry("add", preload_file).returncode == 0
    after = preload_file.stat()
    assert after.st_ino != before  # a new inode: readers saw the old file or the new one
    assert oct(after.st_mode & 0o777) == "0o640"  # mode carried over
    assert [p.name for p in tmp_path.iterdir()] == ["ld.so.preload"]  # no temp file left


def test_a_symlinked_preload_file_stays_a_symlink(tmp_path):
    real = tmp_path / "real.preload"
    real.write_text(OTHERS)
    link = tmp_path / "ld.so.preload"
    link.symlink_to(real)
    assert entry("add", link).returncode == 0
    assert link.is_symlink() and real.read_text() == OTHERS + LIBRARY + "\n"


def test_concurrent_edits_lose_nothing(tmp_path):
    preload_file = tmp_path / "ld.so.preload"
    libraries = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/lib/x86_64-linux-gnu/libdl.so.2",
        "/lib/x86_64-linux-gnu/librt.so.1",
        "/lib/x86_64-linux-gnu/libutil.so.1",
    ]
    results = []
    threads = [
        threading.Thread(target=lambda lib=lib: results.append(entry("add", preload_file, lib)))
        for lib in libraries
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    assert sorted(preload_file.read_text().split()) == sorted(libraries)


# nvshare_cli.preload: the CLI's side, the same helper underneath.


def paths(tmp_path: Path) -> dict:
    return {
        "shim_path": Path(LIBRARY),
        "preload_file": tmp_path / "ld.so.preload",
        "disabled_marker": tmp_path / "nvshare" / "preload-disabled",
    }


def test_cli_disable_remembers_the_choice_and_enable_forgets_it(tmp_path):
    where = paths(tmp_path)
    where["preload_file"].write_text(OTHERS + LIBRARY + "\n")
    assert "enabled" in preload.status(**where)
    assert "disabled" in preload.disable(**where)
    assert where["disabled_marker"].exists()
    assert where["preload_file"].read_text() == OTHERS
    assert preload.status(**where).startswith("preload disabled")
    assert "enabled" in preload.enable(**where)
    assert not where["disabled_marker"].exists()
    assert where["preload_file"].read_text() == OTHERS + LIBRARY + "\n"
    assert preload.read_status(**where).listed


def test_cli_status_points_out_a_drift_between_choice_and_file(tmp_path):
    where = paths(tmp_path)
    where["preload_file"].write_text(OTHERS)
    assert "nvsharectl preload enable" in preload.status(**where)


def test_cli_enable_with_a_missing_shim_fails_with_one_line(tmp_path):
    where = paths(tmp_path) | {"shim_path": tmp_path / "libnvshare.so"}
    with pytest.raises(RuntimeError) as refused:
        preload.enable(**where)
    assert "no such file" in str(refused.value) and "\n" not in str(refused.value)
    assert not where["preload_file"].exists()
