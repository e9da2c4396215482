/* The CUDA contexts this process submits work in, per GPU (contexts.c). */
#ifndef NVSHARE_CONTEXTS_H
#define NVSHARE_CONTEXTS_H

#include <stdatomic.h>

#include "cuda_abi.h"

/* Contexts tracked per GPU; a process rarely has more than one. */
#define NVSHARE_CONTEXT_SLOTS 8

/* context's slot on gpu, taking a free one at first sight; -1 when all are
 * taken (a release then cannot wait for that context's work: warned once). */
int nvshare_context_slot(int gpu, CUcontext context);

/* The GPU (device ordinal) of the calling thread's current context, or -1
 * when there is none (or the GPUs are not known yet: devices.c); *context
 * receives the context.  The first call in a context gives it a slot.  The
 * answer is cached per thread until the context or nvshare_context_generation
 * changes. */
int nvshare_current_gpu(CUcontext *context);

/* The slot of the context the calling thread's last nvshare_current_gpu
 * found (-1: none free). */
int nvshare_current_context_slot(void);

/* Calls fn with each tracked context of gpu pushed current in turn.  No
 * context can be destroyed meanwhile (its destroy waits). */
void nvshare_in_each_context(int gpu, void (*fn)(int gpu, int slot, void *arg), void *arg);
/* The same, unless another thread holds the GPU's contexts: then 0, nothing run. */
int nvshare_try_in_each_context(int gpu, void (*fn)(int gpu, int slot, void *arg), void *arg);

/* The same with one of them: the one that took its slot last.  0 when gpu
 * has none (or it could not be made current). */
int nvshare_in_one_context(int gpu, void (*fn)(int gpu, int slot, void *arg), void *arg);

/* ---- for tearing a context down (lifecycle.c) ----
 * The driver frees a context (cuCtxDestroy, a primary context's reset or last
 * release) between hold and let_go, and everything the shim kept for it is
 * forgotten there: no thread works in those GPUs' contexts meanwhile. */

/* Takes the mutexes of GPUs first..last, in order, with cancellation held
 * off; returns the cancel state for let_go. */
int nvshare_contexts_hold(int first, int last);
void nvshare_contexts_let_go(int first, int last, int cancel_state);
/* gpu's primary context, learnt from cuDevicePrimaryCtxRetain (NULL: not seen). */
void nvshare_contexts_set_primary(int gpu, CUcontext primary);
CUcontext nvshare_contexts_primary(int gpu); /* held */
/* The slots context has on gpu, one bit each (held). */
unsigned nvshare_contexts_slots_of(int gpu, CUcontext context);
/* Gives those slots up (held); the caller then bumps nvshare_context_generation. */
void nvshare_contexts_free_slots(int gpu, unsigned slots);

/* In a forked child: forget the parent's contexts without touching them. */
void nvshare_contexts_forget_after_fork(void);

#endif
