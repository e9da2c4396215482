/*
 * Stand-in driver: virtual memory management (cuMemCreate/Map, as PyTorch's
 * expandable_segments uses) and IPC handles: the memory the shim cannot turn
 * into managed memory and must pass through.
 *
 * A physical handle is a memfd; reserving address space is a PROT_NONE
 * mapping; cuMemMap maps the memfd over part of it, so data written through
 * one mapping really lands in the handle.  As the driver does, the memory is
 * freed (and its device memory given back) once every reference is gone: the
 * handle's, each cuMemRetainAllocationHandle's, and each mapping's.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "standin.h"

#define GRANULARITY  ((size_t)2 << 20)
#define HANDLE_MAGIC 0x564d4d48u
#define IPC_MAGIC    0x49504348u

struct physical {
    uint32_t magic;
    int fd;
    size_t bytes;
    CUdevice device;
    unsigned references;
};

#define MAPPINGS 64
static struct {
    CUdeviceptr ptr;
    struct physical *physical;
} mappings[MAPPINGS]; /* guarded by standin_lock */

/* Drops one reference; the last frees the memory. */
static void unreference(struct physical *p)
{
    pthread_mutex_lock(&standin_lock);
    int last = --p->references == 0;
    if (last)
        p->magic = 0;
    pthread_mutex_unlock(&standin_lock);
    if (last) {
        standin_refund_device(p->device, p->bytes);
        close(p->fd); /* existing host mappings keep the pages */
        free(p);
    }
}

static struct physical *physical_of(CUmemGenericAllocationHandle handle)
{
    struct physical *p = (struct physical *)(uintptr_t)handle;
    return p != NULL && p->magic == HANDLE_MAGIC ? p : NULL;
}

STANDIN_EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity,
                                                      const CUmemAllocationProp *prop, int option)
{
    standin_log("cuMemGetAllocationGranularity", "option=%d", option);
    if (granularity == NULL || prop == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = GRANULARITY;
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t bytes,
                                    const CUmemAllocationProp *prop, unsigned long long flags)
{
    CUresult result = standin_require_ctx();
    if (result == CUDA_SUCCESS &&
        (handle == NULL || prop == NULL || bytes == 0 || bytes % GRANULARITY != 0 ||
         prop->location.id < 0 || prop->location.id >= standin_device_count()))
        result = CUDA_ERROR_INVALID_VALUE;
    struct physical *p = NULL;
    if (result == CUDA_SUCCESS && standin_charge_device(prop->location.id, bytes) != 0)
        result = CUDA_ERROR_OUT_OF_MEMORY;
    if (result == CUDA_SUCCESS) {
        p = calloc(1, sizeof *p);
        int fd = p != NULL ? memfd_create("standin-vmm", MFD_CLOEXEC) : -1;
        if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) {
            if (fd >= 0)
                close(fd);
            free(p);
            p = NULL;
            standin_refund_device(prop->location.id, bytes);
            result = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            *p = (struct physical){HANDLE_MAGIC, fd, bytes, prop->location.id, 1};
            *handle = (uintptr_t)p;
        }
    }
    standin_log("cuMemCreate", "bytes=%zu flags=%llu handle=%p result=%d", bytes, flags, (void *)p,
                result);
    return result;
}

STANDIN_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    struct physical *p = physical_of(handle);
    standin_log("cuMemRelease", "handle=%p", (void *)p);
    if (p == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    unreference(p);
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle,
                                                    void *addr)
{
    CUresult result = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&standin_lock);
    for (int i = 0; i < MAPPINGS && result != CUDA_SUCCESS; i++) {
        if (handle != NULL && mappings[i].physical != NULL &&
            mappings[i].ptr == (CUdeviceptr)(uintptr_t)addr) {
            mappings[i].physical->references++;
            *handle = (uintptr_t)mappings[i].physical;
            result = CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&standin_lock);
    standin_log("cuMemRetainAllocationHandle", "ptr=%p result=%d", addr, result);
    return result;
}

