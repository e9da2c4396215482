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
 * That interval per burst was most of an inference server's figure (0.9 ms of
 * GPU work per request read 3.4 ms).  So once a burst's newest mark is done, the
 * samples it was counted by give way to its GPU time by timestamps (queue_bound.c:
 * from an event recorded before its first launch to that mark, plus the launches
 * after it); while marks are pending, and for a process with two contexts on the
 * GPU, the samples stand.  The total may then go down a little; reports never do.
 *
 * A launch pays one relaxed store for this (how many launches since the newest
 * mark) and one relaxed load (is a burst's start wanted?); the first launch of a
 * burst records the start.  The hooks already count their passages, and the marks
 * were there for the queue bound.
 */
#define _GNU_SOURCE
#include "usage_meter.h"

#include <stdatomic.h>

#include "devices.h"
#include "fair_share.h"
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
    unsigned burst;       /* the queue's burst that burst_counted_ms is of */
    int burst_done;       /* known and over: later looks are not its */
    double sampled_at_ms; /* 0: not sampling */
    double busy_ms;
    double burst_counted_ms; /* what busy_ms holds of that burst */
    uint64_t reported_us;
    double reported_at_ms;
};

/* The client thread's alone. */
static struct gpu_usage usage[NVSHARE_MAX_GPUS];

/* Counts a sample's interval (busy_ms, 0 if idle), then puts the burst's GPU time by
 * timestamps in place of what the looks counted of it, where it is known.  Looks the
 * burst cannot speak for count as they are: with two contexts or none looked at (a
 * worker handing the lease over), and once the burst is done (a copy, a memset after
 * it: no launch, so no new burst). */
static void count(struct gpu_usage *meter, const struct nvshare_queue_look *look, double busy_ms)
{
    meter->busy_ms += busy_ms;
    if (look->contexts != 1 || look->burst == 0)
        return;
    if (look->burst != meter->burst) {
        meter->burst = look->burst;
        meter->burst_counted_ms = 0;
        meter->burst_done = 0;
    }
    if (meter->burst_done)
        return;
    meter->burst_counted_ms += busy_ms;
    if (look->burst_ms >= 0) {
        meter->busy_ms += look->burst_ms - meter->burst_counted_ms;
        meter->burst_counted_ms = look->burst_ms;
        meter->burst_done = !look->pending; /* its tail by the estimate too */
    }
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
        struct nvshare_gate *gate = &nvshare_gates[gpu];
        unsigned activity = atomic_load_explicit(&gate->activity, memory_order_relaxed);
        int passed = activity != meter->seen_activity; /* a launch, a copy */
        meter->seen_activity = activity;
        int in_call = atomic_load(&gate->inflight) != 0; /* a synchronous copy waits there */
        struct nvshare_queue_look look;
        nvshare_queue_look(gpu, now_ms, &look);
        int busy = passed || in_call || look.pending;
        double busy_ms = !busy ? 0 : interval < LONGEST_SAMPLE_MS ? interval : LONGEST_SAMPLE_MS;
        count(meter, &look, busy_ms);
        nvshare_fair_look(gpu, open, busy, busy_ms);
        meter->sampled_at_ms = open || busy ? now_ms : 0; /* closed and done: stop */
        if (meter->sampled_at_ms != 0)
            next = next < 0 || (int)SAMPLE_MS < next ? (int)SAMPLE_MS : next;
    }
    return next;
}

int nvshare_usage_take_report(int gpu, double now_ms, int force, uint64_t *busy_us)
{
    struct gpu_usage *meter = &usage[gpu];
    uint64_t total = meter->busy_ms > 0 ? (uint64_t)(meter->busy_ms * 1000.0) : 0;
    if (total <= meter->reported_us || (!force && now_ms - meter->reported_at_ms < USAGE_REPORT_MS))
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
