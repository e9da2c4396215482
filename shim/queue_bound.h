/* Bounded queue-ahead: keeps the GPU work a process has queued but not yet
 * run under NVSHARE_MAX_QUEUED_MS, so that a drop request is honoured fast
 * (the release waits for queued work to finish). */
#ifndef NVSHARE_QUEUE_BOUND_H
#define NVSHARE_QUEUE_BOUND_H

#include "cuda_abi.h"

/* After a successful launch on gpu's stream; per_thread: the launching hook's
 * row is a per-thread-stream variant (hooks.h). */
void nvshare_queue_note_launch(int gpu, CUstream stream, int per_thread);

/* 1 while a mark recorded on gpu, in any context, has not completed: work
 * this process queued there still runs, or a thread waits in the bound for
 * it.  The idle release asks before it counts the GPU idle (gpu_worker.c). */
int nvshare_queue_work_pending(int gpu);
/* The same without waiting, for the usage meter on the client thread: 1 also when
 * the GPU's contexts are busy (a worker prefetching or draining), and while the
 * launches after a completed mark should still run by the queue's estimate. */
int nvshare_queue_work_pending_now(int gpu, double now_ms);

/* The driver freed the context of (gpu, slot): forget its events (contexts.c). */
void nvshare_queue_forget_context(int gpu, int slot);

/* In a forked child: forget the parent's events without touching them. */
void nvshare_queue_forget_after_fork(void);

#endif
