/* What shim/fair_share.c needs from the rest of the shim, for test_fair_look.py: the gates
 * (lock_state.c's), a silent debug log, and a clock the test sets (the file is built with
 * -Dclock_gettime=stub_clock_gettime); and two helpers cffi calls. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "fair_share.h"
#include "lock_state.h"

struct nvshare_gate nvshare_gates[NVSHARE_MAX_GPUS];
static uint64_t now_ns = 1000000000000u;

void nvshare_debug(const char *fmt, ...)
{
    (void)fmt;
}

/* Built as stub_clock_gettime, as fair_share.c's calls are (-D). */
int clock_gettime(clockid_t clock, struct timespec *now)
{
    (void)clock;
    now->tv_sec = (time_t)(now_ns / 1000000000u);
    now->tv_nsec = (long)(now_ns % 1000000000u);
    return 0;
}

void stub_set_now_ns(uint64_t ns)
{
    now_ns = ns;
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
