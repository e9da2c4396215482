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
 *  - What cannot be managed is passed through, counted as unmanaged and
 *    warned about once (memory_passthrough.c): VMM (cuMemCreate, e.g. PyTorch's expandable_segments)
 *    and IPC imports (cuIpcOpenMemHandle).
 *  - One process may hold at most the GPU's total memory (managed +
 *    unmanaged); beyond, CUDA_ERROR_OUT_OF_MEMORY, unless
 *    NVSHARE_ENABLE_SINGLE_OVERSUB=1.
 *  - cuMemGetInfo_v2 reports the whole GPU minus this process's allocations,
 *    so frameworks size their caches for the GPU, not for what others hold.
 *
 * The mutex guards the maps and totals only; no driver call runs under it.
 */
#define _GNU_SOURCE
#include "memory.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "allocation_map.h"
#include "memory_internal.h"
#include "config.h"
#include "contexts.h"
#include "devices.h"
#include "gate.h"
#include "hooks.h"
#include "driver.h"
#include "shim_threads.h"
#include "log.h"
#include "nvshare_protocol.h"
#include "parking.h"

#define PITCH_ALIGNMENT 512
#define NOT_CONVERTED   (-1)

struct gpu_memory {
    uint64_t managed_bytes;
    uint64_t unmanaged_bytes;
    uint64_t reserved_bytes; /* allocations under way, counted against the limit */
    int changed;             /* totals not yet reported */
};

pthread_mutex_t nvshare_memory_mutex = PTHREAD_MUTEX_INITIALIZER;
struct allocation_map nvshare_pointer_map;
struct allocation_map nvshare_handle_map;
struct allocation_map nvshare_vmm_mapping_map;
static struct gpu_memory gpus[NVSHARE_MAX_GPUS];

/* A grant's prefetch may be split into chunks spread over several streams
 * (an experiment: bench/gpu/prefetch_split.py builds the shim with other values). */
#ifndef NVSHARE_PREFETCH_STREAMS
#define NVSHARE_PREFETCH_STREAMS 1
#elif NVSHARE_PREFETCH_STREAMS < 1
#error "NVSHARE_PREFETCH_STREAMS must be at least 1"
#endif
#ifndef NVSHARE_PREFETCH_CHUNK_BYTES
#define NVSHARE_PREFETCH_CHUNK_BYTES (256ULL << 20)
#endif

/* The prefetch streams of each GPU and context, created on the client thread. */
static CUstream prefetch_streams[NVSHARE_MAX_GPUS][NVSHARE_CONTEXT_SLOTS][NVSHARE_PREFETCH_STREAMS];

static void count(int gpu, enum allocation_kind kind, uint64_t bytes, int adding)
{
    uint64_t *total = kind == ALLOCATION_VMM || kind == ALLOCATION_IPC ? &gpus[gpu].unmanaged_bytes
                                                                       : &gpus[gpu].managed_bytes;
    *total = adding ? *total + bytes : (*total >= bytes ? *total - bytes : 0);
    gpus[gpu].changed = 1;
}

void nvshare_memory_remember(struct allocation_map *map, uint64_t key, uint64_t bytes, int gpu,
                             int context_slot, enum allocation_kind kind)
{
    struct allocation entry = {.key = key,
                               .bytes = bytes,
                               .gpu = gpu,
                               .context_slot = context_slot,
                               .kind = kind,
                               .opens = 1};
    pthread_mutex_lock(&nvshare_memory_mutex);
    struct allocation *known = allocation_map_find(map, key);
    if (known != NULL && kind == ALLOCATION_IPC && known->kind == ALLOCATION_IPC) {
        known->opens++; /* a handle opened again: the same mapping, its reference counted */
    } else {
        /* An address handed out again while still known: its free went unseen (a
         * context past the slots), so the old entry's bytes are gone. */
        if (known != NULL)
            count(known->gpu, known->kind, known->bytes, 0);
        if (allocation_map_put(map, &entry) == 0)
            count(gpu, kind, bytes, 1);
    }
    pthread_mutex_unlock(&nvshare_memory_mutex);
    nvshare_client_wake();
}

