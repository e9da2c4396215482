/*
 * Device memory becomes managed memory, so that processes sharing a GPU can
 * together use more than it has: the driver pages a waiting process's memory
 * out while another one holds the GPU.
 *
 *  - cuMemAlloc_v2, cuMemAllocPitch_v2: cuMemAllocManaged(CU_MEM_ATTACH_GLOBAL).
 *    The pitch is the width rounded up to 512 bytes, the alignment the driver
 *    uses for pitched allocations.
 *  - cuMemAllocAsync, cuMemAllocFromPoolAsync (+_ptsz): also managed, and
 *    usable at once, which satisfies stream order trivially; pool attributes
 *    (e.g. IPC export of the pool) do not apply to such memory.  Inside a
 *    stream capture they stay the driver's (they become graph memory nodes).
 *  - cuMemFree_v2 frees ours.  cuMemFreeAsync of ours parks the block for
 *    the next stream-ordered allocation that fits (parking.c); where it
 *    cannot, it synchronises the stream (work queued on it may still use the
 *    memory), then frees.
 *  - What cannot be managed is passed through and counted as unmanaged
 *    (memory_passthrough.c): VMM (cuMemCreate, e.g. PyTorch's expandable_segments)
 *    and IPC imports (cuIpcOpenMemHandle), each warned about once, and CUDA arrays.
 *  - One process may hold at most the GPU's total memory (managed +
 *    unmanaged); beyond, CUDA_ERROR_OUT_OF_MEMORY, unless
 *    NVSHARE_ENABLE_SINGLE_OVERSUB=1.
 *  - cuMemGetInfo_v2 reports the whole GPU minus this process's allocations,
 *    so frameworks size their caches for the GPU, not for what others hold.
 *  - Under its share group's memory cap (the agent's MEMORY_CAP,
 *    docs/scheduling.md "Shares"), an allocation that would take the group past
 *    the cap fails with CUDA_ERROR_OUT_OF_MEMORY and one warning, and
 *    cuMemGetInfo_v2 reports the cap as the total and the room left under it as
 *    free, so that frameworks size their caches to it.  The application's own
 *    managed memory, VMM and arrays are refused past the cap too (IPC imports are
 *    counted only: their exporter holds them).  The agent says the cap before its
 *    WELCOME, and allocations wait for it (memory_accounting.c), so even the first
 *    allocation after cuInit is capped.
 *
 * What the shim knows of each allocation and the totals per GPU are kept in
 * memory_accounting.c, below these hooks.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>

#include "allocation_map.h"
#include "capture.h"
#include "config.h"
#include "contexts.h"
#include "devices.h"
#include "driver.h"
#include "hooks.h"
#include "log.h"
#include "memory_accounting.h"
#include "parking.h"

#define PITCH_ALIGNMENT 512
#define NOT_CONVERTED   (-1)

/* The conversion itself.  NOT_CONVERTED: no context or driver support, so
 * the caller passes the call through and the driver answers as it would. */
static CUresult allocate_managed(CUdeviceptr *dptr, size_t bytes, const char *what)
{
    nvshare_devices_discover();
    cuMemAllocManaged_fn managed = NVSHARE_REAL(cuMemAllocManaged);
    CUcontext context;
    int gpu = nvshare_current_gpu(&context);
    if (managed == NULL || gpu < 0 || dptr == NULL)
        return NOT_CONVERTED;
    uint64_t total = nvshare_gpu_total_bytes(gpu);
    uint64_t limit = nvshare_config()->single_oversub || total == 0 ? NVSHARE_NO_LIMIT : total;
    uint64_t cap, room;
    /* The cap binds even with NVSHARE_ENABLE_SINGLE_OVERSUB=1. */
    int capped = nvshare_memory_capped(gpu, &cap, &room) && room < limit;
    if (capped)
        limit = room;

    uint64_t in_use;
    if (!nvshare_memory_reserve(gpu, bytes, limit, &in_use)) {
        /* Parked blocks are held only for reuse: they give way first. */
        if (limit >= bytes && in_use > limit - bytes &&
            nvshare_parking_free(gpu, in_use - (limit - bytes)) > 0)
            return allocate_managed(dptr, bytes, what);
        if (capped) {
            nvshare_memory_warn_over_cap(what, bytes, gpu, cap, cap - room + in_use + bytes);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        nvshare_debug("refused %s of %zu bytes on GPU %d: this process would hold %llu of "
                      "%llu bytes (NVSHARE_ENABLE_SINGLE_OVERSUB=1 allows it)",
                      what, bytes, gpu, (unsigned long long)in_use + bytes,
                      (unsigned long long)total);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }

    CUresult result = managed(dptr, bytes, CU_MEM_ATTACH_GLOBAL);
    /* Remembered before the reservation goes: in between, another thread's could pass. */
    if (result == CUDA_SUCCESS)
        nvshare_memory_remember(&nvshare_pointer_map, *dptr, bytes, gpu,
                                nvshare_current_context_slot(), ALLOCATION_CONVERTED);
    nvshare_memory_unreserve(gpu, bytes);
    if (result != CUDA_SUCCESS)
        return result;
    nvshare_debug("converted %s of %zu bytes on GPU %d to managed memory at 0x%llx", what, bytes,
                  gpu, (unsigned long long)*dptr);
    return CUDA_SUCCESS;
}

NVSHARE_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    NVSHARE_REAL_OR_RETURN(cuMemAlloc_v2, real);
    int saved_errno = errno;
    CUresult result = allocate_managed(dptr, bytesize, "cuMemAlloc");
    if (result == NOT_CONVERTED)
        result = real(dptr, bytesize);
    errno = saved_errno;
    return result;
}

