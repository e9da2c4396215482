/* Allocation conversion and accounting (memory.c), as the client thread sees it. */
#ifndef NVSHARE_MEMORY_H
#define NVSHARE_MEMORY_H

#include <stdint.h>

#include "cuda_abi.h"

/* Totals of gpu for a MEMORY_REPORT; returns 1 when they changed since the
 * last call (reports are coalesced: many allocations, one frame). */
int nvshare_memory_take_report(int gpu, uint64_t *managed_bytes, uint64_t *unmanaged_bytes);

/* After (re)connecting: report every GPU again. */
void nvshare_memory_mark_all_changed(void);

/* On a grant: bring this process's managed allocations on gpu back to it in
 * one batch (NVSHARE_PREFETCH).  Runs on the client thread, with one of the
 * process's contexts on gpu (its slot) current: nvshare_in_one_context. */
void nvshare_memory_prefetch(int gpu, int slot, void *unused);

/* The driver freed a context (contexts.c): drop its prefetch stream and the
 * allocations made in it, without touching them. */
void nvshare_memory_forget_context(int gpu, int slot);

/* In a forked child: drop the parent's bookkeeping without freeing or locking. */
void nvshare_memory_forget_after_fork(void);

#endif
