/*
 * Passing the per-GPU gate: the fast path of the lock, inlined into every
 * GATED hook (hooks.c).  The gate itself, and why inflight is raised before
 * open is read, are in lock_state.h; the slow path (asking for the lock and
 * waiting) is nvshare_lock_wait_for_gate.
 */
#ifndef NVSHARE_GATE_H
#define NVSHARE_GATE_H

#include <stdatomic.h>

#include "capture.h"
#include "contexts.h"
#include "cuda_abi.h"
#include "fair_share.h"
#include "lifecycle.h"
#include "lock_state.h"

/* stream: the one the call goes to (NULL for none or the default stream);
 * per_thread: the calling hook's row is a per-thread-stream variant (hooks.h). */
static inline struct nvshare_gate *nvshare_gate_enter(CUstream stream, int per_thread)
{
    if (nvshare_capture_takes(stream, per_thread))
        return 0; /* capturing: calls record graph nodes, nothing runs */
    if (!atomic_load_explicit(&nvshare_client_running, memory_order_acquire)) {
        nvshare_client_start();
        if (!atomic_load_explicit(&nvshare_client_running, memory_order_acquire))
            return 0; /* no usable driver yet: the call fails in the driver as it would */
    }
    CUcontext context;
    int gpu = nvshare_current_gpu(&context);
    if (gpu < 0)
        return 0; /* no context: the driver reports the error itself */
    struct nvshare_gate *gate = &nvshare_gates[gpu];
    int waited_in_hold = 0;
    for (;;) {
        atomic_fetch_add(&gate->inflight, 1);
        if (atomic_load(&gate->open)) {
            /* Held (fair_share.c): wait once, outside the gate, then go on. */
            if (waited_in_hold || !atomic_load_explicit(&gate->held, memory_order_relaxed))
                break;
            atomic_fetch_sub(&gate->inflight, 1);
            nvshare_fair_wait(gpu);
            waited_in_hold = 1;
            continue;
        }
        atomic_fetch_sub(&gate->inflight, 1);
        nvshare_lock_wait_for_gate(gpu);
    }
    /* Approximate on purpose (no lock prefix): the idle look only asks "did
     * it change?". */
    atomic_store_explicit(&gate->activity,
                          atomic_load_explicit(&gate->activity, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    return gate;
}

static inline void nvshare_gate_leave(struct nvshare_gate *gate)
{
    if (gate)
        atomic_fetch_sub_explicit(&gate->inflight, 1, memory_order_release);
}

#endif
