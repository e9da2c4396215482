/*
 * The CUDA contexts this process submits work in, per GPU.  Usually one, the
 * primary context; but a program may create more (cuCtxCreate), destroy them,
 * or reset the primary context (cudaDeviceReset) and go on.
 *
 * A release must wait for the work of every context on the GPU, not only the
 * last one used, or the next holder's work would run beside it.  And what the
 * shim keeps per context (the queue bound's events, the prefetch stream, the
 * allocations the driver frees with the context) must be forgotten when the
 * driver frees the context, or the shim would later hand it dangling handles.
 * So a context takes a slot here when a thread first uses it, and gives it
 * up when it is destroyed: cuCtxDestroy, cuDevicePrimaryCtxReset, or
 * cuDevicePrimaryCtxRelease of its last reference (those hooks are in
 * lifecycle.c, which forgets the context everywhere).
 *
 * Each GPU has a mutex, held while the shim works in its contexts (a
 * release's synchronisation, a grant's prefetch, on that GPU's worker) and
 * while one of them is destroyed, so neither sees the other half done.  Per
 * GPU, so that a long release on one GPU holds up nothing on another.  Taking
 * a slot also takes it, but only when a thread's current context changes
 * (nvshare_current_gpu caches the answer).  cuCtxDestroy does not say the
 * context's GPU, so it takes every GPU's, in order.  They are recursive:
 * should the driver call back into a hook on the destroying thread, that
 * thread must not wait for itself.
 */
#define _GNU_SOURCE
#include "contexts.h"

#include <pthread.h>
#include <string.h>

#include "devices.h"
#include "driver.h"
#include "log.h"
#include "nvshare_protocol.h"

struct gpu_contexts {
    pthread_mutex_t mutex;
    CUcontext slots[NVSHARE_CONTEXT_SLOTS]; /* NULL: free */
    int newest;                             /* the slot taken last (free if none is taken) */
    CUcontext primary;                      /* from cuDevicePrimaryCtxRetain; NULL: not seen */
};

#define RECURSIVE PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP
static struct gpu_contexts gpus[NVSHARE_MAX_GPUS] = {
    [0 ... NVSHARE_MAX_GPUS - 1] = {.mutex = RECURSIVE},
};

/* A thread cancelled while it holds a GPU's mutex would leave it locked for
 * every later context call of the process, and the driver calls made under it
 * (a context's destruction) may reach cancellation points.  So cancellation
 * is held off until the mutex is given back, and acted on at the thread's
 * next cancellation point.  (pthread_cleanup_push would need glibc 2.34's
 * symbols, as in lock_state.c.) */
static int hold_off_cancellation(void)
{
    int cancel_state;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
    return cancel_state;
}

int nvshare_contexts_hold(int first, int last)
{
    int cancel_state = hold_off_cancellation();
    for (int gpu = first; gpu <= last; gpu++)
        pthread_mutex_lock(&gpus[gpu].mutex);
    return cancel_state;
}

void nvshare_contexts_let_go(int first, int last, int cancel_state)
{
    for (int gpu = last; gpu >= first; gpu--)
        pthread_mutex_unlock(&gpus[gpu].mutex);
    pthread_setcancelstate(cancel_state, NULL);
}

int nvshare_context_slot(int gpu, CUcontext context)
{
    if (gpu < 0 || gpu >= NVSHARE_MAX_GPUS || context == NULL)
        return -1;
    struct gpu_contexts *contexts = &gpus[gpu];
    int slot = -1, free_slot = -1;
    pthread_mutex_lock(&contexts->mutex);
    for (int i = 0; i < NVSHARE_CONTEXT_SLOTS && slot < 0; i++) {
        if (contexts->slots[i] == context)
            slot = i;
        else if (contexts->slots[i] == NULL && free_slot < 0)
            free_slot = i;
    }
    if (slot < 0 && free_slot >= 0) {
        slot = free_slot;
        contexts->slots[slot] = context;
        contexts->newest = slot;
    }
    pthread_mutex_unlock(&contexts->mutex);
    if (slot >= 0 && slot == free_slot)
        nvshare_debug("context new gpu=%d slot=%d context=%p", gpu, slot, (void *)context);
    if (slot < 0)
        NVSHARE_WARN_ONCE("more than %d CUDA contexts on GPU %d: a release does not wait for "
                          "the work of the others",
                          NVSHARE_CONTEXT_SLOTS, gpu);
    return slot;
}

/* ---- which GPU a call runs on ---------------------------------------------------------- */

