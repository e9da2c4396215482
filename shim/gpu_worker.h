/* Each GPU's worker thread: a grant's prefetch, a release's drain (gpu_worker.c). */
#ifndef NVSHARE_GPU_WORKER_H
#define NVSHARE_GPU_WORKER_H

/* The client thread, after a step posted work for gpu (NVSHARE_JOB_POST_WORK):
 * starts gpu's worker at its first work; where no thread can be started,
 * carries the work out itself, now. */
void nvshare_worker_post(int gpu);

/* In a forked child: the parent's workers are not there. */
void nvshare_workers_forget_after_fork(void);

#endif
