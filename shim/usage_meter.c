/*
 * GPU time, as the agent schedules by it (docs/scheduling.md, "Use").  Lease
 * tenure is no measure: an inference server answering 20 requests a second
 * holds its lease all the time and keeps the GPU busy 2 % of it.
 *
 * Every SAMPLE_MS, while a GPU's gate is open (or work is still queued after it
 * closed), the client thread asks whether this process had work on that GPU
 * since the last sample: a gated call passed (a launch, a copy), a thread is
 * inside one (a synchronous copy), or one of the queue bound's marks has not
 * completed (kernels still running; queue_bound.c records a mark at the first
 * launch after the GPU ran dry, so a single long kernel is covered), or the
 * launches after the newest mark should still be running by the queue's own
 * estimate of a launch's GPU time.  Such a sample counts its whole interval as
 * busy.  A 1 ms request every 50 ms reads ~2-4 %, a trainer ~100 %.  The error
 * is one interval per burst, and what that estimate gets wrong of the launches
 * after the newest mark: over by at most a window of the queue bound (an eighth
 * of it), under where they run longer than the average launch.
 *
 * A launch pays one relaxed store for this (how many launches since the newest
 * mark); the hooks already count their passages, and the marks were there for
 * the queue bound.
 */
#define _GNU_SOURCE
#include "usage_meter.h"

#include <stdatomic.h>

#include "devices.h"
#include "lock_state.h"
#include "nvshare_protocol.h"
#include "queue_bound.h"

#define SAMPLE_MS 1.0
/* A sample far later than due (the thread was held up) counts only this much:
 * a stall of the client thread is not GPU time. */
#define LONGEST_SAMPLE_MS 5.0
#define USAGE_REPORT_MS   100.0

struct gpu_usage {
    unsigned seen_activity;
    double sampled_at_ms; /* 0: not sampling */
    double busy_ms;
    uint64_t reported_us;
    double reported_at_ms;
};

/* The client thread's alone. */
static struct gpu_usage usage[NVSHARE_MAX_GPUS];

static int had_work(int gpu, struct gpu_usage *meter, double now_ms)
{
    struct nvshare_gate *gate = &nvshare_gates[gpu];
    unsigned activity = atomic_load_explicit(&gate->activity, memory_order_relaxed);
    int passed = activity != meter->seen_activity;
    meter->seen_activity = activity;
    return passed || atomic_load(&gate->inflight) != 0 ||
           nvshare_queue_work_pending_now(gpu, now_ms);
}

int nvshare_usage_sample(double now_ms)
{
    int next = -1;
    for (int gpu = 0; gpu < nvshare_gpu_count(); gpu++) {
        struct gpu_usage *meter = &usage[gpu];
        int open = atomic_load(&nvshare_gates[gpu].open);
        if (!open && meter->sampled_at_ms == 0)
            continue;
        if (meter->sampled_at_ms == 0) { /* the gate just opened: measure from now */
            meter->sampled_at_ms = now_ms;
            meter->seen_activity = atomic_load(&nvshare_gates[gpu].activity);
            next = 0;
            continue;
        }
        double interval = now_ms - meter->sampled_at_ms;
        if (interval < SAMPLE_MS) {
            int wait = (int)(SAMPLE_MS - interval) + 1;
            next = next < 0 || wait < next ? wait : next;
            continue;
        }
        int busy = had_work(gpu, meter, now_ms);
        if (busy)
            meter->busy_ms += interval < LONGEST_SAMPLE_MS ? interval : LONGEST_SAMPLE_MS;
        meter->sampled_at_ms = open || busy ? now_ms : 0; /* closed and done: stop */
        if (meter->sampled_at_ms != 0)
            next = next < 0 || (int)SAMPLE_MS < next ? (int)SAMPLE_MS : next;
    }
    return next;
}

int nvshare_usage_take_report(int gpu, double now_ms, int force, uint64_t *busy_us)
{
    struct gpu_usage *meter = &usage[gpu];
    uint64_t total = (uint64_t)(meter->busy_ms * 1000.0);
    if (total == meter->reported_us || (!force && now_ms - meter->reported_at_ms < USAGE_REPORT_MS))
        return 0;
    meter->reported_us = total;
    meter->reported_at_ms = now_ms;
    *busy_us = total;
    return 1;
}

void nvshare_usage_reset(void)
{
    for (int gpu = 0; gpu < NVSHARE_MAX_GPUS; gpu++)
        usage[gpu] = (struct gpu_usage){0};
}
