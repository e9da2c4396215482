/*
 * The real driver: libcuda.so.1, loaded once at the first CUDA call (never at
 * load time), and resolved by name for every row of the hook table and for
 * the functions the shim calls for itself.  dlsym itself is interposed
 * (interpose.c), so the lookups go through glibc's own dlsym.
 */
#define _GNU_SOURCE
#include "driver.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "hooks.h"

struct nvshare_driver nvshare_driver;
void *nvshare_real[NVSHARE_HOOK_COUNT];

#define ROW_NAME_GATED(name, signature, stream, launch) #name,
#define ROW_NAME_OWN(name, kind, stream, prototype)     #name,
const char *const nvshare_hook_names[NVSHARE_HOOK_COUNT] = {
    NVSHARE_HOOK_TABLE(ROW_NAME_GATED, ROW_NAME_OWN)};

static _Atomic(nvshare_dlsym_fn) real_dlsym_slot;
static pthread_once_t resolve_once = PTHREAD_ONCE_INIT;
static atomic_int driver_state; /* 0 unresolved, 1 resolved, -1 libcuda missing */

/* glibc 2.34 moved dlsym into libc as dlsym@@GLIBC_2.34 and kept
 * dlsym@GLIBC_2.2.5 for binaries linked before; find whichever exists. */
NVSHARE_NOT_SANITIZED nvshare_dlsym_fn nvshare_real_dlsym(void)
{
    nvshare_dlsym_fn found = atomic_load_explicit(&real_dlsym_slot, memory_order_acquire);
    if (found == NULL) {
        found = (nvshare_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (found == NULL)
            found = (nvshare_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        atomic_store_explicit(&real_dlsym_slot, found, memory_order_release);
    }
    return found;
}

#define LOOKUP(handle, field, name) \
    nvshare_driver.field = (__typeof__(nvshare_driver.field))lookup((handle), (name))

static void resolve(void)
{
    int saved_errno = errno;
    nvshare_dlsym_fn lookup = nvshare_real_dlsym();
    void *handle = dlopen("libcuda.so.1", RTLD_LAZY);
    if (lookup == NULL || handle == NULL) {
        atomic_store(&driver_state, -1);
        errno = saved_errno;
        return;
    }
    for (size_t row = 0; row < NVSHARE_HOOK_COUNT; row++)
        nvshare_real[row] = lookup(handle, nvshare_hook_names[row]);

    LOOKUP(handle, device_get_count, "cuDeviceGetCount");
    LOOKUP(handle, device_get_uuid, "cuDeviceGetUuid_v2");
    if (nvshare_driver.device_get_uuid == NULL)
        LOOKUP(handle, device_get_uuid, "cuDeviceGetUuid");
    LOOKUP(handle, device_total_mem, "cuDeviceTotalMem_v2");
    LOOKUP(handle, ctx_get_current, "cuCtxGetCurrent");
    LOOKUP(handle, ctx_get_device, "cuCtxGetDevice");
    LOOKUP(handle, ctx_synchronize, "cuCtxSynchronize");
    LOOKUP(handle, ctx_push_current, "cuCtxPushCurrent_v2");
    LOOKUP(handle, ctx_pop_current, "cuCtxPopCurrent_v2");
    LOOKUP(handle, primary_ctx_get_state, "cuDevicePrimaryCtxGetState");
    LOOKUP(handle, stream_create, "cuStreamCreate");
    LOOKUP(handle, stream_synchronize, "cuStreamSynchronize");
    LOOKUP(handle, stream_is_capturing, "cuStreamIsCapturing");
    LOOKUP(handle, stream_get_ctx, "cuStreamGetCtx");
    LOOKUP(handle, thread_exchange_capture_mode, "cuThreadExchangeStreamCaptureMode");
    LOOKUP(handle, event_create, "cuEventCreate");
    LOOKUP(handle, event_record, "cuEventRecord");
    LOOKUP(handle, event_query, "cuEventQuery");
    LOOKUP(handle, event_synchronize, "cuEventSynchronize");
    LOOKUP(handle, event_elapsed_time, "cuEventElapsedTime_v2");
    if (nvshare_driver.event_elapsed_time == NULL)
        LOOKUP(handle, event_elapsed_time, "cuEventElapsedTime");
    LOOKUP(handle, mem_get_address_range, "cuMemGetAddressRange_v2");
    /* The handle stays open for the life of the process: hooks point into it. */
    atomic_store_explicit(&driver_state, 1, memory_order_release);
    errno = saved_errno;
}

int nvshare_resolve_driver(void)
{
    if (atomic_load_explicit(&driver_state, memory_order_acquire) == 0)
        pthread_once(&resolve_once, resolve);
    return atomic_load_explicit(&driver_state, memory_order_acquire) == 1 ? 0 : -1;
}

int nvshare_driver_looked_for(void)
{
    return atomic_load_explicit(&driver_state, memory_order_acquire) != 0;
}
