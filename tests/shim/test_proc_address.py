"""cuGetProcAddress under the shim, asked directly (as cudart does) for every
flavour: hooks for what must be gated or converted, the driver's own answer
(NULL, status 2) for functions newer than the caller's cudaVersion, and
CUDA_ERROR_NOT_FOUND for names that do not exist."""

import json
import subprocess
import sys
import textwrap

from shim_harness import SHIM, STANDIN_BUILD, clean_env

PROBE = textwrap.dedent("""
    import ctypes, json
    class DlInfo(ctypes.Structure):
        _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                    ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]
    libc = ctypes.CDLL(None)
    cuda = ctypes.CDLL("libcuda.so.1")
    def owner(address):
        info = DlInfo()
        if not address or not libc.dladdr(ctypes.c_void_p(address), ctypes.byref(info)):
            return None
        return info.fname.decode().rsplit("/", 1)[-1]
    answers = {}
    for name, version, flags in json.loads(input()):
        fn, status = ctypes.c_void_p(), ctypes.c_int(-1)
        result = cuda.cuGetProcAddress_v2(name.encode(), ctypes.byref(fn), version, ctypes.c_uint64(flags),
                                          ctypes.byref(status))
        answers[f"{name}/{version}/{flags}"] = [result, owner(fn.value), status.value]
    fn = ctypes.c_void_p()
    result = cuda.cuGetProcAddress(b"cuMemAlloc", ctypes.byref(fn), 12000, ctypes.c_uint64(0))
    answers["v1:cuMemAlloc"] = [result, owner(fn.value), 0]
    print(json.dumps(answers))
""")

ASKED = [
    ("cuGetProcAddress", 13000, 0),
    ("cuGetProcAddress", 11000, 0),
    ("cuLaunchKernel", 13000, 0),
    ("cuLaunchKernel", 13000, 2),
    ("cuLaunchKernelEx", 12000, 2),
    ("cuLaunchKernelEx", 11000, 0),
    ("cuLaunchCooperativeKernel", 13000, 2),
    ("cuGraphLaunch", 12000, 0),
    ("cuMemAlloc", 3020, 0),
    ("cuMemAllocPitch", 13000, 0),
    ("cuMemAllocAsync", 12000, 2),
    ("cuMemAllocAsync", 11000, 0),
    ("cuMemFree", 13000, 0),
    ("cuMemcpyHtoD", 13000, 2),
    ("cuMemsetD32Async", 13000, 2),
    ("cuMemGetInfo", 13000, 0),
    ("cuNoSuchFunction", 13000, 0),
]


def ask(asked):
    env = clean_env(
        LD_LIBRARY_PATH=STANDIN_BUILD, LD_PRELOAD=SHIM, NVSHARE_SOCKET="/nonexistent/nvshare.sock"
    )
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        input=json.dumps(asked),
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_get_proc_address_hands_out_hooks_and_keeps_the_drivers_refusals():
    answers = ask(ASKED)
    for name, version, flags in ASKED:
        result, owner, status = answers[f"{name}/{version}/{flags}"]
        key = f"{name}@{version} flags={flags}"
        if name == "cuNoSuchFunction":
            assert (result, owner, status) == (500, None, 1), key
        elif (name, version) in {
            ("cuGetProcAddress", 11000),
            ("cuLaunchKernelEx", 11000),
            ("cuMemAllocAsync", 11000),
        }:
            assert (result, owner, status) == (0, None, 2), (
                f"{key}: the driver's VERSION_NOT_SUFFICIENT"
            )
        else:
            assert (result, owner, status) == (0, "libnvshare.so", 0), (
                f"{key} escaped the shim: {owner}"
            )
    assert answers["v1:cuMemAlloc"][:2] == [0, "libnvshare.so"], (
        "the v1 cuGetProcAddress escaped the shim"
    )
