/*
 * Stand-in driver: fake device, managed, VMM and IPC memory backed by host
 * memory, copies, memsets, prefetches and pointer attributes.
 *
 * Every allocation is its own MAP_NORESERVE mapping: untouched pages cost
 * nothing, so STANDIN_TOTAL_MEM may exceed the machine's RAM.  Device memory
 * (cuMemAlloc, pitch, stream-ordered, VMM) counts against STANDIN_TOTAL_MEM
 * and fails with CUDA_ERROR_OUT_OF_MEMORY past it; managed memory, as on a
 * real GPU, may be oversubscribed.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "standin.h"

static const char *const kind_names[] = {"device", "managed",     "async",
                                         "ipc",    "vmm_reserve", "vmm_mapping"};

struct allocation {
    CUdeviceptr ptr;
    size_t bytes;
    enum standin_alloc_kind kind;
    CUdevice device;
    int counted; /* bytes count against the device's total */
};

static struct allocation *table;
static size_t table_used, table_size;
static size_t device_used[16];

/* ---- the allocation table (standin_lock held) ---- */
static struct allocation *find_containing(CUdeviceptr ptr, size_t bytes)
{
    for (size_t i = 0; i < table_used; i++) {
        struct allocation *a = &table[i];
        if (a->kind != KIND_VMM_RESERVE && ptr >= a->ptr && bytes <= a->bytes &&
            ptr - a->ptr <= a->bytes - bytes)
            return a;
    }
    return NULL;
}

static struct allocation *find_start(CUdeviceptr ptr, enum standin_alloc_kind kind)
{
    for (size_t i = 0; i < table_used; i++)
        if (table[i].ptr == ptr && table[i].kind == kind)
            return &table[i];
    return NULL;
}

static int add_allocation(CUdeviceptr ptr, size_t bytes, enum standin_alloc_kind kind, CUdevice dev,
                          int counted)
{
    if (table_used == table_size) {
        size_t size = table_size ? table_size * 2 : 64;
        struct allocation *grown = realloc(table, size * sizeof *grown);
        if (grown == NULL)
            return -1;
        table = grown;
        table_size = size;
    }
    table[table_used++] = (struct allocation){ptr, bytes, kind, dev, counted};
    if (counted)
        device_used[dev] += bytes;
    return 0;
}

static void remove_allocation(struct allocation *a)
{
    if (a->counted)
        device_used[a->device] -= a->bytes;
    *a = table[--table_used];
}

int standin_track(CUdeviceptr ptr, size_t bytes, enum standin_alloc_kind kind, CUdevice dev)
{
    pthread_mutex_lock(&standin_lock);
    int failed = add_allocation(ptr, bytes, kind, dev, 0);
    pthread_mutex_unlock(&standin_lock);
    return failed;
}

int standin_untrack(CUdeviceptr ptr, enum standin_alloc_kind kind, size_t *bytes)
{
    pthread_mutex_lock(&standin_lock);
    struct allocation *a = find_start(ptr, kind);
    if (a != NULL) {
        *bytes = a->bytes;
        remove_allocation(a);
    }
    pthread_mutex_unlock(&standin_lock);
    return a != NULL ? 0 : -1;
}

int standin_charge_device(CUdevice dev, size_t bytes)
{
    pthread_mutex_lock(&standin_lock);
    int over = bytes > standin_total_mem() - device_used[dev];
    if (!over)
        device_used[dev] += bytes;
    pthread_mutex_unlock(&standin_lock);
    return over ? -1 : 0;
}

void standin_refund_device(CUdevice dev, size_t bytes)
{
    pthread_mutex_lock(&standin_lock);
    device_used[dev] -= bytes;
    pthread_mutex_unlock(&standin_lock);
}

void *standin_device_range(CUdeviceptr ptr, size_t bytes)
{
    pthread_mutex_lock(&standin_lock);
    struct allocation *a = find_containing(ptr, bytes);
    pthread_mutex_unlock(&standin_lock);
    return a != NULL ? (void *)(uintptr_t)ptr : NULL;
}

