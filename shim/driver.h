/* The real driver: libcuda.so.1 loaded once, each table row's function and
 * the functions the shim calls for itself (driver.c). */
#ifndef NVSHARE_DRIVER_H
#define NVSHARE_DRIVER_H

#include "cuda_abi.h"
#include "hooks.h"

/* Driver functions the shim calls for itself; none of them is hooked. */
struct nvshare_driver {
    cuDeviceGetCount_fn device_get_count;
    cuDeviceGetUuid_fn device_get_uuid;
    cuDeviceTotalMem_v2_fn device_total_mem;
    cuCtxGetCurrent_fn ctx_get_current;
    cuCtxGetDevice_fn ctx_get_device;
    cuCtxSynchronize_fn ctx_synchronize;
    cuCtxPushCurrent_v2_fn ctx_push_current;
    cuCtxPopCurrent_v2_fn ctx_pop_current;
    cuDevicePrimaryCtxGetState_fn primary_ctx_get_state;
    cuStreamCreate_fn stream_create;
    cuStreamSynchronize_fn stream_synchronize;
    cuStreamIsCapturing_fn stream_is_capturing;
    cuStreamGetCtx_fn stream_get_ctx;
    cuThreadExchangeStreamCaptureMode_fn thread_exchange_capture_mode;
    cuEventCreate_fn event_create;
    cuEventRecord_fn event_record;
    cuEventQuery_fn event_query;
    cuEventSynchronize_fn event_synchronize;
    cuEventElapsedTime_fn event_elapsed_time;
    cuMemGetAddressRange_v2_fn mem_get_address_range;
};
extern struct nvshare_driver nvshare_driver;

/* The driver's function for each row of the hook table (hooks.h), filled by
 * nvshare_resolve_driver(); NULL when this driver lacks it. */
extern void *nvshare_real[NVSHARE_HOOK_COUNT];

/* Each row's exported name, in the table's order. */
extern const char *const nvshare_hook_names[NVSHARE_HOOK_COUNT];

/* Loads libcuda.so.1 (once) and fills nvshare_real[] and nvshare_driver.
 * Returns 0 when the driver is there.  Called by every hook before it
 * touches the driver. */
int nvshare_resolve_driver(void);

/* 1 once nvshare_resolve_driver() has run, whatever it found. */
int nvshare_driver_looked_for(void);

/* Sanitizer runtimes call dlsym while they initialise, before their shadow
 * memory exists: the code on that path must not be instrumented. */
#define NVSHARE_NOT_SANITIZED __attribute__((no_sanitize_address, no_sanitize_thread))

/* glibc's own dlsym (the shim interposes dlsym: interpose.c). */
typedef void *(*nvshare_dlsym_fn)(void *handle, const char *name);
NVSHARE_NOT_SANITIZED nvshare_dlsym_fn nvshare_real_dlsym(void);

/* Row hook_id's real function, the driver resolved first.  NULL, with *error
 * the answer the call gives, when there is no driver or it lacks that function
 * (an older driver than the program's headers). */
static inline void *nvshare_real_or_error(int hook_id, CUresult *error)
{
    if (nvshare_resolve_driver() != 0) {
        *error = CUDA_ERROR_NOT_INITIALIZED;
        return NULL;
    }
    *error = CUDA_ERROR_NOT_FOUND;
    return nvshare_real[hook_id];
}

/* Where every hook starts, the generated ones (hooks.c) and the hand-written:
 *     NVSHARE_REAL_OR_RETURN(cuMemAlloc_v2, real);
 * declares real, row name's driver function typed as the hook is, or returns
 * at once what the call answers without it.  A macro, not a function: the
 * return is the hook's own, so the launch path has the one call and the two
 * branches it always had (nvshare_real_or_error is inlined). */
#define NVSHARE_REAL_OR_RETURN(name, real)                                                 \
    CUresult real##_missing;                                                               \
    __typeof__(&name) real =                                                               \
        (__typeof__(&name))nvshare_real_or_error(NVSHARE_HOOK_ID_##name, &real##_missing); \
    do {                                                                                   \
        if (real == NULL)                                                                  \
            return real##_missing;                                                         \
    } while (0)

/* Typed access to a row's real function, for the shim's own calls (hooks start with
 * NVSHARE_REAL_OR_RETURN): NVSHARE_REAL(cuMemAlloc_v2)(&pointer, bytes). */
#define NVSHARE_REAL(name) ((__typeof__(&name))nvshare_real[NVSHARE_HOOK_ID_##name])

#endif
