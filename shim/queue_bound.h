/* Bounded queue-ahead: keeps the GPU work a process has queued but not yet
 * run under NVSHARE_MAX_QUEUED_MS, so that a drop request is honoured fast
 * (the release waits for queued work to finish). */
#ifndef NVSHARE_QUEUE_BOUND_H
#define NVSHARE_QUEUE_BOUND_H

#include "cuda_abi.h"

/* Before a launch on gpu's stream (its gate open); returns the current context's
 * slot, or -1.  The first launch after the usage meter saw the GPU run dry records
 * the start of a burst here (usage_meter.c). */
int nvshare_queue_before_launch(int gpu, CUstream stream, int per_thread);

/* After a successful launch on gpu's stream; slot: what nvshare_queue_before_launch
 * returned; per_thread: the launching hook's row is a per-thread-stream variant
 * (hooks.h). */
void nvshare_queue_note_launch(int gpu, int slot, CUstream stream, int per_thread);

/* 1 while a mark recorded on gpu, in any context, has not completed: work
 * this process queued there still runs, or a thread waits in the bound for
 * it.  The idle release asks before it counts the GPU idle (gpu_worker.c). */
int nvshare_queue_work_pending(int gpu);
/* 1 while the newest mark on gpu, in any context, has not completed, or a worker
 * holds the contexts (it prefetches or drains); without waiting, and without the
 * usage meter's bookkeeping: the client thread's idle look asks (lock_client.c). */
int nvshare_queue_newest_pending(int gpu);
/* What the usage meter (on the client thread) sees of gpu's queues now, without
 * waiting. */
struct nvshare_queue_look {
    double now_ms;
    /* Work still runs: a mark pending, the launches after a completed mark by the
     * queue's estimate, or the contexts busy (a worker prefetching or draining). */
    int pending;
    int contexts;    /* contexts looked at; burst and burst_ms only where one */
    unsigned burst;  /* the current burst's number */
    double burst_ms; /* its GPU time, by its marks' timestamps; < 0: not known now */
};
void nvshare_queue_look(int gpu, double now_ms, struct nvshare_queue_look *look);

/* The driver freed the context of (gpu, slot): forget its events (contexts.c). */
void nvshare_queue_forget_context(int gpu, int slot);

/* In a forked child: forget the parent's events without touching them. */
void nvshare_queue_forget_after_fork(void);

#endif