STANDIN_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t bytes, size_t alignment,
                                            CUdeviceptr addr, unsigned long long flags)
{
    CUresult result = standin_initialised() ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
    if (result == CUDA_SUCCESS && (ptr == NULL || bytes == 0 || bytes % GRANULARITY != 0))
        result = CUDA_ERROR_INVALID_VALUE;
    void *p = MAP_FAILED;
    if (result == CUDA_SUCCESS)
        p = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (result == CUDA_SUCCESS && p == MAP_FAILED)
        result = CUDA_ERROR_OUT_OF_MEMORY;
    if (result == CUDA_SUCCESS && standin_track((uintptr_t)p, bytes, KIND_VMM_RESERVE, 0) != 0) {
        munmap(p, bytes);
        result = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (result == CUDA_SUCCESS)
        *ptr = (uintptr_t)p;
    standin_log("cuMemAddressReserve",
                "bytes=%zu alignment=%zu addr=0x%llx flags=%llu ptr=0x%llx result=%d", bytes,
                alignment, addr, flags, result ? 0ull : *ptr, result);
    return result;
}

STANDIN_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t bytes)
{
    size_t reserved = 0;
    CUresult result = standin_untrack(ptr, KIND_VMM_RESERVE, &reserved) == 0 && reserved == bytes
                          ? CUDA_SUCCESS
                          : CUDA_ERROR_INVALID_VALUE;
    if (result == CUDA_SUCCESS)
        munmap((void *)(uintptr_t)ptr, bytes);
    standin_log("cuMemAddressFree", "ptr=0x%llx bytes=%zu result=%d", ptr, bytes, result);
    return result;
}

STANDIN_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t bytes, size_t offset,
                                 CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    struct physical *p = physical_of(handle);
    CUresult result =
        p != NULL && flags == 0 && bytes > 0 && offset <= p->bytes && bytes <= p->bytes - offset
            ? CUDA_SUCCESS
            : CUDA_ERROR_INVALID_VALUE;
    if (result == CUDA_SUCCESS) {
        void *at = mmap((void *)(uintptr_t)ptr, bytes, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_FIXED, p->fd, (off_t)offset);
        if (at == MAP_FAILED)
            result = CUDA_ERROR_INVALID_VALUE;
        else if (standin_track(ptr, bytes, KIND_VMM_MAPPING, p->device) != 0)
            result = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (result == CUDA_SUCCESS) {
        pthread_mutex_lock(&standin_lock);
        int slot = -1;
        for (int i = 0; i < MAPPINGS && slot < 0; i++)
            slot = mappings[i].physical == NULL ? i : -1;
        if (slot >= 0) {
            mappings[slot].ptr = ptr;
            mappings[slot].physical = p;
            p->references++;
        }
        pthread_mutex_unlock(&standin_lock);
        if (slot < 0)
            result = CUDA_ERROR_OUT_OF_MEMORY;
    }
    standin_log("cuMemMap", "ptr=0x%llx bytes=%zu offset=%zu handle=%p result=%d", ptr, bytes,
                offset, (void *)p, result);
    return result;
}

STANDIN_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t bytes)
{
    size_t mapped = 0;
    CUresult result = standin_untrack(ptr, KIND_VMM_MAPPING, &mapped) == 0 && mapped == bytes
                          ? CUDA_SUCCESS
                          : CUDA_ERROR_INVALID_VALUE;
    if (result == CUDA_SUCCESS) /* back to reserved, inaccessible address space */
        mmap((void *)(uintptr_t)ptr, bytes, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    struct physical *unmapped = NULL;
    pthread_mutex_lock(&standin_lock);
    for (int i = 0; result == CUDA_SUCCESS && i < MAPPINGS && unmapped == NULL; i++) {
        if (mappings[i].physical != NULL && mappings[i].ptr == ptr) {
            unmapped = mappings[i].physical;
            mappings[i].physical = NULL;
        }
    }
    pthread_mutex_unlock(&standin_lock);
    if (unmapped != NULL)
        unreference(unmapped);
    standin_log("cuMemUnmap", "ptr=0x%llx bytes=%zu result=%d", ptr, bytes, result);
    return result;
}

STANDIN_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t bytes, const CUmemAccessDesc *desc,
                                       size_t count)
{
    standin_log("cuMemSetAccess", "ptr=0x%llx bytes=%zu count=%zu", ptr, bytes, count);
    return desc != NULL && count > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- IPC: the handle names a size; opening maps fresh memory of that size.
 * (The fake cannot share another process's pages; the shim only needs to see
 * the call and pass it through.) */
struct ipc_payload {
    uint32_t magic;
    uint32_t pid;
    uint64_t ptr;
    uint64_t bytes;
};

STANDIN_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr)
{
    CUresult result = standin_require_ctx();
    CUdeviceptr start = 0;
    size_t bytes = 0;
    if (result == CUDA_SUCCESS &&
        (handle == NULL ||
         cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, dptr) !=
             CUDA_SUCCESS ||
         cuPointerGetAttribute(&bytes, CU_POINTER_ATTRIBUTE_RANGE_SIZE, dptr) != CUDA_SUCCESS))
        result = CUDA_ERROR_INVALID_VALUE;
    if (result == CUDA_SUCCESS) {
        struct ipc_payload payload = {IPC_MAGIC, (uint32_t)getpid(), start, bytes};
        memset(handle, 0, sizeof *handle);
        memcpy(handle->reserved, &payload, sizeof payload);
    }
    standin_log("cuIpcGetMemHandle", "ptr=0x%llx bytes=%zu result=%d", dptr, bytes, result);
    return result;
}