int nvshare_memory_forget(struct allocation_map *map, uint64_t key, enum allocation_kind kind)
{
    struct allocation entry;
    pthread_mutex_lock(&nvshare_memory_mutex);
    struct allocation *found = allocation_map_find(map, key);
    if (found != NULL && found->kind == kind && found->opens > 1) {
        found->opens--; /* an IPC mapping still open, a VMM handle still mapped or unreleased */
        pthread_mutex_unlock(&nvshare_memory_mutex);
        return 1;
    }
    int known = found != NULL && found->kind == kind && allocation_map_take(map, key, &entry);
    if (known)
        count(entry.gpu, entry.kind, entry.bytes, 0);
    pthread_mutex_unlock(&nvshare_memory_mutex);
    if (known)
        nvshare_client_wake();
    return known;
}

static int is_managed(const struct allocation *entry)
{
    return entry->kind == ALLOCATION_CONVERTED || entry->kind == ALLOCATION_APP_MANAGED;
}

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

    pthread_mutex_lock(&nvshare_memory_mutex);
    struct gpu_memory *memory = &gpus[gpu];
    uint64_t in_use = memory->managed_bytes + memory->unmanaged_bytes + memory->reserved_bytes;
    if (!nvshare_config()->single_oversub && total != 0 &&
        (in_use > total || bytes > total - in_use)) {
        pthread_mutex_unlock(&nvshare_memory_mutex);
        /* Parked blocks are held only for reuse: they give way first. */
        if (nvshare_parking_free(gpu, in_use + bytes - total) > 0)
            return allocate_managed(dptr, bytes, what);
        nvshare_debug("refused %s of %zu bytes on GPU %d: this process would hold %llu of "
                      "%llu bytes (NVSHARE_ENABLE_SINGLE_OVERSUB=1 allows it)",
                      what, bytes, gpu, (unsigned long long)in_use + bytes,
                      (unsigned long long)total);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memory->reserved_bytes += bytes;
    pthread_mutex_unlock(&nvshare_memory_mutex);

    CUresult result = managed(dptr, bytes, CU_MEM_ATTACH_GLOBAL);

    pthread_mutex_lock(&nvshare_memory_mutex);
    memory->reserved_bytes -= bytes;
    pthread_mutex_unlock(&nvshare_memory_mutex);
    if (result != CUDA_SUCCESS)
        return result;
    nvshare_memory_remember(&nvshare_pointer_map, *dptr, bytes, gpu, nvshare_current_context_slot(),
                            ALLOCATION_CONVERTED);
    nvshare_debug("converted %s of %zu bytes on GPU %d to managed memory at 0x%llx", what, bytes,
                  gpu, (unsigned long long)*dptr);
    return CUDA_SUCCESS;
}

NVSHARE_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    CUresult error;
    cuMemAlloc_v2_fn real = NVSHARE_REAL_OR_ERROR(cuMemAlloc_v2, &error);
    if (real == NULL)
        return error;
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
    CUresult error;
    cuMemAllocPitch_v2_fn real = NVSHARE_REAL_OR_ERROR(cuMemAllocPitch_v2, &error);
    if (real == NULL)
        return error;
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