static void *map_fake(size_t bytes)
{
    void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static CUdevice current_device(void)
{
    return standin_current_ctx()->device;
}

/* Allocates bytes of the given kind on the current device.  function names
 * the call for the capture rules; NULL: a capture records it (a graph node). */
static CUresult allocate(const char *function, CUdeviceptr *dptr, size_t bytes,
                         enum standin_alloc_kind kind)
{
    CUresult result = standin_require_ctx();
    if (result == CUDA_SUCCESS && function != NULL)
        result = standin_capture_check_unsafe(function);
    if (result != CUDA_SUCCESS)
        return result;
    if (dptr == NULL || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUdevice dev = current_device();
    int counted = kind != KIND_MANAGED;
    pthread_mutex_lock(&standin_lock);
    if (counted && bytes > standin_total_mem() - device_used[dev])
        result = CUDA_ERROR_OUT_OF_MEMORY;
    void *p = result == CUDA_SUCCESS ? map_fake(bytes) : NULL;
    if (result == CUDA_SUCCESS && p == NULL)
        result = CUDA_ERROR_OUT_OF_MEMORY;
    if (result == CUDA_SUCCESS && add_allocation((uintptr_t)p, bytes, kind, dev, counted) != 0) {
        munmap(p, bytes);
        result = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&standin_lock);
    if (result == CUDA_SUCCESS)
        *dptr = (uintptr_t)p;
    return result;
}

void standin_free_now(CUdeviceptr ptr)
{
    pthread_mutex_lock(&standin_lock);
    for (size_t i = 0; i < table_used; i++) {
        struct allocation *a = &table[i];
        if (a->ptr == ptr &&
            (a->kind == KIND_DEVICE || a->kind == KIND_MANAGED || a->kind == KIND_ASYNC)) {
            munmap((void *)(uintptr_t)a->ptr, a->bytes ? a->bytes : 1);
            remove_allocation(a);
            break;
        }
    }
    pthread_mutex_unlock(&standin_lock);
}

static int is_freeable(CUdeviceptr ptr)
{
    pthread_mutex_lock(&standin_lock);
    int found = find_start(ptr, KIND_DEVICE) || find_start(ptr, KIND_MANAGED) ||
                find_start(ptr, KIND_ASYNC);
    pthread_mutex_unlock(&standin_lock);
    return found;
}

/* ---- allocation entry points ---- */
STANDIN_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
    CUresult result = allocate("cuMemAlloc_v2", dptr, bytes, KIND_DEVICE);
    standin_log("cuMemAlloc_v2", "bytes=%zu ptr=0x%llx result=%d", bytes, result ? 0ull : *dptr,
                result);
    return result;
}

STANDIN_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                           size_t height, unsigned int element_bytes)
{
    CUresult result = CUDA_SUCCESS;
    size_t row = (width + 511) & ~(size_t)511;
    if (pitch == NULL || width == 0 || height == 0 ||
        (element_bytes != 4 && element_bytes != 8 && element_bytes != 16))
        result = CUDA_ERROR_INVALID_VALUE;
    if (result == CUDA_SUCCESS)
        result = allocate("cuMemAllocPitch_v2", dptr, row * height, KIND_DEVICE);
    if (result == CUDA_SUCCESS)
        *pitch = row;
    standin_log("cuMemAllocPitch_v2",
                "width=%zu height=%zu pitch=%zu bytes=%zu ptr=0x%llx result=%d", width, height, row,
                row * height, result ? 0ull : *dptr, result);
    return result;
}

STANDIN_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags)
{
    CUresult result = flags == CU_MEM_ATTACH_GLOBAL || flags == CU_MEM_ATTACH_HOST
                          ? allocate("cuMemAllocManaged", dptr, bytes, KIND_MANAGED)
                          : CUDA_ERROR_INVALID_VALUE;
    standin_log("cuMemAllocManaged", "bytes=%zu flags=%u ptr=0x%llx result=%d", bytes, flags,
                result ? 0ull : *dptr, result);
    return result;
}

static CUresult alloc_async(const char *function, CUdeviceptr *dptr, size_t bytes, CUstream stream)
{
    CUresult result = CUDA_ERROR_INVALID_HANDLE;
    if (standin_stream(stream) != NULL) {
        /* Into a capture: a graph node, allocated without the capture rules' check. */
        int captured = standin_capture_take(stream, &result);
        if (!captured || result == CUDA_SUCCESS)
            result = allocate(captured ? NULL : function, dptr, bytes, KIND_ASYNC);
    }
    standin_log(function, "bytes=%zu stream=%p ptr=0x%llx result=%d", bytes, (void *)stream,
                result ? 0ull : *dptr, result);
    return result;
}

