"""A stand-in for shares.py's trainer, without PyTorch or a GPU: trainer.py's arguments
and JSON line, each step a few kernels of the stand-in driver (tests/standin, through
ctypes) and a synchronise, so that the shim (preloaded) gates it and the agent schedules
it like a trainer.  SIGTERM stops it after the step under way, as trainer.py."""

import argparse
import ctypes
import json
import pathlib
import signal
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--ready-file")
    parser.add_argument("--kernels", type=int, default=5)
    args = parser.parse_args()
    cuda = ctypes.CDLL("libcuda.so.1")

    def check(result: int) -> None:
        if result != 0:
            raise SystemExit(f"stand-in driver call failed: {result}")

    device, context = ctypes.c_int(), ctypes.c_void_p()
    module, spin = ctypes.c_void_p(), ctypes.c_void_p()
    check(cuda.cuInit(0))
    check(cuda.cuDeviceGet(ctypes.byref(device), 0))
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device))
    check(cuda.cuCtxSetCurrent(context))
    check(cuda.cuModuleLoadData(ctypes.byref(module), b"standin fake image"))
    check(cuda.cuModuleGetFunction(ctypes.byref(spin), module, b"spin"))
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    started, step_times = time.time(), []
    while not stopping and (not step_times or step_times[-1] - started < args.seconds):
        for _ in range(args.kernels):
            check(cuda.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, None, None, None))
        check(cuda.cuCtxSynchronize())
        step_times.append(time.time())
        if len(step_times) == 1:
            pathlib.Path(args.ready_file).touch()
    print(json.dumps({"step_times": step_times, "loss": 0.5, "checksum": 1.0}))


if __name__ == "__main__":
    main()
