/*
 * A grant's prefetch and a release's drain wait for the GPU: seconds for a
 * large working set or a long kernel.  Each GPU's wait runs on a worker
 * thread of that GPU, started at its first transition, so the client thread
 * goes on serving the process's other GPUs meanwhile (their grants, drops and
 * requests).  The socket stays the client thread's: a worker that has
 * drained its GPU says so to its lock machine, and the client thread sends
 * RELEASED.
 *
 * A worker only carries out what its GPU's lock machine (lock_machine.c)
 * decided, and tells it what it found: the prefetch is done, the GPU turned
 * out busy, the GPU is drained.  Each piece of work carries the ticket it was
 * posted with, and the machine drops results for work it no longer has.
 */
#define _GNU_SOURCE
#include "gpu_worker.h"

#include <stdint.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <time.h>

#include "capture.h"
#include "contexts.h"
#include "driver.h"
#include "lock_machine.h"
#include "lock_state.h"
#include "log.h"
#include "memory_prefetch.h"
#include "nvshare_protocol.h"
#include "queue_bound.h"
#include "shim_threads.h"

enum release_reason { RELEASE_IDLE, RELEASE_DROP };

/* A context with no work synchronises in microseconds; one that takes longer
 * than this had work to finish: the process was not idle. */
#define IDLE_PROBE_BUSY_MS 2.0

static int started[NVSHARE_MAX_GPUS]; /* the client thread's */

static int has_job(const struct nvshare_lock_jobs *jobs, int kind)
{
    for (int i = 0; i < jobs->count; i++)
        if (jobs->job[i].kind == kind)
            return 1;
    return 0;
}

/* An idle release found the GPU busy after all.  Returns 1 when it goes on
 * as a drop instead (one came meanwhile). */
static int busy_after_all(int gpu, uint32_t ticket, int gate_closed)
{
    struct nvshare_lock_event busy = {
        .kind = NVSHARE_EVENT_BUSY_AFTER_ALL, .ticket = ticket, .gate_closed = gate_closed};
    struct nvshare_lock_jobs jobs;
    nvshare_lock_step(gpu, &busy, &jobs, NULL);
    return has_job(&jobs, NVSHARE_JOB_DRAIN);
}

/* The driver refuses cuCtxSynchronize during a capture of any mode, from any
 * thread, and invalidates the capture (capture.c).  Wait for it to end, but
 * not past the agent's drop grace: by then the lock is revoked anyway. */
static void wait_for_captures_to_end(void)
{
    struct nvshare_settings settings;
    double grace_ms =
        nvshare_lock_settings(&settings) ? settings.drop_grace_ms : NVSHARE_DEFAULT_DROP_GRACE_MS;
    double deadline = nvshare_now_ms() + grace_ms;
    while (atomic_load(&nvshare_active_captures) > 0 && nvshare_now_ms() < deadline) {
        struct timespec pause = {.tv_nsec = 1000000};
        nanosleep(&pause, NULL);
    }
}

static void synchronize_context(int gpu, int slot, void *unused)
{
    (void)gpu, (void)slot, (void)unused;
    nvshare_driver.ctx_synchronize();
}

/* Close the gate, let submissions in progress leave it, wait for the GPU to
 * finish what was submitted, then tell the machine it is drained.  Runs on
 * the GPU's worker (never an application thread: no application launch ever
 * synchronises). */