#define DEFINE_ASYNC_ALLOC(name)                                                         \
    NVSHARE_EXPORT CUresult name(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)   \
    {                                                                                    \
        CUresult error;                                                                  \
        __typeof__(&name) real = NVSHARE_REAL_OR_ERROR(name, &error);                    \
        if (real == NULL)                                                                \
            return error;                                                                \
        int saved_errno = errno;                                                         \
        CUresult result = allocate_stream_ordered(dptr, bytesize, hStream,               \
                                                  NVSHARE_HOOK_PER_THREAD(name), #name); \
        if (result == NOT_CONVERTED)                                                     \
            result = real(dptr, bytesize, hStream);                                      \
        errno = saved_errno;                                                             \
        return result;                                                                   \
    }
DEFINE_ASYNC_ALLOC(cuMemAllocAsync)
DEFINE_ASYNC_ALLOC(cuMemAllocAsync_ptsz)

#define DEFINE_POOL_ALLOC(name)                                                          \
    NVSHARE_EXPORT CUresult name(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,  \
                                 CUstream hStream)                                       \
    {                                                                                    \
        CUresult error;                                                                  \
        __typeof__(&name) real = NVSHARE_REAL_OR_ERROR(name, &error);                    \
        if (real == NULL)                                                                \
            return error;                                                                \
        int saved_errno = errno;                                                         \
        CUresult result = allocate_stream_ordered(dptr, bytesize, hStream,               \
                                                  NVSHARE_HOOK_PER_THREAD(name), #name); \
        if (result == NOT_CONVERTED)                                                     \
            result = real(dptr, bytesize, pool, hStream);                                \
        errno = saved_errno;                                                             \
        return result;                                                                   \
    }
DEFINE_POOL_ALLOC(cuMemAllocFromPoolAsync)
DEFINE_POOL_ALLOC(cuMemAllocFromPoolAsync_ptsz)

/* The application's own managed memory: not converted, but counted and
 * prefetched like ours. */
NVSHARE_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    CUresult error;
    cuMemAllocManaged_fn real = NVSHARE_REAL_OR_ERROR(cuMemAllocManaged, &error);
    if (real == NULL)
        return error;
    CUresult result = real(dptr, bytesize, flags);
    int saved_errno = errno;
    CUcontext context;
    nvshare_devices_discover();
    int gpu = result == CUDA_SUCCESS ? nvshare_current_gpu(&context) : -1;
    if (gpu >= 0)
        nvshare_memory_remember(&nvshare_pointer_map, *dptr, bytesize, gpu,
                                nvshare_current_context_slot(), ALLOCATION_APP_MANAGED);
    errno = saved_errno;
    return result;
}

/* Forget a managed allocation, free it, and remember it again if the driver
 * refused (taking it out first keeps a racing allocation that reuses the
 * address from being forgotten instead).  A parked one is freed only when
 * parking asks: to the application it is freed already. */
static CUresult free_managed(CUdeviceptr dptr, int *was_ours, int parked_too)
{
    struct allocation entry;
    pthread_mutex_lock(&nvshare_memory_mutex);
    struct allocation *found = allocation_map_find(&nvshare_pointer_map, dptr);
    int parked = found != NULL && found->kind == ALLOCATION_PARKED;
    *was_ours = found != NULL && (parked_too ? parked : is_managed(found) || parked);
    if (*was_ours && (!parked || parked_too)) {
        allocation_map_take(&nvshare_pointer_map, dptr, &entry);
        count(entry.gpu, entry.kind, entry.bytes, 0);
    }
    pthread_mutex_unlock(&nvshare_memory_mutex);
    if (!*was_ours)
        return CUDA_SUCCESS;
    if (parked && !parked_too)
        return CUDA_ERROR_INVALID_VALUE; /* freed twice */
    CUresult result = NVSHARE_REAL(cuMemFree_v2)(dptr);
    /* A parked block the driver would not free is gone for the application
     * already: nothing could free it later. */
    if (result != CUDA_SUCCESS && !parked)
        nvshare_memory_remember(&nvshare_pointer_map, entry.key, entry.bytes, entry.gpu,
                                entry.context_slot, entry.kind);
    else
        nvshare_client_wake();
    return result;
}

NVSHARE_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    CUresult error;
    cuMemFree_v2_fn real = NVSHARE_REAL_OR_ERROR(cuMemFree_v2, &error);
    if (real == NULL)
        return error;
    int saved_errno = errno, ours;
    CUresult result = free_managed(dptr, &ours, 0);
    if (!ours)
        result = real(dptr);
    errno = saved_errno;
    return result;
}

void nvshare_memory_free_parked(uint64_t pointer)
{
    int ours;
    free_managed(pointer, &ours, 1);
}

int nvshare_memory_set_kind(uint64_t pointer, int gpu, int slot, enum allocation_kind from,
                            enum allocation_kind to, uint64_t *bytes)
{
    pthread_mutex_lock(&nvshare_memory_mutex);
    struct allocation *found = allocation_map_find(&nvshare_pointer_map, pointer);
    int changed =
        found != NULL && found->kind == from && found->gpu == gpu && found->context_slot == slot;
    if (changed) {
        found->kind = to;
        *bytes = found->bytes;
    }
    pthread_mutex_unlock(&nvshare_memory_mutex);
    return changed;
}

