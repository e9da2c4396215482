"""The shim's shim/cuda_abi.h and the stand-in's tests/standin/cuda_fixture.h are
written independently from the driver API reference; where both declare a
struct that crosses the ABI, they must agree on its layout (cffi computes it
as the C compiler would, without compiling anything)."""

import re

import cffi
import pytest
from shim_harness import REPO

HEADERS = {
    "shim": REPO / "shim" / "cuda_abi.h",
    "standin": REPO / "tests" / "standin" / "cuda_fixture.h",
}
# Structs the shim reads or passes by value, and the fields that matter.
STRUCTS = {
    "CUuuid": ["bytes"],
    "CUipcMemHandle": ["reserved"],
    "CUmemLocation": ["type", "id"],
    "CUmemAllocationProp": [
        "type",
        "requestedHandleTypes",
        "location",
        "win32HandleMetaData",
        "allocFlags",
    ],
    "CUlaunchConfig": ["gridDimX", "blockDimZ", "sharedMemBytes", "hStream", "attrs", "numAttrs"],
    "CUDA_ARRAY_DESCRIPTOR": ["Width", "Height", "Format", "NumChannels"],
    "CUDA_ARRAY3D_DESCRIPTOR": ["Width", "Height", "Depth", "Format", "NumChannels", "Flags"],
}


def typedef_struct(text: str, name: str) -> str:
    """The body of `typedef struct [tag] { ... } name;`, nested braces included."""
    for match in re.finditer(r"typedef\s+struct(?:\s+\w+)?\s*\{", text):
        depth, i = 1, match.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if re.match(rf"\s*{name}\s*;", text[i:]):
            return text[match.end() : i - 1]
    raise AssertionError(f"no typedef struct {name}")


def layout(header, name: str) -> dict:
    text = re.sub(r"/\*.*?\*/|//[^\n]*", "", header.read_text(), flags=re.S)
    ffi = cffi.FFI()
    # Opaque handles are pointers whatever their declared type; CUarray_format is an enum.
    ffi.cdef(
        "typedef void *CUstream; typedef struct CUlaunchAttribute_st CUlaunchAttribute;"
        " typedef int CUarray_format;"
    )
    if name == "CUmemAllocationProp":
        ffi.cdef(f"typedef struct {{ {typedef_struct(text, 'CUmemLocation')} }} CUmemLocation;")
    ffi.cdef(f"typedef struct {{ {typedef_struct(text, name)} }} {name};")
    return {"size": ffi.sizeof(name), **{f: ffi.offsetof(name, f) for f in STRUCTS[name]}}


@pytest.mark.parametrize("name", STRUCTS)
def test_shim_and_standin_agree_on_struct_layout(name):
    assert layout(HEADERS["shim"], name) == layout(HEADERS["standin"], name)


def test_known_layouts():
    # From cuda.h (x86-64): cuLaunchKernelEx's stream sits after seven unsigned ints, padded.
    config = layout(HEADERS["standin"], "CUlaunchConfig")
    assert (config["hStream"], config["size"]) == (32, 56)
    assert layout(HEADERS["standin"], "CUipcMemHandle")["size"] == 64
    assert layout(HEADERS["standin"], "CUmemAllocationProp")["size"] == 32
    # The array descriptors: size_t extents, then the 4-byte format and channels (and flags).
    assert layout(HEADERS["standin"], "CUDA_ARRAY_DESCRIPTOR")["size"] == 24
    array3d = layout(HEADERS["standin"], "CUDA_ARRAY3D_DESCRIPTOR")
    assert (array3d["Format"], array3d["Flags"], array3d["size"]) == (24, 32, 40)