static __thread CUcontext cached_context;
static __thread int cached_gpu;
static __thread int cached_slot;
static __thread unsigned cached_generation;

int nvshare_current_gpu(CUcontext *context)
{
    CUcontext current = NULL;
    if (nvshare_driver.ctx_get_current == NULL ||
        nvshare_driver.ctx_get_current(&current) != CUDA_SUCCESS || current == NULL)
        return -1;
    *context = current;
    unsigned generation = atomic_load_explicit(&nvshare_context_generation, memory_order_relaxed);
    if (current != cached_context || cached_generation != generation) {
        CUdevice device;
        if (nvshare_driver.ctx_get_device(&device) != CUDA_SUCCESS)
            return -1;
        cached_gpu = device >= 0 && device < nvshare_gpu_count() ? device : -1;
        cached_slot = nvshare_context_slot(cached_gpu, current);
        cached_context = current;
        cached_generation = generation;
    }
    return cached_gpu;
}

int nvshare_current_context_slot(void)
{
    return cached_slot;
}

static int run_in(int gpu, int slot, void (*fn)(int gpu, int slot, void *arg), void *arg)
{
    if (nvshare_driver.ctx_push_current(gpus[gpu].slots[slot]) != CUDA_SUCCESS)
        return 0;
    fn(gpu, slot, arg);
    CUcontext popped;
    nvshare_driver.ctx_pop_current(&popped);
    return 1;
}

void nvshare_in_each_context(int gpu, void (*fn)(int gpu, int slot, void *arg), void *arg)
{
    pthread_mutex_lock(&gpus[gpu].mutex);
    for (int slot = 0; slot < NVSHARE_CONTEXT_SLOTS; slot++) {
        if (gpus[gpu].slots[slot] != NULL)
            run_in(gpu, slot, fn, arg);
    }
    pthread_mutex_unlock(&gpus[gpu].mutex);
}

int nvshare_try_in_each_context(int gpu, void (*fn)(int gpu, int slot, void *arg), void *arg)
{
    if (pthread_mutex_trylock(&gpus[gpu].mutex) != 0)
        return 0;
    for (int slot = 0; slot < NVSHARE_CONTEXT_SLOTS; slot++) {
        if (gpus[gpu].slots[slot] != NULL)
            run_in(gpu, slot, fn, arg);
    }
    pthread_mutex_unlock(&gpus[gpu].mutex);
    return 1;
}

int nvshare_in_one_context(int gpu, void (*fn)(int gpu, int slot, void *arg), void *arg)
{
    pthread_mutex_lock(&gpus[gpu].mutex);
    int slot = gpus[gpu].newest;
    int ran = gpus[gpu].slots[slot] != NULL && run_in(gpu, slot, fn, arg);
    pthread_mutex_unlock(&gpus[gpu].mutex);
    return ran;
}

void nvshare_contexts_set_primary(int gpu, CUcontext primary)
{
    pthread_mutex_lock(&gpus[gpu].mutex);
    gpus[gpu].primary = primary;
    pthread_mutex_unlock(&gpus[gpu].mutex);
}

CUcontext nvshare_contexts_primary(int gpu)
{
    return gpus[gpu].primary;
}

unsigned nvshare_contexts_slots_of(int gpu, CUcontext context)
{
    unsigned slots = 0;
    for (int slot = 0; context != NULL && slot < NVSHARE_CONTEXT_SLOTS; slot++) {
        if (gpus[gpu].slots[slot] == context)
            slots |= 1U << slot;
    }
    return slots;
}

void nvshare_contexts_free_slots(int gpu, unsigned slots)
{
    struct gpu_contexts *contexts = &gpus[gpu];
    for (int slot = 0; slot < NVSHARE_CONTEXT_SLOTS; slot++) {
        if (!(slots & (1U << slot)))
            continue;
        contexts->slots[slot] = NULL;
        for (int other = 0; contexts->newest == slot && other < NVSHARE_CONTEXT_SLOTS; other++) {
            if (contexts->slots[other] != NULL)
                contexts->newest = other;
        }
        nvshare_debug("context gone gpu=%d slot=%d", gpu, slot);
    }
}

void nvshare_contexts_forget_after_fork(void)
{
    memset(gpus, 0, sizeof gpus);
    for (int gpu = 0; gpu < NVSHARE_MAX_GPUS; gpu++)
        gpus[gpu].mutex = (pthread_mutex_t)RECURSIVE;
    atomic_fetch_add(&nvshare_context_generation, 1);
}
