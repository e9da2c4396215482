/* Built against the stand-in's headers and library, run on build/old's older
 * driver: the calls that driver lacks bind to the preloaded shim's hooks,
 * which must answer CUDA_ERROR_NOT_FOUND rather than call a function that is
 * not there (tests/shim/test_older_driver.py).  Prints each call's result. */
#include <stdio.h>

#include "client_check.h"

int main(void)
{
    CLIENT_CHECK("old_driver", cuInit(0));
    CUdeviceptr pointer = 0;
    CUmemGenericAllocationHandle handle = 0;
    CUmemAllocationProp prop = {0};
    CUipcMemHandle ipc = {{0}};
    printf("client=old_driver cuMemAlloc_v2=%d cuMemAllocAsync=%d cuMemFree_v2=%d cuMemCreate=%d "
           "cuMemRelease=%d cuIpcOpenMemHandle_v2=%d cuIpcCloseMemHandle=%d cuStreamDestroy_v2=%d "
           "cuLaunchKernel=%d\n",
           cuMemAlloc_v2(&pointer, 64), cuMemAllocAsync(&pointer, 64, NULL), cuMemFree_v2(pointer),
           cuMemCreate(&handle, 1 << 21, &prop, 0), cuMemRelease(handle),
           cuIpcOpenMemHandle_v2(&pointer, ipc, 0), cuIpcCloseMemHandle(pointer),
           cuStreamDestroy_v2(NULL), cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    return 0;
}