NVSHARE_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                           size_t Height, unsigned int ElementSizeBytes)
{
    NVSHARE_REAL_OR_RETURN(cuMemAllocPitch_v2, real);
    int saved_errno = errno;
    CUresult result = NOT_CONVERTED;
    int valid = dptr != NULL && pPitch != NULL && WidthInBytes > 0 && Height > 0 &&
                (ElementSizeBytes == 4 || ElementSizeBytes == 8 || ElementSizeBytes == 16);
    size_t pitch = (WidthInBytes + PITCH_ALIGNMENT - 1) / PITCH_ALIGNMENT * PITCH_ALIGNMENT;
    if (valid && pitch >= WidthInBytes && Height <= SIZE_MAX / pitch) {
        result = allocate_managed(dptr, pitch * Height, "cuMemAllocPitch");
        if (result == CUDA_SUCCESS)
            *pPitch = pitch;
    }
    if (result == NOT_CONVERTED) /* invalid arguments included: the driver names the error */
        result = real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    errno = saved_errno;
    return result;
}

static CUresult allocate_stream_ordered(CUdeviceptr *dptr, size_t bytes, CUstream stream,
                                        int per_thread, const char *what)
{
    /* Inside a capture: a graph memory node, the graph owns it.  The thread's
     * own capture (even on another stream: no cuMemAllocManaged while it may
     * be global), or another thread's capture of this stream. */
    stream = nvshare_actual_stream(stream, per_thread);
    if (nvshare_thread_capture_open() || !nvshare_stream_may_record(stream))
        return NOT_CONVERTED;
    nvshare_devices_discover();
    if (nvshare_unpark(bytes, stream, dptr))
        return CUDA_SUCCESS;
    return allocate_managed(dptr, bytes, what);
}

/* The stream-ordered allocations' signatures, (parameters), (arguments), as
 * the table's (hooks.h): with a pool or without, they are converted alike. */
#define SIG_ALLOC_ASYNC \
    (CUdeviceptr * dptr, size_t bytesize, CUstream hStream), (dptr, bytesize, hStream)
#define SIG_ALLOC_FROM_POOL_ASYNC                                               \
    (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream), \
        (dptr, bytesize, pool, hStream)

