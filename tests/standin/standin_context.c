/*
 * Stand-in driver: devices (deterministic names and UUIDs, a few attributes)
 * and contexts (primary contexts, created ones, and the per-thread current
 * context stack that most driver calls require).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "standin.h"

/* ---- devices ---- */
CUresult standin_check_device(CUdevice dev)
{
    if (!standin_initialised())
        return CUDA_ERROR_NOT_INITIALIZED;
    return dev >= 0 && dev < standin_device_count() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

STANDIN_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    standin_log("cuDeviceGet", "ordinal=%d", ordinal);
    CUresult result = standin_check_device(ordinal);
    if (result == CUDA_SUCCESS && device == NULL)
        result = CUDA_ERROR_INVALID_VALUE;
    if (result == CUDA_SUCCESS)
        *device = ordinal;
    return result;
}

STANDIN_EXPORT CUresult cuDeviceGetCount(int *count)
{
    standin_log("cuDeviceGetCount", NULL);
    if (!standin_initialised())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *count = standin_device_count();
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    standin_log("cuDeviceGetName", "dev=%d", dev);
    CUresult result = standin_check_device(dev);
    if (result != CUDA_SUCCESS)
        return result;
    if (name == NULL || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "NVIDIA Stand-in GPU %d", dev);
    return CUDA_SUCCESS;
}

/* Deterministic UUIDs: "Standin" then zeros then the ordinal, so tests can
 * predict GPU-5374616e-6469-6e00-0000-0000000000NN. */
static CUresult device_uuid(const char *function, CUuuid *uuid, CUdevice dev)
{
    standin_log(function, "dev=%d", dev);
    CUresult result = standin_check_device(dev);
    if (result != CUDA_SUCCESS)
        return result;
    if (uuid == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    memset(uuid->bytes, 0, sizeof uuid->bytes);
    memcpy(uuid->bytes, "Standin", 7);
    uuid->bytes[15] = (char)dev;
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    return device_uuid("cuDeviceGetUuid", uuid, dev);
}
STANDIN_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    return device_uuid("cuDeviceGetUuid_v2", uuid, dev);
}

STANDIN_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    standin_log("cuDeviceTotalMem_v2", "dev=%d", dev);
    CUresult result = standin_check_device(dev);
    if (result == CUDA_SUCCESS && bytes == NULL)
        result = CUDA_ERROR_INVALID_VALUE;
    if (result == CUDA_SUCCESS)
        *bytes = standin_total_mem();
    return result;
}

STANDIN_EXPORT CUresult cuDeviceGetAttribute(int *value, int attrib, CUdevice dev)
{
    standin_log("cuDeviceGetAttribute", "attrib=%d dev=%d", attrib, dev);
    CUresult result = standin_check_device(dev);
    if (result != CUDA_SUCCESS)
        return result;
    if (value == NULL || attrib < 1 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
        *value = 1024;
        break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE:
        *value = 32;
        break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
        *value = 132;
        break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID:
        *value = dev + 1;
        break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
        *value = 9;
        break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
        *value = 0;
        break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
        *value = 1;
        break;
    default:
        *value = 0;
    }
    return CUDA_SUCCESS;
}

/* ---- contexts ---- */
#define CTX_STACK_DEPTH 16
static __thread CUcontext ctx_stack[CTX_STACK_DEPTH];
static __thread int ctx_depth; /* entries used; the top is current */
static struct CUctx_st primary_ctx[16];
static unsigned primary_flags[16];

CUcontext standin_current_ctx(void)
{
    return ctx_depth > 0 ? ctx_stack[ctx_depth - 1] : NULL;
}

CUresult standin_require_ctx(void)
{
    if (!standin_initialised())
        return CUDA_ERROR_NOT_INITIALIZED;
    CUcontext ctx = standin_current_ctx();
    if (ctx == NULL || ctx->magic != STANDIN_CTX_MAGIC)
        return CUDA_ERROR_INVALID_CONTEXT;
    return CUDA_SUCCESS;
}

static void set_current(CUcontext ctx)
{
    if (ctx == NULL) {
        if (ctx_depth > 0)
            ctx_depth--;
    } else if (ctx_depth == 0) {
        ctx_stack[ctx_depth++] = ctx;
    } else {
        ctx_stack[ctx_depth - 1] = ctx;
    }
}

