/*
 * The workload every test client runs, whatever way it reached the driver.
 * Each client fills a `struct driver` (linked symbols, dlsym, or
 * cuGetProcAddress) and calls client_main().
 */
#ifndef STANDIN_WORKLOAD_H
#define STANDIN_WORKLOAD_H

#include "cuda_fixture.h"

/* field name (the API's base name), exported symbol whose type it has */
#define DRIVER_API(X)                                               \
    X(cuInit, cuInit)                                               \
    X(cuGetErrorName, cuGetErrorName)                               \
    X(cuDeviceGet, cuDeviceGet)                                     \
    X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain)           \
    X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2)      \
    X(cuCtxSetCurrent, cuCtxSetCurrent)                             \
    X(cuModuleLoadData, cuModuleLoadData)                           \
    X(cuModuleGetFunction, cuModuleGetFunction)                     \
    X(cuModuleUnload, cuModuleUnload)                               \
    X(cuMemAlloc, cuMemAlloc_v2)                                    \
    X(cuMemAllocPitch, cuMemAllocPitch_v2)                          \
    X(cuMemAllocManaged, cuMemAllocManaged)                         \
    X(cuMemAllocAsync, cuMemAllocAsync)                             \
    X(cuMemFree, cuMemFree_v2)                                      \
    X(cuMemFreeAsync, cuMemFreeAsync)                               \
    X(cuMemGetInfo, cuMemGetInfo_v2)                                \
    X(cuPointerGetAttribute, cuPointerGetAttribute)                 \
    X(cuMemcpyHtoD, cuMemcpyHtoD_v2)                                \
    X(cuMemcpyDtoH, cuMemcpyDtoH_v2)                                \
    X(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2)                      \
    X(cuMemsetD32, cuMemsetD32_v2)                                  \
    X(cuLaunchKernel, cuLaunchKernel)                               \
    X(cuLaunchKernelEx, cuLaunchKernelEx)                           \
    X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel)         \
    X(cuGraphCreate, cuGraphCreate)                                 \
    X(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags)     \
    X(cuGraphLaunch, cuGraphLaunch)                                 \
    X(cuGraphExecDestroy, cuGraphExecDestroy)                       \
    X(cuGraphDestroy, cuGraphDestroy)                               \
    X(cuStreamCreate, cuStreamCreate)                               \
    X(cuStreamSynchronize, cuStreamSynchronize)                     \
    X(cuStreamDestroy, cuStreamDestroy_v2)                          \
    X(cuEventCreate, cuEventCreate)                                 \
    X(cuEventRecord, cuEventRecord)                                 \
    X(cuEventSynchronize, cuEventSynchronize)                       \
    X(cuEventElapsedTime, cuEventElapsedTime)                       \
    X(cuEventDestroy, cuEventDestroy_v2)                            \
    X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity) \
    X(cuMemCreate, cuMemCreate)                                     \
    X(cuMemRelease, cuMemRelease)                                   \
    X(cuMemRetainAllocationHandle, cuMemRetainAllocationHandle)     \
    X(cuMemAddressReserve, cuMemAddressReserve)                     \
    X(cuMemAddressFree, cuMemAddressFree)                           \
    X(cuMemMap, cuMemMap)                                           \
    X(cuMemUnmap, cuMemUnmap)                                       \
    X(cuMemSetAccess, cuMemSetAccess)                               \
    X(cuIpcGetMemHandle, cuIpcGetMemHandle)                         \
    X(cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2)                    \
    X(cuIpcCloseMemHandle, cuIpcCloseMemHandle)

struct driver {
#define STANDIN_DRIVER_FIELD(base, symbol) __typeof__(&symbol) base;
    DRIVER_API(STANDIN_DRIVER_FIELD)
#undef STANDIN_DRIVER_FIELD
};

/* Fills *driver (per_thread: ask for the per-thread default stream variants
 * where the client can choose) or prints why not; 0 on success. */
typedef int (*driver_loader)(struct driver *driver, int per_thread);

/* Parses the common options, runs the workload, prints one result line.
 * Exit status: 0 ok, 1 a CUDA call failed or a result was wrong, 2 bad usage. */
int client_main(const char *client_name, driver_loader load, int argc, char **argv);

#endif /* STANDIN_WORKLOAD_H */
