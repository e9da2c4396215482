"""The shim's hook table (shim/hooks.h) against libcuda 580's export list.

A driver function that submits GPU work or allocates device memory and is not
in the table would run ungated or unconverted without anyone noticing; these
tests turn that into a failure.  tests/data/libcuda-exports.txt was read from
the real driver on the H100 (see its header).
"""

import pathlib
import re
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
HOOKS_H = REPO / "shim" / "hooks.h"
EXPORTS = REPO / "tests" / "data" / "libcuda-exports.txt"

# Families that run work on the GPU (kernels, graphs, copies, sets, prefetches,
# stream memory operations) or allocate device memory.
SUBMITS_WORK = re.compile(
    r"^cu(Launch|GraphLaunch|GraphUpload|Memcpy|Memset|MemPrefetch|MemDiscard|"
    r"MemBatchDecompress|StreamBatchMemOp|StreamWriteValue)"
)
ALLOCATES = re.compile(
    r"^cu(MemAlloc(?!Host)|MemCreate$|IpcOpenMemHandle|ArrayCreate|Array3DCreate|"
    r"MipmappedArrayCreate|GraphAddMemAllocNode|MemPoolImportPointer)"
)

# The version-1 entry points take 32-bit device pointers (CUdeviceptr_v1) and
# sizes; cuda.h has mapped these names to their _v2 since CUDA 3.2, and
# cuGetProcAddress returns the _v2 for every cudaVersion >= 3020 (measured on
# the H100 with driver 580), so no program built in this century reaches
# them.  Their _v2 replacements are in the table (checked below).
LEGACY_V1 = {
    "cuArray3DCreate",
    "cuArrayCreate",
    "cuMemAlloc",
    "cuMemAllocPitch",
    "cuMemcpy2D",
    "cuMemcpy2DAsync",
    "cuMemcpy2DUnaligned",
    "cuMemcpy3D",
    "cuMemcpy3DAsync",
    "cuMemcpyAtoA",
    "cuMemcpyAtoD",
    "cuMemcpyAtoH",
    "cuMemcpyAtoHAsync",
    "cuMemcpyDtoA",
    "cuMemcpyDtoD",
    "cuMemcpyDtoDAsync",
    "cuMemcpyDtoH",
    "cuMemcpyDtoHAsync",
    "cuMemcpyHtoA",
    "cuMemcpyHtoAAsync",
    "cuMemcpyHtoD",
    "cuMemcpyHtoDAsync",
    "cuMemsetD8",
    "cuMemsetD16",
    "cuMemsetD32",
    "cuMemsetD2D8",
    "cuMemsetD2D16",
    "cuMemsetD2D32",
}

# Deliberately passed through untouched, each for a reason.
EXEMPT = {
    "cuGraphAddMemAllocNode": "graph memory nodes allocate when the graph is launched, and "
    "graph launches are gated; their memory cannot be managed",
    "cuMemPoolImportPointer": "imports another process's pool memory (IPC), which cannot be "
    "managed; the exporting process accounts for it",
}


def table_columns():
    """(kind, name, signature or kind, stream, launch or prototype) for every row."""
    text = HOOKS_H.read_text()
    body = text[text.index("#define NVSHARE_HOOK_TABLE") : text.index("enum nvshare_hook_kind")]
    rows = re.findall(r"\b(GATED|OWN)\((\w+),\s*(\w+),\s*(\w+),\s*(\w+)\)", body)
    assert rows, "no rows parsed from shim/hooks.h"
    return rows


def table_rows():
    return [(name, kind, detail) for kind, name, detail, _, _ in table_columns()]


def exports():
    lines = EXPORTS.read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def hooked_names():
    return {name for name, _, _ in table_rows()}


def test_every_function_that_submits_work_or_allocates_is_hooked():
    hooked = hooked_names()
    missing = sorted(
        name
        for name in exports()
        if (SUBMITS_WORK.match(name) or ALLOCATES.match(name))
        and name not in hooked
        and name not in LEGACY_V1
        and name not in EXEMPT
    )
    assert not missing, f"driver functions neither hooked nor exempted: {missing}"


def test_every_legacy_v1_exemption_has_its_v2_hooked():
    hooked = hooked_names()
    unmatched = sorted(name for name in LEGACY_V1 if name + "_v2" not in hooked)
    assert not unmatched, f"legacy names whose _v2 is not hooked: {unmatched}"


def test_exemptions_name_real_driver_functions():
    unknown = sorted((set(EXEMPT) | LEGACY_V1) - exports())
    assert not unknown, f"exemptions for names libcuda does not export: {unknown}"


def test_every_row_names_a_driver_export_once():
    names = [name for name, _, _ in table_rows()]
    assert len(names) == len(set(names)), "duplicate rows"
    unknown = sorted(set(names) - exports())
    assert not unknown, f"rows for names libcuda does not export: {unknown}"


def test_gated_rows_cover_their_families_kinds():
    for name, kind, detail in table_rows():
        if SUBMITS_WORK.match(name):
            assert kind == "GATED", f"{name} submits work but is {kind}:{detail}"
        if ALLOCATES.match(name):
            assert detail == "ALLOC", f"{name} allocates but is {kind}:{detail}"


def test_every_gated_signature_is_defined():
    defined = set(re.findall(r"#define (SIG_\w+)", HOOKS_H.read_text()))
    used = {detail for _, kind, detail in table_rows() if kind == "GATED"}
    assert used <= defined, f"undefined signatures: {sorted(used - defined)}"


def test_the_stream_column_agrees_with_the_name():
    # The hooks act on the column (NULL is the calling thread's own stream or the legacy
    # one), never on the name; a row copied from its sibling must not keep the wrong one.
    wrong = [
        (name, stream)
        for _, name, _, stream, _ in table_columns()
        if stream != ("PER_THREAD" if name.endswith(("_ptsz", "_ptds")) else "LEGACY")
    ]
    assert not wrong, f"rows whose stream column disagrees with their name: {wrong}"


def test_launch_rows_are_the_kernel_and_graph_launches():
    # LAUNCH feeds the queue-ahead bound (it times kernels between its marks).
    launches = {name for kind, name, _, _, launch in table_columns() if launch == "LAUNCH"}
    assert launches == {
        name
        for kind, name, _, _, _ in table_columns()
        if kind == "GATED"
        and re.match(
            r"cu(Launch(Kernel|KernelEx|CooperativeKernel|Grid|GridAsync)?|GraphLaunch)"
            r"(_ptsz)?$",
            name,
        )
    }
    other = {launch for kind, _, _, _, launch in table_columns() if kind == "GATED"} - {"LAUNCH"}
    assert other == {"SUBMIT"}, other


@pytest.fixture(scope="module")
def built_shim():
    subprocess.run(["make", "-s", "-C", str(REPO / "shim")], check=True)
    return REPO / "shim" / "build" / "libnvshare.so"


def test_library_exports_exactly_the_table_and_dlsym(built_shim):
    listing = subprocess.run(
        ["nm", "-D", "--defined-only", str(built_shim)], capture_output=True, text=True, check=True
    ).stdout
    symbols = {line.split()[-1] for line in listing.splitlines() if line.split()[1] in "TtWi"}
    # The driver's names carry the shim's version node; dlsym carries glibc's two.
    plain = {s.removesuffix("@@NVSHARE_1") for s in symbols}
    assert plain == hooked_names() | {"dlsym@@GLIBC_2.34", "dlsym@GLIBC_2.2.5"}