STANDIN_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    standin_log("cuDevicePrimaryCtxRetain", "dev=%d", dev);
    CUresult result = standin_check_device(dev);
    if (result == CUDA_SUCCESS && pctx == NULL)
        result = CUDA_ERROR_INVALID_VALUE;
    if (result != CUDA_SUCCESS)
        return result;
    pthread_mutex_lock(&standin_lock);
    primary_ctx[dev].magic = STANDIN_CTX_MAGIC;
    primary_ctx[dev].device = dev;
    primary_ctx[dev].primary = 1;
    primary_ctx[dev].refcount++;
    standin_give_null_stream(&primary_ctx[dev]);
    pthread_mutex_unlock(&standin_lock);
    *pctx = &primary_ctx[dev];
    return CUDA_SUCCESS;
}

static void end_captures_in(CUcontext ctx, const char *function)
{
    pthread_mutex_lock(&standin_lock);
    standin_capture_end_where(NULL, ctx, function);
    pthread_mutex_unlock(&standin_lock);
}

static CUresult primary_release(const char *function, CUdevice dev)
{
    standin_log(function, "dev=%d", dev);
    CUresult result = standin_check_device(dev);
    if (result != CUDA_SUCCESS)
        return result;
    pthread_mutex_lock(&standin_lock);
    int last = primary_ctx[dev].refcount == 1;
    if (primary_ctx[dev].refcount > 0)
        primary_ctx[dev].refcount--;
    else
        result = CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_unlock(&standin_lock);
    if (last) { /* the last reference: the context's resources go */
        end_captures_in(&primary_ctx[dev], function);
        standin_wait_context_streams(&primary_ctx[dev]);
        standin_retire_context_events(&primary_ctx[dev]);
        standin_retire_context_arrays(&primary_ctx[dev]);
    }
    return result;
}

STANDIN_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return primary_release("cuDevicePrimaryCtxRelease", dev);
}
STANDIN_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    return primary_release("cuDevicePrimaryCtxRelease_v2", dev);
}

static CUresult primary_reset(const char *function, CUdevice dev)
{
    standin_log(function, "dev=%d", dev);
    CUresult result = standin_check_device(dev);
    if (result == CUDA_SUCCESS) {
        end_captures_in(&primary_ctx[dev], function);
        standin_wait_context_streams(&primary_ctx[dev]);
        standin_retire_context_events(&primary_ctx[dev]);
        standin_retire_context_arrays(&primary_ctx[dev]);
    }
    return result;
}

STANDIN_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    return primary_reset("cuDevicePrimaryCtxReset", dev);
}
STANDIN_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    return primary_reset("cuDevicePrimaryCtxReset_v2", dev);
}

STANDIN_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    standin_log("cuDevicePrimaryCtxGetState", "dev=%d", dev);
    CUresult result = standin_check_device(dev);
    if (result != CUDA_SUCCESS)
        return result;
    if (flags == NULL || active == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&standin_lock);
    *flags = primary_flags[dev];
    *active = primary_ctx[dev].refcount > 0;
    pthread_mutex_unlock(&standin_lock);
    return CUDA_SUCCESS;
}

static CUresult primary_set_flags(const char *function, CUdevice dev, unsigned flags)
{
    standin_log(function, "dev=%d flags=%u", dev, flags);
    CUresult result = standin_check_device(dev);
    if (result == CUDA_SUCCESS)
        primary_flags[dev] = flags;
    return result;
}

STANDIN_EXPORT CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags)
{
    return primary_set_flags("cuDevicePrimaryCtxSetFlags", dev, flags);
}
STANDIN_EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    return primary_set_flags("cuDevicePrimaryCtxSetFlags_v2", dev, flags);
}

STANDIN_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    standin_log("cuCtxCreate_v2", "flags=%u dev=%d", flags, dev);
    CUresult result = standin_check_device(dev);
    if (result == CUDA_SUCCESS && pctx == NULL)
        result = CUDA_ERROR_INVALID_VALUE;
    if (result != CUDA_SUCCESS)
        return result;
    CUcontext ctx = calloc(1, sizeof *ctx);
    if (ctx == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ctx->magic = STANDIN_CTX_MAGIC;
    ctx->device = dev;
    ctx->refcount = 1;
    pthread_mutex_lock(&standin_lock);
    standin_give_null_stream(ctx);
    pthread_mutex_unlock(&standin_lock);
    if (ctx_depth < CTX_STACK_DEPTH) /* a created context is pushed, as the real one is */
        ctx_stack[ctx_depth++] = ctx;
    *pctx = ctx;
    return CUDA_SUCCESS;
}

