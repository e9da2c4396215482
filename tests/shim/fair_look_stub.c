/* What shim/fair_share.c needs from the rest of the shim, for test_fair_look.py: the gates
 * (lock_state.c's) and a silent debug log; and two helpers cffi calls. */
#include <stdarg.h>
#include <stdatomic.h>

#include "fair_share.h"
#include "lock_state.h"

struct nvshare_gate nvshare_gates[NVSHARE_MAX_GPUS];

void nvshare_debug(const char *fmt, ...)
{
    (void)fmt;
}

void stub_attach(int gpu, unsigned slot, int fd)
{
    struct nvshare_fair_slot frame = {.slot = slot, .weight = 1};
    nvshare_fair_attach(gpu, &frame, fd);
}

int stub_held(int gpu)
{
    return atomic_load(&nvshare_gates[gpu].held);
}