static CUresult free_async(CUdeviceptr dptr, CUstream stream, int per_thread,
                           cuMemFreeAsync_fn real)
{
    int saved_errno = errno;
    pthread_mutex_lock(&nvshare_memory_mutex);
    struct allocation *found = allocation_map_find(&nvshare_pointer_map, dptr);
    int ours = found != NULL && is_managed(found);
    int converted = ours && found->kind == ALLOCATION_CONVERTED;
    int parked = found != NULL && found->kind == ALLOCATION_PARKED;
    pthread_mutex_unlock(&nvshare_memory_mutex);
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
            result = free_managed(dptr, &ours, 0);
    }
    errno = saved_errno;
    return result;
}

NVSHARE_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    CUresult error;
    cuMemFreeAsync_fn real = NVSHARE_REAL_OR_ERROR(cuMemFreeAsync, &error);
    return real == NULL ? error
                        : free_async(dptr, hStream, NVSHARE_HOOK_PER_THREAD(cuMemFreeAsync), real);
}

NVSHARE_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    CUresult error;
    cuMemFreeAsync_fn real = NVSHARE_REAL_OR_ERROR(cuMemFreeAsync_ptsz, &error);
    return real == NULL
               ? error
               : free_async(dptr, hStream, NVSHARE_HOOK_PER_THREAD(cuMemFreeAsync_ptsz), real);
}

NVSHARE_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    CUresult error;
    cuMemGetInfo_v2_fn real = NVSHARE_REAL_OR_ERROR(cuMemGetInfo_v2, &error);
    if (real == NULL)
        return error;
    CUresult result = real(free_bytes, total_bytes);
    if (result != CUDA_SUCCESS || free_bytes == NULL || total_bytes == NULL)
        return result;
    int saved_errno = errno;
    CUcontext context;
    nvshare_devices_discover();
    int gpu = nvshare_current_gpu(&context);
    if (gpu >= 0) {
        pthread_mutex_lock(&nvshare_memory_mutex);
        uint64_t used = gpus[gpu].managed_bytes + gpus[gpu].unmanaged_bytes;
        pthread_mutex_unlock(&nvshare_memory_mutex);
        *free_bytes = *total_bytes > used ? *total_bytes - used : 0;
    }
    errno = saved_errno;
    return result;
}

/* ---- for the client thread --------------------------------------------------------------- */

int nvshare_memory_take_report(int gpu, uint64_t *managed_bytes, uint64_t *unmanaged_bytes)
{
    pthread_mutex_lock(&nvshare_memory_mutex);
    int changed = gpus[gpu].changed;
    gpus[gpu].changed = 0;
    *managed_bytes = gpus[gpu].managed_bytes;
    *unmanaged_bytes = gpus[gpu].unmanaged_bytes;
    pthread_mutex_unlock(&nvshare_memory_mutex);
    return changed;
}

void nvshare_memory_mark_all_changed(void)
{
    pthread_mutex_lock(&nvshare_memory_mutex);
    for (int gpu = 0; gpu < NVSHARE_MAX_GPUS; gpu++)
        gpus[gpu].changed = 1;
    pthread_mutex_unlock(&nvshare_memory_mutex);
}

struct prefetch_range {
    CUdeviceptr start;
    uint64_t bytes;
};