#define DEFINE_STREAM_ORDERED_ALLOC_(name, params, args)                                 \
    NVSHARE_EXPORT CUresult name params                                                  \
    {                                                                                    \
        NVSHARE_REAL_OR_RETURN(name, real);                                              \
        int saved_errno = errno;                                                         \
        CUresult result = allocate_stream_ordered(dptr, bytesize, hStream,               \
                                                  NVSHARE_HOOK_PER_THREAD(name), #name); \
        if (result == NOT_CONVERTED)                                                     \
            result = real args;                                                          \
        errno = saved_errno;                                                             \
        return result;                                                                   \
    }
#define DEFINE_STREAM_ORDERED_ALLOC(name, signature) DEFINE_STREAM_ORDERED_ALLOC_(name, signature)
DEFINE_STREAM_ORDERED_ALLOC(cuMemAllocAsync, SIG_ALLOC_ASYNC)
DEFINE_STREAM_ORDERED_ALLOC(cuMemAllocAsync_ptsz, SIG_ALLOC_ASYNC)
DEFINE_STREAM_ORDERED_ALLOC(cuMemAllocFromPoolAsync, SIG_ALLOC_FROM_POOL_ASYNC)
DEFINE_STREAM_ORDERED_ALLOC(cuMemAllocFromPoolAsync_ptsz, SIG_ALLOC_FROM_POOL_ASYNC)

/* The application's own managed memory: not converted, but counted and
 * prefetched like ours, and refused past its group's cap. */
NVSHARE_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    NVSHARE_REAL_OR_RETURN(cuMemAllocManaged, real);
    int saved_errno = errno;
    CUcontext context;
    nvshare_devices_discover();
    int gpu = nvshare_current_gpu(&context);
    if (gpu >= 0 && !nvshare_memory_reserve_under_cap(gpu, bytesize, "cuMemAllocManaged")) {
        errno = saved_errno;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult result = real(dptr, bytesize, flags);
    if (gpu >= 0) {
        if (result == CUDA_SUCCESS)
            nvshare_memory_remember(&nvshare_pointer_map, *dptr, bytesize, gpu,
                                    nvshare_current_context_slot(), ALLOCATION_APP_MANAGED);
        nvshare_memory_unreserve(gpu, bytesize);
    }
    errno = saved_errno;
    return result;
}

NVSHARE_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    NVSHARE_REAL_OR_RETURN(cuMemFree_v2, real);
    int saved_errno = errno, ours;
    CUresult result = nvshare_memory_free(dptr, &ours);
    if (!ours)
        result = real(dptr);
    errno = saved_errno;
    return result;
}

static CUresult free_async(CUdeviceptr dptr, CUstream stream, int per_thread,
                           cuMemFreeAsync_fn real)
{
    int saved_errno = errno;
    enum allocation_kind kind = nvshare_memory_kind_of(dptr);
    int ours = nvshare_memory_kind_is_managed(kind);
    int converted = kind == ALLOCATION_CONVERTED;
    int parked = kind == ALLOCATION_PARKED;
    CUresult result;
    stream = nvshare_actual_stream(stream, per_thread);
    if (parked) {
        result = CUDA_ERROR_INVALID_VALUE; /* freed twice */
    } else if (!ours) {
        result = real(dptr, stream);
    } else if (converted && nvshare_park(dptr, stream)) {
        result = CUDA_SUCCESS;
    } else {
        /* Stream order: work already queued on the stream may use the memory. */
        result = nvshare_driver.stream_synchronize(stream);
        if (result == CUDA_SUCCESS)
            result = nvshare_memory_free(dptr, &ours);
    }
    errno = saved_errno;
    return result;
}

NVSHARE_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    NVSHARE_REAL_OR_RETURN(cuMemFreeAsync, real);
    return free_async(dptr, hStream, NVSHARE_HOOK_PER_THREAD(cuMemFreeAsync), real);
}

NVSHARE_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    NVSHARE_REAL_OR_RETURN(cuMemFreeAsync_ptsz, real);
    return free_async(dptr, hStream, NVSHARE_HOOK_PER_THREAD(cuMemFreeAsync_ptsz), real);
}

NVSHARE_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    NVSHARE_REAL_OR_RETURN(cuMemGetInfo_v2, real);
    CUresult result = real(free_bytes, total_bytes);
    if (result != CUDA_SUCCESS || free_bytes == NULL || total_bytes == NULL)
        return result;
    int saved_errno = errno;
    CUcontext context;
    nvshare_devices_discover();
    int gpu = nvshare_current_gpu(&context);
    if (gpu >= 0) {
        uint64_t used = nvshare_memory_used(gpu);
        uint64_t cap, room;
        /* As allocate_managed caps: by the room the group's others leave, also when the
         * cap itself is above the GPU's size. */
        if (nvshare_memory_capped(gpu, &cap, &room) && room < *total_bytes) {
            if (cap < *total_bytes)
                *total_bytes = cap;
            *free_bytes = room > used ? room - used : 0;
        } else {
            *free_bytes = *total_bytes > used ? *total_bytes - used : 0;
        }
    }
    errno = saved_errno;
    return result;
}
