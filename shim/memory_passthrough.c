/*
 * Allocations the shim cannot make managed, passed through and counted as
 * unmanaged (they stay on the GPU while other processes run), each warned
 * about once; those the process makes itself (VMM, arrays) are refused past its
 * group's memory cap:
 *  - VMM: cuMemCreate, counted until the driver frees it: once its handle's
 *    references are released (cuMemRelease; cuMemRetainAllocationHandle adds
 *    one) and its mappings unmapped (cuMemMap/cuMemUnmap), in any order.  PyTorch uses it for
 *    expandable_segments, XLA (JAX 0.11) for its default allocator; mapping
 *    it at an address of the shim's choosing would break the handles an
 *    application may export to other processes (NCCL does).
 *  - IPC: cuIpcOpenMemHandle(_v2) / cuIpcCloseMemHandle; the size comes from
 *    cuMemGetAddressRange.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>

#include "allocation_map.h"
#include "contexts.h"
#include "devices.h"
#include "hooks.h"
#include "driver.h"
#include "log.h"
#include "memory_accounting.h"
#include "nvshare_protocol.h"

NVSHARE_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                    const CUmemAllocationProp *prop, unsigned long long flags)
{
    NVSHARE_REAL_OR_RETURN(cuMemCreate, real);
    int saved_errno = errno;
    nvshare_devices_discover();
    CUcontext context;
    int gpu = prop != NULL && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE
                  ? prop->location.id
                  : nvshare_current_gpu(&context);
    int counted = gpu >= 0 && gpu < NVSHARE_MAX_GPUS;
    if (counted && !nvshare_memory_reserve_under_cap(gpu, size, "cuMemCreate")) {
        errno = saved_errno;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult result = real(handle, size, prop, flags);
    if (result == CUDA_SUCCESS && handle != NULL) {
        NVSHARE_WARN_ONCE(
            "cuMemCreate (CUDA virtual memory: JAX's default allocator, PyTorch's "
            "expandable_segments) cannot be made managed: that memory stays on the "
            "GPU while others run (for JAX set XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async)");
        if (counted && *handle != 0)
            /* A physical handle outlives contexts: it is released, not destroyed with one. */
            nvshare_memory_remember(&nvshare_handle_map, *handle, size, gpu, -1, ALLOCATION_VMM);
    }
    if (counted)
        nvshare_memory_unreserve(gpu, size);
    errno = saved_errno;
    return result;
}

NVSHARE_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    NVSHARE_REAL_OR_RETURN(cuMemRelease, real);
    CUresult result = real(handle);
    if (result != CUDA_SUCCESS)
        return result;
    nvshare_memory_forget(&nvshare_handle_map, handle, ALLOCATION_VMM);
    return result;
}

/* Called with the memory mutex held. */
static void reference_handle(CUmemGenericAllocationHandle handle)
{
    struct allocation *physical = allocation_map_find(&nvshare_handle_map, handle);
    if (physical != NULL && physical->kind == ALLOCATION_VMM)
        physical->opens++;
}

/* The handle's entry counts its references and mappings (opens). */
NVSHARE_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                 CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    NVSHARE_REAL_OR_RETURN(cuMemMap, real);
    CUresult result = real(ptr, size, offset, handle, flags);
    if (result != CUDA_SUCCESS)
        return result;
    int saved_errno = errno;
    pthread_mutex_lock(&nvshare_memory_mutex);
    struct allocation *physical = allocation_map_find(&nvshare_handle_map, handle);
    if (physical != NULL && physical->kind == ALLOCATION_VMM) {
        struct allocation mapping = {.key = ptr,
                                     .bytes = size,
                                     .gpu = physical->gpu,
                                     .context_slot = -1,
                                     .kind = ALLOCATION_VMM,
                                     .opens = 1,
                                     .vmm_handle = handle};
        if (allocation_map_put(&nvshare_vmm_mapping_map, &mapping) == 0)
            reference_handle(handle);
    }
    pthread_mutex_unlock(&nvshare_memory_mutex);
    errno = saved_errno;
    return result;
}

/* Another reference to the handle of a mapped address (NCCL takes one to
 * register a buffer), given back by a cuMemRelease. */
NVSHARE_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle,
                                                    void *addr)
{
    NVSHARE_REAL_OR_RETURN(cuMemRetainAllocationHandle, real);
    CUresult result = real(handle, addr);
    if (result != CUDA_SUCCESS || handle == NULL)
        return result;
    pthread_mutex_lock(&nvshare_memory_mutex);
    reference_handle(*handle);
    pthread_mutex_unlock(&nvshare_memory_mutex);
    return result;
}

/* VMM mappings start and end on the allocation granularity, 2 MiB at the
 * least on NVIDIA GPUs: where an unmapped range holds a mapping the shim does
 * not know (an imported handle's), the walk goes on from the next granule. */
#define VMM_MIN_GRANULARITY ((CUdeviceptr)2 << 20)

/* One call may unmap several neighbouring mappings. */
NVSHARE_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    NVSHARE_REAL_OR_RETURN(cuMemUnmap, real);
    CUresult result = real(ptr, size);
    if (result != CUDA_SUCCESS)
        return result;
    int saved_errno = errno;
    for (CUdeviceptr at = ptr; at < ptr + size;) {
        struct allocation mapping;
        pthread_mutex_lock(&nvshare_memory_mutex);
        int none_left = nvshare_vmm_mapping_map.used == 0;
        int mapped = !none_left && allocation_map_take(&nvshare_vmm_mapping_map, at, &mapping);
        pthread_mutex_unlock(&nvshare_memory_mutex);
        if (none_left)
            break;
        if (!mapped || mapping.bytes == 0) {
            at += VMM_MIN_GRANULARITY;
            continue;
        }
        nvshare_memory_forget(&nvshare_handle_map, mapping.vmm_handle, ALLOCATION_VMM);
        at += mapping.bytes;
    }
    errno = saved_errno;
    return result;
}

static CUresult open_ipc(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags,
                         cuIpcOpenMemHandle_fn real)
{
    CUresult result = real(pdptr, handle, flags);
    if (result != CUDA_SUCCESS || pdptr == NULL)
        return result;
    int saved_errno = errno;
    NVSHARE_WARN_ONCE("cuIpcOpenMemHandle: memory shared by another process cannot be made "
                      "managed; it is counted but stays on the GPU");
    nvshare_devices_discover();
    CUcontext context;
    int gpu = nvshare_current_gpu(&context);
    CUdeviceptr base = 0;
    size_t bytes = 0;
    if (nvshare_driver.mem_get_address_range != NULL)
        nvshare_driver.mem_get_address_range(&base, &bytes, *pdptr);
    if (gpu >= 0)
        nvshare_memory_remember(&nvshare_pointer_map, *pdptr, bytes, gpu,
                                nvshare_current_context_slot(), ALLOCATION_IPC);
    errno = saved_errno;
    return result;
}

NVSHARE_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                           unsigned int Flags)
{
    NVSHARE_REAL_OR_RETURN(cuIpcOpenMemHandle, real);
    return open_ipc(pdptr, handle, Flags, real);
}

NVSHARE_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                              unsigned int Flags)
{
    NVSHARE_REAL_OR_RETURN(cuIpcOpenMemHandle_v2, real);
    return open_ipc(pdptr, handle, Flags, real);
}

NVSHARE_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    NVSHARE_REAL_OR_RETURN(cuIpcCloseMemHandle, real);
    CUresult result = real(dptr);
    if (result != CUDA_SUCCESS)
        return result;
    nvshare_memory_forget(&nvshare_pointer_map, dptr, ALLOCATION_IPC);
    return result;
}