STANDIN_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s)
{
    return alloc_async("cuMemAllocAsync", p, n, s);
}
STANDIN_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s)
{
    return alloc_async("cuMemAllocAsync_ptsz", p, n, s);
}
STANDIN_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool,
                                                CUstream s)
{
    (void)pool;
    return alloc_async("cuMemAllocFromPoolAsync", p, n, s);
}
STANDIN_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool,
                                                     CUstream s)
{
    (void)pool;
    return alloc_async("cuMemAllocFromPoolAsync_ptsz", p, n, s);
}

/* Pools hold nothing here (every allocation is its own block): a trim only answers. */
STANDIN_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    CUresult result = pool == NULL ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    standin_log("cuMemPoolTrimTo", "pool=%p keep=%zu result=%d", (void *)pool, keep, result);
    return result;
}

STANDIN_EXPORT CUresult cuMemFree_v2(CUdeviceptr ptr)
{
    CUresult result = standin_require_ctx();
    if (result == CUDA_SUCCESS)
        result = standin_capture_check_unsafe("cuMemFree_v2");
    if (result == CUDA_SUCCESS && !is_freeable(ptr))
        result = CUDA_ERROR_INVALID_VALUE;
    if (result == CUDA_SUCCESS) {
        standin_wait_all_streams(); /* cuMemFree synchronises, as the real one does */
        standin_free_now(ptr);
    }
    standin_log("cuMemFree_v2", "ptr=0x%llx result=%d", ptr, result);
    return result;
}

static CUresult free_async(const char *function, CUdeviceptr ptr, CUstream stream)
{
    CUresult result = standin_require_ctx();
    struct CUstream_st *s = standin_stream(stream);
    if (result == CUDA_SUCCESS && s == NULL)
        result = CUDA_ERROR_INVALID_HANDLE;
    if (result == CUDA_SUCCESS && !is_freeable(ptr))
        result = CUDA_ERROR_INVALID_VALUE;
    if (result == CUDA_SUCCESS && standin_capture_take(stream, &result)) {
        /* A free node of the capture: nothing is freed now. */
        standin_log(function, "ptr=0x%llx stream=%p captured=1 result=%d", ptr, (void *)stream,
                    result);
        return result;
    }
    if (result == CUDA_SUCCESS)
        result = standin_capture_check_unsafe(function);
    struct standin_op *op = result == CUDA_SUCCESS ? calloc(1, sizeof *op) : NULL;
    if (result == CUDA_SUCCESS && op == NULL)
        result = CUDA_ERROR_OUT_OF_MEMORY;
    if (result == CUDA_SUCCESS) {
        op->kind = OP_FREE;
        op->u.free.ptr = ptr;
        standin_enqueue(s, op);
    }
    standin_log(function, "ptr=0x%llx stream=%p result=%d", ptr, (void *)stream, result);
    return result;
}

STANDIN_EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
    return free_async("cuMemFreeAsync", p, s);
}
STANDIN_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s)
{
    return free_async("cuMemFreeAsync_ptsz", p, s);
}

STANDIN_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    CUresult result = standin_require_ctx();
    if (result == CUDA_SUCCESS && (free_bytes == NULL || total_bytes == NULL))
        result = CUDA_ERROR_INVALID_VALUE;
    if (result == CUDA_SUCCESS) {
        pthread_mutex_lock(&standin_lock);
        *total_bytes = standin_total_mem();
        *free_bytes = *total_bytes - device_used[current_device()];
        pthread_mutex_unlock(&standin_lock);
    }
    standin_log("cuMemGetInfo_v2", "free=%zu total=%zu result=%d", result ? 0 : *free_bytes,
                result ? 0 : *total_bytes, result);
    return result;
}

STANDIN_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *bytes, CUdeviceptr ptr)
{
    CUresult result = standin_require_ctx();
    pthread_mutex_lock(&standin_lock);
    struct allocation *a = result == CUDA_SUCCESS ? find_containing(ptr, 1) : NULL;
    if (result == CUDA_SUCCESS && a == NULL)
        result = CUDA_ERROR_NOT_FOUND;
    if (a != NULL && base != NULL)
        *base = a->ptr;
    if (a != NULL && bytes != NULL)
        *bytes = a->bytes;
    pthread_mutex_unlock(&standin_lock);
    standin_log("cuMemGetAddressRange_v2", "ptr=0x%llx result=%d", ptr, result);
    return result;
}