void nvshare_memory_prefetch(int gpu, int slot, void *unused)
{
    (void)unused;
    cuMemPrefetchAsync_v2_fn prefetch_v2 = NVSHARE_REAL(cuMemPrefetchAsync_v2);
    cuMemPrefetchAsync_v1_fn prefetch_v1 = NVSHARE_REAL(cuMemPrefetchAsync);
    if (prefetch_v2 == NULL && prefetch_v1 == NULL)
        return;

    pthread_mutex_lock(&nvshare_memory_mutex);
    size_t count = 0;
    struct prefetch_range *ranges = malloc((nvshare_pointer_map.used + 1) * sizeof *ranges);
    for (size_t i = 0; ranges != NULL && i < nvshare_pointer_map.capacity; i++) {
        const struct allocation *entry = &nvshare_pointer_map.slots[i];
        if (entry->key != 0 && entry->gpu == gpu && is_managed(entry))
            ranges[count++] = (struct prefetch_range){entry->key, entry->bytes};
    }
    pthread_mutex_unlock(&nvshare_memory_mutex);
    if (count == 0) {
        free(ranges);
        return;
    }
    double started = nvshare_now_ms();
    CUstream *streams = prefetch_streams[gpu][slot];
    int stream_count = 0;
    for (; stream_count < NVSHARE_PREFETCH_STREAMS; stream_count++) {
        CUstream *stream = &streams[stream_count];
        if (*stream == NULL &&
            nvshare_driver.stream_create(stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
            *stream = NULL; /* whatever a failed call left there is no stream */
            break;
        }
    }
    uint64_t bytes = 0;
    int next_stream = 0;
    for (size_t i = 0; stream_count > 0 && i < count; i++) {
        CUmemLocation location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = gpu};
        uint64_t chunk = stream_count > 1 ? NVSHARE_PREFETCH_CHUNK_BYTES : ranges[i].bytes;
        for (uint64_t offset = 0; offset < ranges[i].bytes; offset += chunk) {
            CUdeviceptr start = ranges[i].start + offset;
            uint64_t length = ranges[i].bytes - offset < chunk ? ranges[i].bytes - offset : chunk;
            CUstream stream = streams[next_stream];
            next_stream = (next_stream + 1) % stream_count;
            /* A range freed since the snapshot only makes this call fail. */
            CUresult result = prefetch_v2 != NULL ? prefetch_v2(start, length, location, 0, stream)
                                                  : prefetch_v1(start, length, gpu, stream);
            if (result == CUDA_SUCCESS)
                bytes += length;
        }
    }
    for (int i = 0; i < stream_count; i++)
        nvshare_driver.stream_synchronize(streams[i]);
    double elapsed_ms = nvshare_now_ms() - started;
    nvshare_debug("prefetch gpu=%d allocations=%zu bytes=%llu ms=%.2f GB/s=%.1f", gpu, count,
                  (unsigned long long)bytes, elapsed_ms,
                  elapsed_ms > 0 ? (double)bytes / 1e6 / elapsed_ms : 0.0);
    free(ranges);
}

void nvshare_memory_forget_context(int gpu, int slot)
{
    /* Freed with their context. */
    memset(prefetch_streams[gpu][slot], 0, sizeof prefetch_streams[gpu][slot]);
    pthread_mutex_lock(&nvshare_memory_mutex);
    size_t gone = 0;
    uint64_t *keys = malloc((nvshare_pointer_map.used + 1) * sizeof *keys);
    for (size_t i = 0; keys != NULL && i < nvshare_pointer_map.capacity; i++) {
        const struct allocation *entry = &nvshare_pointer_map.slots[i];
        if (entry->key != 0 && entry->gpu == gpu && entry->context_slot == slot)
            keys[gone++] = entry->key;
    }
    /* Taken after the walk: taking moves entries of the map around. */
    for (size_t i = 0; i < gone; i++) {
        struct allocation entry;
        if (allocation_map_take(&nvshare_pointer_map, keys[i], &entry))
            count(entry.gpu, entry.kind, entry.bytes, 0);
    }
    pthread_mutex_unlock(&nvshare_memory_mutex);
    free(keys);
    if (gone > 0) {
        nvshare_debug("forgot %zu allocations of a destroyed context on GPU %d", gone, gpu);
        nvshare_client_wake();
    }
}

void nvshare_memory_forget_after_fork(void)
{
    nvshare_memory_mutex = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    /* The parent's maps are left allocated: freeing in a fork handler is unsafe. */
    memset(&nvshare_pointer_map, 0, sizeof nvshare_pointer_map);
    memset(&nvshare_handle_map, 0, sizeof nvshare_handle_map);
    memset(&nvshare_vmm_mapping_map, 0, sizeof nvshare_vmm_mapping_map);
    memset(gpus, 0, sizeof gpus);
    memset(prefetch_streams, 0, sizeof prefetch_streams);
}
