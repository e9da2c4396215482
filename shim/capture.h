/* Open stream captures (capture.c). */
#ifndef NVSHARE_CAPTURE_H
#define NVSHARE_CAPTURE_H

#include <stdatomic.h>

#include "cuda_abi.h"

/* Captures open in this process, and in the calling thread. */
extern atomic_int nvshare_active_captures;
extern __thread int nvshare_thread_capture_depth;

void nvshare_capture_forget_after_fork(void);

/* The stream a call names: per-thread-stream (_ptsz) variants name the
 * calling thread's default stream by NULL. */
CUstream nvshare_actual_stream(CUstream stream, int per_thread);

/* 1 when the shim may record an event into stream: it is known not to be
 * capturing (a record there would add a node to the application's graph). */
int nvshare_stream_may_record(CUstream stream);

#endif