STANDIN_EXPORT CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr)
{
    CUresult result = standin_initialised() ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
    if (result == CUDA_SUCCESS && data == NULL)
        result = CUDA_ERROR_INVALID_VALUE;
    struct allocation found = {0};
    pthread_mutex_lock(&standin_lock);
    struct allocation *a = result == CUDA_SUCCESS ? find_containing(ptr, 1) : NULL;
    if (a != NULL)
        found = *a;
    pthread_mutex_unlock(&standin_lock);
    if (result == CUDA_SUCCESS && a == NULL)
        result = CUDA_ERROR_INVALID_VALUE; /* not memory this driver knows */
    if (result == CUDA_SUCCESS) {
        switch (attribute) {
        case CU_POINTER_ATTRIBUTE_CONTEXT:
            *(CUcontext *)data = standin_current_ctx();
            break;
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            *(unsigned *)data = CU_MEMORYTYPE_DEVICE;
            break;
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
            *(CUdeviceptr *)data = ptr;
            break;
        case CU_POINTER_ATTRIBUTE_HOST_POINTER:
            *(void **)data = found.kind == KIND_MANAGED ? (void *)(uintptr_t)ptr : NULL;
            break;
        case CU_POINTER_ATTRIBUTE_IS_MANAGED:
            *(unsigned *)data = found.kind == KIND_MANAGED;
            break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
            *(int *)data = found.device;
            break;
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
            *(CUdeviceptr *)data = found.ptr;
            break;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
            *(size_t *)data = found.bytes;
            break;
        case CU_POINTER_ATTRIBUTE_MAPPED:
            *(unsigned *)data = 1;
            break;
        default:
            result = CUDA_ERROR_INVALID_VALUE;
        }
    }
    standin_log("cuPointerGetAttribute", "attribute=%d ptr=0x%llx kind=%s result=%d", attribute,
                ptr, a != NULL ? kind_names[found.kind] : "none", result);
    return result;
}

/* ---- prefetch: only managed memory can be prefetched ---- */
static CUresult prefetch(const char *function, CUdeviceptr ptr, size_t bytes, int location,
                         CUstream stream)
{
    CUresult result = standin_require_ctx();
    if (result == CUDA_SUCCESS)
        result = standin_capture_check_unsafe(function);
    struct CUstream_st *s = standin_stream(stream);
    if (result == CUDA_SUCCESS && s == NULL)
        result = CUDA_ERROR_INVALID_HANDLE;
    if (result == CUDA_SUCCESS) {
        pthread_mutex_lock(&standin_lock);
        struct allocation *a = find_containing(ptr, bytes);
        if (a == NULL || a->kind != KIND_MANAGED)
            result = CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_unlock(&standin_lock);
    }
    if (result == CUDA_SUCCESS && standin_prefetch_us() > 0)
        usleep(standin_prefetch_us()); /* a large working set's transfer */
    struct standin_op *op = result == CUDA_SUCCESS ? calloc(1, sizeof *op) : NULL;
    if (op != NULL) {
        op->kind = OP_NOTHING; /* ordered on the stream, moves nothing */
        standin_enqueue(s, op);
    }
    standin_log(function, "ptr=0x%llx bytes=%zu location=%d stream=%p result=%d", ptr, bytes,
                location, (void *)stream, result);
    return result;
}

STANDIN_EXPORT CUresult cuMemPrefetchAsync(CUdeviceptr p, size_t n, CUdevice dev, CUstream s)
{
    return prefetch("cuMemPrefetchAsync", p, n, dev, s);
}
STANDIN_EXPORT CUresult cuMemPrefetchAsync_ptsz(CUdeviceptr p, size_t n, CUdevice dev, CUstream s)
{
    return prefetch("cuMemPrefetchAsync_ptsz", p, n, dev, s);
}
STANDIN_EXPORT CUresult cuMemPrefetchAsync_v2(CUdeviceptr p, size_t n, CUmemLocation loc,
                                              unsigned int flags, CUstream s)
{
    (void)flags;
    return prefetch("cuMemPrefetchAsync_v2", p, n,
                    loc.type == CU_MEM_LOCATION_TYPE_DEVICE ? loc.id : -1, s);
}
STANDIN_EXPORT CUresult cuMemPrefetchAsync_v2_ptsz(CUdeviceptr p, size_t n, CUmemLocation loc,
                                                   unsigned int flags, CUstream s)
{
    (void)flags;
    return prefetch("cuMemPrefetchAsync_v2_ptsz", p, n,
                    loc.type == CU_MEM_LOCATION_TYPE_DEVICE ? loc.id : -1, s);
}
