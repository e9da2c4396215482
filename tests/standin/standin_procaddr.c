/*
 * Stand-in driver: cuGetProcAddress and cuGetProcAddress_v2.
 *
 * As the real driver does (measured on the H100 with driver 580), a base
 * name resolves to the newest ABI variant that the caller's cudaVersion
 * allows ("cuMemAlloc" -> cuMemAlloc_v2), to its per-thread-stream variant under
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (_ptsz/_ptds), and to NULL
 * with VERSION_NOT_SUFFICIENT when the function is newer than cudaVersion.
 * Every returned pointer is the address of one of this library's own exported
 * functions (the library is linked -Bsymbolic, so a preloaded interposer's
 * symbols never leak into these answers, as they never do from the real
 * driver).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "standin.h"

static const struct {
    const char *name;
    void *address;
} exported[] = {
#define STANDIN_EXPORTED(function) {#function, (void *)function},
#include "exports.inc"
#undef STANDIN_EXPORTED
};

/* Versioned names: since = the first cudaVersion that resolves to symbol;
 * per_thread = the symbol for the per-thread default stream (from 7000 on). */
struct variant {
    const char *name;
    int since;
    const char *symbol;
    const char *per_thread;
};
static const struct variant variants[] = {
    {"cuGetProcAddress", 11030, "cuGetProcAddress", NULL},
    {"cuGetProcAddress", 12000, "cuGetProcAddress_v2", NULL},
    {"cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2", NULL},
    {"cuDeviceGetUuid", 9020, "cuDeviceGetUuid", NULL},
    {"cuDeviceGetUuid", 11040, "cuDeviceGetUuid_v2", NULL},
    {"cuDevicePrimaryCtxRelease", 7000, "cuDevicePrimaryCtxRelease", NULL},
    {"cuDevicePrimaryCtxRelease", 11000, "cuDevicePrimaryCtxRelease_v2", NULL},
    {"cuDevicePrimaryCtxReset", 7000, "cuDevicePrimaryCtxReset", NULL},
    {"cuDevicePrimaryCtxReset", 11000, "cuDevicePrimaryCtxReset_v2", NULL},
    {"cuDevicePrimaryCtxSetFlags", 7000, "cuDevicePrimaryCtxSetFlags", NULL},
    {"cuDevicePrimaryCtxSetFlags", 11000, "cuDevicePrimaryCtxSetFlags_v2", NULL},
    {"cuCtxCreate", 3020, "cuCtxCreate_v2", NULL},
    {"cuCtxDestroy", 4000, "cuCtxDestroy_v2", NULL},
    {"cuCtxPushCurrent", 4000, "cuCtxPushCurrent_v2", NULL},
    {"cuCtxPopCurrent", 4000, "cuCtxPopCurrent_v2", NULL},
    {"cuCtxSynchronize", 2000, "cuCtxSynchronize", NULL},
    {"cuCtxSynchronize", 13000, "cuCtxSynchronize_v2", NULL},
    {"cuStreamDestroy", 4000, "cuStreamDestroy_v2", NULL},
    {"cuStreamSynchronize", 2000, "cuStreamSynchronize", "cuStreamSynchronize_ptsz"},
    {"cuStreamQuery", 2000, "cuStreamQuery", "cuStreamQuery_ptsz"},
    {"cuStreamWaitEvent", 3020, "cuStreamWaitEvent", "cuStreamWaitEvent_ptsz"},
    {"cuStreamAddCallback", 5000, "cuStreamAddCallback", "cuStreamAddCallback_ptsz"},
    {"cuLaunchHostFunc", 10000, "cuLaunchHostFunc", "cuLaunchHostFunc_ptsz"},
    {"cuEventRecord", 2000, "cuEventRecord", "cuEventRecord_ptsz"},
    {"cuEventDestroy", 4000, "cuEventDestroy_v2", NULL},
    {"cuMemAlloc", 3020, "cuMemAlloc_v2", NULL},
    {"cuMemAllocPitch", 3020, "cuMemAllocPitch_v2", NULL},
    {"cuMemFree", 3020, "cuMemFree_v2", NULL},
    {"cuMemGetInfo", 3020, "cuMemGetInfo_v2", NULL},
    {"cuMemAllocAsync", 11020, "cuMemAllocAsync", "cuMemAllocAsync_ptsz"},
    {"cuMemAllocFromPoolAsync", 11020, "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"},
    {"cuMemFreeAsync", 11020, "cuMemFreeAsync", "cuMemFreeAsync_ptsz"},
    {"cuMemPrefetchAsync", 8000, "cuMemPrefetchAsync", "cuMemPrefetchAsync_ptsz"},
    {"cuMemPrefetchAsync", 13000, "cuMemPrefetchAsync_v2", "cuMemPrefetchAsync_v2_ptsz"},
    {"cuMemcpy", 4000, "cuMemcpy", "cuMemcpy_ptds"},
    {"cuMemcpyAsync", 4000, "cuMemcpyAsync", "cuMemcpyAsync_ptsz"},
    {"cuMemcpyHtoD", 3020, "cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds"},
    {"cuMemcpyDtoH", 3020, "cuMemcpyDtoH_v2", "cuMemcpyDtoH_v2_ptds"},
    {"cuMemcpyDtoD", 3020, "cuMemcpyDtoD_v2", "cuMemcpyDtoD_v2_ptds"},
    {"cuMemcpyHtoDAsync", 3020, "cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync_v2_ptsz"},
    {"cuMemcpyDtoHAsync", 3020, "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync_v2_ptsz"},
    {"cuMemcpyDtoDAsync", 3020, "cuMemcpyDtoDAsync_v2", "cuMemcpyDtoDAsync_v2_ptsz"},
    {"cuMemsetD8", 3020, "cuMemsetD8_v2", "cuMemsetD8_v2_ptds"},
    {"cuMemsetD32", 3020, "cuMemsetD32_v2", "cuMemsetD32_v2_ptds"},
    {"cuMemsetD8Async", 3020, "cuMemsetD8Async", "cuMemsetD8Async_ptsz"},
    {"cuMemsetD32Async", 3020, "cuMemsetD32Async", "cuMemsetD32Async_ptsz"},
    {"cuLaunchKernel", 4000, "cuLaunchKernel", "cuLaunchKernel_ptsz"},
    {"cuLaunchKernelEx", 11060, "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"},
    {"cuLaunchCooperativeKernel", 9000, "cuLaunchCooperativeKernel",
     "cuLaunchCooperativeKernel_ptsz"},
    {"cuGraphLaunch", 10000, "cuGraphLaunch", "cuGraphLaunch_ptsz"},
    {"cuIpcOpenMemHandle", 4010, "cuIpcOpenMemHandle_v2", NULL},
    {"cuArrayCreate", 3020, "cuArrayCreate_v2", NULL},
    {"cuArray3DCreate", 3020, "cuArray3DCreate_v2", NULL},
};