static void drain(int gpu, enum release_reason reason, uint32_t ticket)
{
    struct nvshare_gate *gate = &nvshare_gates[gpu];
    double started_ms = nvshare_now_ms();

    /* No passage, but the GPU still runs what was queued (a thread may be
     * waiting for it in the queue bound, making no passage meanwhile): not
     * idle yet.  The idle time counts from when that work is done. */
    if (reason == RELEASE_IDLE && nvshare_queue_work_pending(gpu)) {
        if (!busy_after_all(gpu, ticket, 0))
            return;
        reason = RELEASE_DROP;
    }
    /* The marks do not cover everything: the launches after a thread's last mark,
     * copies, work of streams that no launch marked.  A thread waiting for such work
     * (PyTorch's loss.item() at the end of a step) makes no passage for as long as
     * it runs, which a short idle wait (a WHEN_IDLE drop, 50 ms) took for idle: a
     * trainer gave its turn away mid-step.  So ask the GPU: a context that takes more
     * than a moment to synchronise, gate still open, was busy. */
    if (reason == RELEASE_IDLE && atomic_load(&nvshare_active_captures) == 0) {
        double probe_started_ms = nvshare_now_ms();
        nvshare_in_each_context(gpu, synchronize_context, NULL);
        if (nvshare_now_ms() - probe_started_ms > IDLE_PROBE_BUSY_MS) {
            if (!busy_after_all(gpu, ticket, 0))
                return;
            reason = RELEASE_DROP;
        }
    }
    struct nvshare_lock_event close = {.kind = NVSHARE_EVENT_CLOSE_FOR_DRAIN, .ticket = ticket};
    struct nvshare_lock_jobs jobs;
    nvshare_lock_step(gpu, &close, &jobs, NULL);
    if (jobs.stale)
        return;
    unsigned idle_activity = jobs.seen_activity;

    for (unsigned spins = 0; atomic_load(&gate->inflight) != 0; spins++) {
        struct timespec pause = {.tv_nsec = spins < 100 ? 20000 : 1000000};
        nanosleep(&pause, NULL);
    }
    /* A launch got in just before the gate closed (not idle after all), or
     * a capture is open (its end would be waited for). */
    if (reason == RELEASE_IDLE && (atomic_load(&gate->activity) != idle_activity ||
                                   atomic_load(&nvshare_active_captures) > 0)) {
        if (!busy_after_all(gpu, ticket, 1))
            return;
        reason = RELEASE_DROP;
    }
    wait_for_captures_to_end();
    nvshare_in_each_context(gpu, synchronize_context, NULL);

    struct nvshare_lock_event drained = {.kind = NVSHARE_EVENT_DRAINED, .ticket = ticket};
    struct nvshare_lock_machine before;
    nvshare_lock_step(gpu, &drained, &jobs, &before);
    if (jobs.stale)
        return;
    nvshare_debug("release gpu=%d lease=%llu reason=%s held_ms=%.1f drain_ms=%.2f idle_ms=%u", gpu,
                  (unsigned long long)before.lease, reason == RELEASE_IDLE ? "idle" : "drop",
                  drained.now_ms - before.granted_at_ms, drained.now_ms - started_ms,
                  before.released_idle_ms);
}

static void prefetch_then_open(int gpu, uint32_t ticket)
{
    nvshare_in_one_context(gpu, nvshare_memory_prefetch, NULL);
    struct nvshare_lock_event prefetched = {.kind = NVSHARE_EVENT_PREFETCHED, .ticket = ticket};
    struct nvshare_lock_jobs jobs;
    struct nvshare_lock_machine before;
    nvshare_lock_step(gpu, &prefetched, &jobs, &before);
    int drop = has_job(&jobs, NVSHARE_JOB_DRAIN);
    if (!jobs.stale)
        nvshare_debug("gate gpu=%d lease=%llu %s ms_after_grant=%.2f", gpu,
                      (unsigned long long)before.lease, drop ? "stays closed for a drop" : "open",
                      prefetched.now_ms - before.granted_at_ms);
    if (drop)
        drain(gpu, RELEASE_DROP, ticket);
}

static void run(int gpu, int work, uint32_t ticket)
{
    if (work == NVSHARE_WORK_PREFETCH)
        prefetch_then_open(gpu, ticket);
    else
        drain(gpu, work == NVSHARE_WORK_RELEASE_IDLE ? RELEASE_IDLE : RELEASE_DROP, ticket);
}

static void *worker_main(void *argument)
{
    int gpu = (int)(intptr_t)argument;
    char name[16];
    snprintf(name, sizeof name, "nvshare-gpu%d", gpu);
    prctl(PR_SET_NAME, name, 0, 0, 0);
    /* Its driver calls are the shim's own (prefetches, synchronisations):
     * none may invalidate an application's capture. */
    nvshare_capture_relax();
    for (;;) {
        int work;
        uint32_t ticket;
        nvshare_lock_wait_for_work(gpu, &work, &ticket);
        run(gpu, work, ticket);
    }
    return NULL;
}

void nvshare_worker_post(int gpu)
{
    if (!started[gpu] && nvshare_start_shim_thread(worker_main, (void *)(intptr_t)gpu) == 0)
        started[gpu] = 1;
    if (started[gpu])
        return; /* the step woke it, or it finds the work when it starts */
    NVSHARE_WARN_ONCE(
        "cannot start a GPU worker thread: lock transitions wait on the client thread");
    int work;
    uint32_t ticket;
    if (nvshare_lock_take_work(gpu, &work, &ticket))
        run(gpu, work, ticket);
}

void nvshare_workers_forget_after_fork(void)
{
    for (int gpu = 0; gpu < NVSHARE_MAX_GPUS; gpu++)
        started[gpu] = 0;
}
