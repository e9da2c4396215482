"""The shim under memory checkers: valgrind memcheck and an AddressSanitizer
build (`make shim-asan`, part of `make check`), each on a client that reaches
the driver through every path the workload has (allocation kinds, all launch
flavours, idle release and re-grant, VMM, IPC)."""

import subprocess

from shim_harness import SHIM_ASAN, STANDIN_GPU

WORKLOAD = ("--loops", 2, "--sleep-ms", 300, "--vmm", "--ipc", "--threads", 2, "--side-thread")


def test_shim_is_valgrind_clean(world, agent):
    valgrind = ["valgrind", "-q", "--error-exitcode=99", "--leak-check=full", "--errors-for-leak-kinds=definite",
                "--show-leak-kinds=definite"]
    client = world.client("procaddr", *WORKLOAD, "--stream", "--alloc", "async", prefix=valgrind)
    code = client.wait(timeout=120)
    assert code == 0, f"memcheck found errors (exit {code})\n{client.describe()}"
    assert client.result()["result"] == "ok"
    agent.wait_for_log(rf"grant gpu={STANDIN_GPU} pid={client.pid}\b")


def test_shim_is_asan_clean(world, agent):
    assert SHIM_ASAN.exists(), "no ASan build of the shim: run `make shim-asan` (make check does)"
    libasan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    # The ASan runtime must come first when the program itself is not instrumented.
    env = world.env(preload=f"{libasan} {SHIM_ASAN}", ASAN_OPTIONS="detect_leaks=1:exitcode=98:abort_on_error=0")
    client = world.client("dlsym", *WORKLOAD, "--fork", env=env)
    code = client.wait(timeout=120)
    assert code == 0, f"AddressSanitizer found errors (exit {code})\n{client.describe()}"
    result = client.result()
    assert result["result"] == "ok" and result["fork_child"] == "ok"
    assert "ERROR: AddressSanitizer" not in client.stderr and "LeakSanitizer" not in client.stderr
    agent.wait_for_log(rf"grant gpu={STANDIN_GPU} pid={client.pid}\b")

