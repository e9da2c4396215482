"""The shim under memory checkers: valgrind memcheck and an AddressSanitizer
build (`make shim-asan`, part of `make check`), each on a client that reaches
the driver through every path the workload has (allocation kinds, all launch
flavours, idle release and re-grant, VMM, IPC), the parking of stream-ordered
frees, and a fork under valgrind.

The fork runs under valgrind only: GCC 12's AddressSanitizer runtime (Debian
bookworm) takes no allocator locks around fork(), so a child forked while
another thread is inside ASan's allocator deadlocks at its first allocation
(seen once in ~25 runs on a loaded 2-core machine: the child's new thread stuck
in ASan's SizeClassAllocator mutex).  LLVM added those fork handlers in
llvm-project#75290; valgrind runs one thread at a time, so its fork is safe."""

import subprocess

import pytest
from shim_harness import SHIM_ASAN, STANDIN_GPU

VALGRIND = [
    "valgrind",
    "-q",
    "--error-exitcode=99",
    "--leak-check=full",
    "--errors-for-leak-kinds=definite",
    "--show-leak-kinds=definite",
]
WORKLOAD = ("--loops", 2, "--sleep-ms", 300, "--vmm", "--ipc", "--threads", 2, "--side-thread")


def test_shim_is_valgrind_clean(world, agent):
    client = world.client("procaddr", *WORKLOAD, "--stream", "--alloc", "async", prefix=VALGRIND)
    code = client.wait(timeout=120)
    assert code == 0, f"memcheck found errors (exit {code})\n{client.describe()}"
    assert client.result()["result"] == "ok"
    agent.wait_for_log(rf"grant gpu={STANDIN_GPU} pid={client.pid}\b")


@pytest.mark.slow  # several seconds: make check runs it, check-fast does not
def test_destroying_and_resetting_contexts_is_valgrind_clean(world, agent):
    client = world.client("contexts", "lifecycle", 100, kernel_us=20, prefix=VALGRIND)
    code = client.wait(timeout=120)
    assert code == 0, f"memcheck found errors (exit {code})\n{client.describe()}"
    assert client.result()["result"] == "ok"


@pytest.mark.slow  # several seconds: make check runs it, check-fast does not
def test_parking_stream_ordered_frees_is_valgrind_clean(world, agent):
    for args, extra in ((("reuse",), {}), (("cap", 12), {"STANDIN_TOTAL_MEM": 64 << 20})):
        client = world.client("stream_ordered", *args, kernel_us=50_000, prefix=VALGRIND, **extra)
        code = client.wait(timeout=120)
        assert code == 0, f"memcheck found errors (exit {code})\n{client.describe()}"
        assert client.result()["result"] == "ok"


@pytest.mark.slow  # several seconds: make check runs it, check-fast does not
def test_forked_child_is_valgrind_clean(world, agent):
    # Memory errors only: in a child forked from a threaded process whatever the
    # parent's other threads held (the stand-in's events, the shim's maps, which
    # its fork handler leaves alone) is unreachable, so leak reports there say
    # nothing; the tests around this one check leaks without a fork.
    valgrind = ["valgrind", "-q", "--error-exitcode=99", "--leak-check=no"]
    client = world.client("procaddr", *WORKLOAD, "--stream", "--fork", prefix=valgrind)
    code = client.wait(timeout=120)
    assert code == 0, f"memcheck found errors (exit {code})\n{client.describe()}"
    result = client.result()
    assert result["result"] == "ok" and result["fork_child"] == "ok"


def test_shim_is_asan_clean(world, agent):
    assert SHIM_ASAN.exists(), "no ASan build of the shim: run `make shim-asan` (make check does)"
    libasan = subprocess.run(
        ["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True
    ).stdout.strip()
    # The ASan runtime must come first when the program itself is not instrumented.
    env = world.env(
        preload=f"{libasan} {SHIM_ASAN}", ASAN_OPTIONS="detect_leaks=1:exitcode=98:abort_on_error=0"
    )
    client = world.client("dlsym", *WORKLOAD, env=env)
    code = client.wait(timeout=120)
    assert code == 0, f"AddressSanitizer found errors (exit {code})\n{client.describe()}"
    result = client.result()
    assert result["result"] == "ok"
    assert "ERROR: AddressSanitizer" not in client.stderr and "LeakSanitizer" not in client.stderr
    agent.wait_for_log(rf"grant gpu={STANDIN_GPU} pid={client.pid}\b")
