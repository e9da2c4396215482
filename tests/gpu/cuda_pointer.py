"""Asks the driver whether a device pointer lives in managed memory (the GPU workloads use it)."""

import ctypes

CU_POINTER_ATTRIBUTE_IS_MANAGED = 8


def is_managed(pointer: int) -> bool:
    libcuda = ctypes.CDLL("libcuda.so.1")
    flag = ctypes.c_uint(0)
    result = libcuda.cuPointerGetAttribute(
        ctypes.byref(flag), CU_POINTER_ATTRIBUTE_IS_MANAGED, ctypes.c_uint64(pointer)
    )
    if result != 0:
        raise RuntimeError(f"cuPointerGetAttribute failed with CUresult {result}")
    return bool(flag.value)