static void *exported_address(const char *name)
{
    for (size_t i = 0; i < sizeof exported / sizeof exported[0]; i++)
        if (strcmp(exported[i].name, name) == 0)
            return exported[i].address;
    return NULL;
}

static CUresult resolve(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags,
                        CUdriverProcAddressQueryResult *status)
{
    if (pfn != NULL)
        *pfn = NULL;
    if (symbol == NULL || pfn == NULL || flags > CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
        return CUDA_ERROR_INVALID_VALUE;
    int per_thread = flags == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM && cuda_version >= 7000;
    const struct variant *best = NULL;
    int versioned = 0;
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        if (strcmp(variants[i].name, symbol) != 0)
            continue;
        versioned = 1;
        if (variants[i].since <= cuda_version && (best == NULL || variants[i].since > best->since))
            best = &variants[i];
    }
    if (versioned && best == NULL) {
        *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        return CUDA_SUCCESS; /* as measured: success, NULL, status 2 */
    }
    if (best != NULL)
        *pfn = exported_address(per_thread && best->per_thread ? best->per_thread : best->symbol);
    else
        *pfn = exported_address(symbol);
    *status = *pfn != NULL ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return *pfn != NULL ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

static const char *name_of(void *address)
{
    for (size_t i = 0; i < sizeof exported / sizeof exported[0]; i++)
        if (exported[i].address == address)
            return exported[i].name;
    return "NULL";
}

STANDIN_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version,
                                         cuuint64_t flags)
{
    CUdriverProcAddressQueryResult status;
    CUresult result = resolve(symbol, pfn, cuda_version, flags, &status);
    standin_log("cuGetProcAddress", "symbol=%s version=%d flags=%llu resolved=%s result=%d",
                symbol ? symbol : "(null)", cuda_version, flags, pfn ? name_of(*pfn) : "NULL",
                result);
    return result;
}

STANDIN_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version,
                                            cuuint64_t flags,
                                            CUdriverProcAddressQueryResult *symbol_status)
{
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult result = resolve(symbol, pfn, cuda_version, flags, &status);
    if (symbol_status != NULL)
        *symbol_status = status;
    standin_log("cuGetProcAddress_v2",
                "symbol=%s version=%d flags=%llu resolved=%s status=%d result=%d",
                symbol ? symbol : "(null)", cuda_version, flags, pfn ? name_of(*pfn) : "NULL",
                status, result);
    return result;
}
