/* Finding the real driver, and handing out hooks instead of its functions. */
#ifndef NVSHARE_INTERPOSE_H
#define NVSHARE_INTERPOSE_H

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

/* Loads libcuda.so.1 (once), fills nvshare_real[] and nvshare_driver, and
 * builds the real-pointer -> hook map.  Returns 0 when the driver is there.
 * Called by every hook before it touches the driver. */
int nvshare_resolve_driver(void);

/* Where every hook starts: row hook_id's real function, the driver resolved
 * first.  NULL, with *error the answer the call gives, when there is no driver
 * or it lacks that function (an older driver than the program's headers). */
static inline void *nvshare_real_or_error(int hook_id, CUresult *error)
{
    if (nvshare_resolve_driver() != 0) {
        *error = CUDA_ERROR_NOT_INITIALIZED;
        return NULL;
    }
    *error = CUDA_ERROR_NOT_FOUND;
    return nvshare_real[hook_id];
}

/* Typed as the hook of that row is (the driver's function has its type):
 * __typeof__(&cuMemAlloc_v2) real = NVSHARE_REAL_OR_ERROR(cuMemAlloc_v2, &error); */
#define NVSHARE_REAL_OR_ERROR(name, error) \
    ((__typeof__(&name))nvshare_real_or_error(NVSHARE_HOOK_ID_##name, (error)))

/* The hook for a function the driver handed out, or the function itself when
 * the table has no row for it.  name/cuda_version/flags only feed a debug
 * line when a hooked family hands out an unknown variant. */
void *nvshare_hook_for(void *real, const char *name, int cuda_version, unsigned long long flags);

#endif