/* A destroyed context stays allocated and listed with a retired mark, so that
 * the shim pushing it afterwards is logged as "stale" instead of reading
 * freed memory. */
#define RETIRED_CTX_MAGIC 0x44454144u
static CUcontext retired_contexts[256];
static int retired_count;

static void retire(CUcontext ctx)
{
    pthread_mutex_lock(&standin_lock);
    ctx->magic = RETIRED_CTX_MAGIC;
    if (retired_count < (int)(sizeof retired_contexts / sizeof retired_contexts[0]))
        retired_contexts[retired_count++] = ctx;
    pthread_mutex_unlock(&standin_lock);
}

STANDIN_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    standin_log("cuCtxDestroy_v2", "ctx=%p", (void *)ctx);
    if (ctx == NULL || ctx->magic != STANDIN_CTX_MAGIC || ctx->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    end_captures_in(ctx, "cuCtxDestroy_v2");
    standin_wait_context_streams(ctx);
    standin_retire_context_events(ctx);
    standin_retire_context_arrays(ctx);
    for (int i = 0; i < ctx_depth; i++) {
        if (ctx_stack[i] == ctx) {
            memmove(&ctx_stack[i], &ctx_stack[i + 1], (size_t)(ctx_depth - i - 1) * sizeof ctx);
            ctx_depth--;
            i--;
        }
    }
    retire(ctx);
    if (standin_ctx_destroy_us() > 0)
        usleep(standin_ctx_destroy_us()); /* a real driver frees the context's memory */
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    standin_log("cuCtxGetCurrent", NULL);
    if (!standin_initialised())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = standin_current_ctx();
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    standin_log("cuCtxSetCurrent", "ctx=%p", (void *)ctx);
    if (!standin_initialised())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx != NULL && ctx->magic != STANDIN_CTX_MAGIC)
        return CUDA_ERROR_INVALID_CONTEXT;
    set_current(ctx);
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    int stale =
        ctx != NULL && (ctx->magic == RETIRED_CTX_MAGIC || (ctx->primary && ctx->refcount == 0));
    standin_log("cuCtxPushCurrent_v2", "ctx=%p%s", (void *)ctx, stale ? " stale" : "");
    if (!standin_initialised())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx == NULL || ctx->magic != STANDIN_CTX_MAGIC)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth >= CTX_STACK_DEPTH)
        return CUDA_ERROR_INVALID_VALUE;
    ctx_stack[ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    standin_log("cuCtxPopCurrent_v2", NULL);
    if (!standin_initialised())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext ctx = ctx_stack[--ctx_depth];
    if (pctx != NULL)
        *pctx = ctx;
    return CUDA_SUCCESS;
}

static CUresult ctx_device(CUdevice *device, CUcontext ctx)
{
    if (!standin_initialised())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx == NULL || ctx->magic != STANDIN_CTX_MAGIC)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *device = ctx->device;
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuCtxGetDevice(CUdevice *device)
{
    standin_log("cuCtxGetDevice", NULL);
    return ctx_device(device, standin_current_ctx());
}

STANDIN_EXPORT CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    standin_log("cuCtxGetDevice_v2", "ctx=%p", (void *)ctx);
    return ctx_device(device, ctx != NULL ? ctx : standin_current_ctx());
}

static CUresult ctx_synchronize(const char *function, CUcontext ctx)
{
    CUresult result = standin_require_ctx();
    if (ctx != NULL && ctx->magic != STANDIN_CTX_MAGIC)
        result = CUDA_ERROR_INVALID_CONTEXT;
    if (result == CUDA_SUCCESS)
        result = standin_capture_check_context_sync(function);
    if (result == CUDA_SUCCESS) /* a context waits for its own work only */
        standin_wait_context_streams(ctx != NULL ? ctx : standin_current_ctx());
    standin_log(function, "result=%d", result);
    return result;
}

STANDIN_EXPORT CUresult cuCtxSynchronize(void)
{
    return ctx_synchronize("cuCtxSynchronize", NULL);
}
STANDIN_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    return ctx_synchronize("cuCtxSynchronize_v2", ctx);
}
