/*
 * The GATED hooks, generated from the table in hooks.h.
 */
#include "hooks.h"

#include <stddef.h>

#include "driver.h"
#include "gate.h"
#include "queue_bound.h"

/* errno: the gate's slow path saves and restores it itself; the driver's own
 * errno changes reach the caller untouched.  stream is the call's stream
 * (from the signature), per_thread and launch the row's columns. */
#define DEFINE_GATED_HOOK(name, params, args, stream, per_thread, launch)                     \
    NVSHARE_EXPORT CUresult name params                                                       \
    {                                                                                         \
        NVSHARE_REAL_OR_RETURN(name, real);                                                   \
        struct nvshare_gate *gate = nvshare_gate_enter((stream), (per_thread));               \
        int gpu = gate ? (int)(gate - nvshare_gates) : -1;                                    \
        int slot =                                                                            \
            (launch) && gate ? nvshare_queue_before_launch(gpu, (stream), (per_thread)) : -1; \
        CUresult result = real args;                                                          \
        nvshare_gate_leave(gate);                                                             \
        if ((launch) && gate && result == CUDA_SUCCESS)                                       \
            nvshare_queue_note_launch(gpu, slot, (stream), (per_thread));                     \
        return result;                                                                        \
    }
#define GATED_HOOK(name, signature, stream, launch) \
    DEFINE_GATED_HOOK(name, signature, NVSHARE_STREAM_##stream, NVSHARE_GATED_##launch)
#define NOT_GATED(name, kind, stream, prototype)
NVSHARE_HOOK_TABLE(GATED_HOOK, NOT_GATED)
#undef NOT_GATED
