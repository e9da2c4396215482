/*
 * The shim's lifecycle, above everything else: starting the client at the
 * first CUDA call, forgetting it all in a forked child, and forgetting a
 * context everywhere once the driver has freed it.  Each of these touches
 * many modules, so each happens here, by calling down into them, and no
 * module reaches sideways into another's state for it.
 */
#define _GNU_SOURCE
#include "lifecycle.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>

#include "agent_link.h"
#include "capture.h"
#include "config.h"
#include "contexts.h"
#include "devices.h"
#include "fair_share.h"
#include "driver.h"
#include "gpu_worker.h"
#include "hooks.h"
#include "lock_client.h"
#include "lock_state.h"
#include "log.h"
#include "memory_accounting.h"
#include "memory_prefetch.h"
#include "parking.h"
#include "queue_bound.h"
#include "shim_threads.h"

static pthread_mutex_t start_mutex = PTHREAD_MUTEX_INITIALIZER;

/* ---- start and fork -------------------------------------------------------------------- */

/* In the child of fork: only the forking thread exists, the client thread
 * does not, and mutexes may have been copied locked.  Reset to "never
 * started" with plain stores (no allocation, no locking); the child's first
 * GPU call starts its own client and connection. */
static void forget_after_fork(void)
{
    atomic_store(&nvshare_client_running, 0);
    start_mutex = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    nvshare_link_forget_after_fork();
    nvshare_client_forget_after_fork();
    nvshare_doorbell_forget_after_fork();
    nvshare_lock_forget_after_fork();
    nvshare_fair_forget_after_fork();
    nvshare_workers_forget_after_fork();
    nvshare_devices_forget_after_fork();
    nvshare_contexts_forget_after_fork();
    nvshare_memory_forget_after_fork();
    nvshare_prefetch_forget_after_fork();
    nvshare_parking_forget_after_fork();
    nvshare_queue_forget_after_fork();
    nvshare_capture_forget_after_fork();
}

void nvshare_client_start(void)
{
    if (atomic_load(&nvshare_client_running) || nvshare_resolve_driver() != 0)
        return;
    int saved_errno = errno;
    static int fork_handler_installed;
    pthread_mutex_lock(&start_mutex);
    if (atomic_load(&nvshare_client_running) || nvshare_devices_discover() != 0)
        goto out; /* before cuInit: try again at the next call */
    nvshare_config();
    if (!fork_handler_installed) {
        pthread_atfork(NULL, NULL, forget_after_fork);
        fork_handler_installed = 1;
    }
    /* Allocations wait for the agent's caps from here; the client thread ends the
     * wait (its agent's WELCOME, or none to be had). */
    nvshare_memory_await_caps();
    int failed =
        nvshare_doorbell_open() != 0 || nvshare_start_shim_thread(nvshare_client_main, NULL) != 0;
    if (failed) {
        nvshare_warn("cannot start the nvshare client thread: running unscheduled");
        nvshare_lock_run_unscheduled();
        nvshare_memory_caps_untold();
    }
    atomic_store(&nvshare_client_running, 1);
out:
    pthread_mutex_unlock(&start_mutex);
    errno = saved_errno;
}

NVSHARE_EXPORT CUresult cuInit(unsigned int flags)
{
    NVSHARE_REAL_OR_RETURN(cuInit, real);
    CUresult result = real(flags);
    if (result == CUDA_SUCCESS)
        nvshare_client_start();
    return result;
}

/* ---- a context's end ------------------------------------------------------------------- */

/* The driver has just freed context, of a GPU in [first, last]: drop all
 * that belongs to it.  Called with those GPUs' contexts held. */
static void forget_context(CUcontext context, int first, int last)
{
    if (context == NULL)
        return;
    nvshare_capture_forget_context(context);
    for (int gpu = first; gpu <= last; gpu++) {
        unsigned slots = nvshare_contexts_slots_of(gpu, context);
        for (int slot = 0; slot < NVSHARE_CONTEXT_SLOTS; slot++) {
            if (!(slots & (1U << slot)))
                continue;
            nvshare_queue_forget_context(gpu, slot);
            nvshare_parking_forget_context(gpu, slot);
            nvshare_memory_forget_context(gpu, slot);
            nvshare_prefetch_forget_context(gpu, slot);
        }
        nvshare_contexts_free_slots(gpu, slots);
    }
    atomic_fetch_add(&nvshare_context_generation, 1);
}

NVSHARE_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    NVSHARE_REAL_OR_RETURN(cuCtxDestroy_v2, real);
    int cancel_state = nvshare_contexts_hold(0, NVSHARE_MAX_GPUS - 1);
    CUresult result = real(ctx);
    if (result == CUDA_SUCCESS)
        forget_context(ctx, 0, NVSHARE_MAX_GPUS - 1);
    nvshare_contexts_let_go(0, NVSHARE_MAX_GPUS - 1, cancel_state);
    return result;
}

/* Only to learn each GPU's primary context, which a reset or the last release frees. */
NVSHARE_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    NVSHARE_REAL_OR_RETURN(cuDevicePrimaryCtxRetain, real);
    CUresult result = real(pctx, dev);
    if (result == CUDA_SUCCESS && dev >= 0 && dev < NVSHARE_MAX_GPUS) {
        nvshare_contexts_set_primary(dev, *pctx);
        nvshare_debug("primary context retained gpu=%d primary=%p", (int)dev, (void *)*pctx);
    }
    return result;
}

/* A reset always frees the primary context; a release only when it gave up
 * the last reference (until then it only counts down). */
enum primary_end { PRIMARY_RESET, PRIMARY_RELEASE };

static CUresult end_primary(CUdevice dev, cuDevicePrimaryCtxReset_v2_fn real, enum primary_end how)
{
    if (dev < 0 || dev >= NVSHARE_MAX_GPUS)
        return real(dev); /* not a GPU the shim tracks: the driver answers */
    int cancel_state = nvshare_contexts_hold(dev, dev);
    CUresult result = real(dev);
    unsigned flags;
    int active = 0;
    if (result == CUDA_SUCCESS &&
        (how == PRIMARY_RESET ||
         (nvshare_driver.primary_ctx_get_state != NULL &&
          nvshare_driver.primary_ctx_get_state(dev, &flags, &active) == CUDA_SUCCESS && !active)))
        forget_context(nvshare_contexts_primary(dev), dev, dev);
    nvshare_debug("primary context %s gpu=%d result=%d still_active=%d primary=%p",
                  how == PRIMARY_RESET ? "reset" : "release", (int)dev, (int)result, active,
                  (void *)nvshare_contexts_primary(dev));
    nvshare_contexts_let_go(dev, dev, cancel_state);
    return result;
}

/* The version-1 names too: cudart of CUDA 13 asks cuGetProcAddress for them
 * with cudaVersion 7000 (measured on the H100), and cudaDeviceReset resets
 * through cuDevicePrimaryCtxReset. */
#define DEFINE_PRIMARY_END(name, how)          \
    NVSHARE_EXPORT CUresult name(CUdevice dev) \
    {                                          \
        NVSHARE_REAL_OR_RETURN(name, real);    \
        return end_primary(dev, real, how);    \
    }
DEFINE_PRIMARY_END(cuDevicePrimaryCtxRelease, PRIMARY_RELEASE)
DEFINE_PRIMARY_END(cuDevicePrimaryCtxRelease_v2, PRIMARY_RELEASE)
DEFINE_PRIMARY_END(cuDevicePrimaryCtxReset, PRIMARY_RESET)
DEFINE_PRIMARY_END(cuDevicePrimaryCtxReset_v2, PRIMARY_RESET)
