/* Open stream captures (capture.c). */
#ifndef NVSHARE_CAPTURE_H
#define NVSHARE_CAPTURE_H

#include <stdatomic.h>

/* Captures open in this process, and in the calling thread. */
extern atomic_int nvshare_active_captures;
extern __thread int nvshare_thread_capture_depth;

void nvshare_capture_forget_after_fork(void);

#endif