/* As the driver does, a handle opened again before it is closed gives the same
 * mapping, its opens counted; the last close unmaps it. */
#define IPC_MAPPINGS 16
static struct {
    uint32_t pid;
    uint64_t ptr;
    CUdeviceptr mapped;
    unsigned opens;
} ipc_mappings[IPC_MAPPINGS];

STANDIN_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *dptr, CUipcMemHandle handle,
                                              unsigned int flags)
{
    struct ipc_payload payload;
    memcpy(&payload, handle.reserved, sizeof payload);
    CUresult result = standin_require_ctx();
    if (result == CUDA_SUCCESS &&
        (dptr == NULL || payload.magic != IPC_MAGIC || payload.bytes == 0))
        result = CUDA_ERROR_INVALID_VALUE;
    int slot = -1, reopened = 0;
    pthread_mutex_lock(&standin_lock);
    for (int i = 0; result == CUDA_SUCCESS && i < IPC_MAPPINGS && !reopened; i++) {
        if (ipc_mappings[i].opens > 0 && ipc_mappings[i].pid == payload.pid &&
            ipc_mappings[i].ptr == payload.ptr) {
            ipc_mappings[i].opens++;
            *dptr = ipc_mappings[i].mapped;
            reopened = 1;
        } else if (ipc_mappings[i].opens == 0 && slot < 0) {
            slot = i;
        }
    }
    pthread_mutex_unlock(&standin_lock);
    if (result == CUDA_SUCCESS && !reopened && slot < 0)
        result = CUDA_ERROR_OUT_OF_MEMORY;
    void *p = MAP_FAILED;
    if (result == CUDA_SUCCESS && !reopened)
        p = mmap(NULL, payload.bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (result == CUDA_SUCCESS && !reopened && p == MAP_FAILED)
        result = CUDA_ERROR_OUT_OF_MEMORY;
    if (result == CUDA_SUCCESS && !reopened &&
        standin_track((uintptr_t)p, payload.bytes, KIND_IPC, 0) != 0) {
        munmap(p, payload.bytes);
        result = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (result == CUDA_SUCCESS && !reopened) {
        *dptr = (uintptr_t)p;
        pthread_mutex_lock(&standin_lock);
        ipc_mappings[slot].pid = payload.pid;
        ipc_mappings[slot].ptr = payload.ptr;
        ipc_mappings[slot].mapped = *dptr;
        ipc_mappings[slot].opens = 1;
        pthread_mutex_unlock(&standin_lock);
    }
    standin_log("cuIpcOpenMemHandle_v2", "bytes=%llu flags=%u ptr=0x%llx reopened=%d result=%d",
                (unsigned long long)payload.bytes, flags, result ? 0ull : *dptr, reopened, result);
    return result;
}

STANDIN_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    int still_open = 0;
    pthread_mutex_lock(&standin_lock);
    for (int i = 0; i < IPC_MAPPINGS; i++) {
        if (ipc_mappings[i].opens > 0 && ipc_mappings[i].mapped == dptr)
            still_open = --ipc_mappings[i].opens > 0;
    }
    pthread_mutex_unlock(&standin_lock);
    size_t bytes = 0;
    CUresult result = CUDA_SUCCESS;
    if (!still_open)
        result =
            standin_untrack(dptr, KIND_IPC, &bytes) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (result == CUDA_SUCCESS && !still_open)
        munmap((void *)(uintptr_t)dptr, bytes);
    standin_log("cuIpcCloseMemHandle", "ptr=0x%llx still_open=%d result=%d", dptr, still_open,
                result);
    return result;
}
