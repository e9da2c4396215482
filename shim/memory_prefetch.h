/* A grant's bulk prefetch (memory_prefetch.c). */
#ifndef NVSHARE_MEMORY_PREFETCH_H
#define NVSHARE_MEMORY_PREFETCH_H

/* On a grant: bring this process's managed allocations on gpu back to it in
 * one batch (NVSHARE_PREFETCH).  Runs on the GPU's worker, with one of the
 * process's contexts on gpu (its slot) current: nvshare_in_one_context. */
void nvshare_memory_prefetch(int gpu, int slot, void *unused);

/* The driver freed the context of (gpu, slot): its prefetch streams with it. */
void nvshare_prefetch_forget_context(int gpu, int slot);

/* In a forked child: forget the parent's streams without touching them. */
void nvshare_prefetch_forget_after_fork(void);

#endif
