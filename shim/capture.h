/* Open stream captures (capture.c). */
#ifndef NVSHARE_CAPTURE_H
#define NVSHARE_CAPTURE_H

#include <stdatomic.h>

#include "cuda_abi.h"

/* Captures open in this process (read on every gated call: 0 almost always). */
extern atomic_int nvshare_active_captures;

int nvshare_thread_capture_open_slow(void);
int nvshare_capture_takes_slow(CUstream stream, int per_thread);

/* 1 when a capture the calling thread began is still open.  A thread sees its
 * own begin. */
static inline int nvshare_thread_capture_open(void)
{
    return atomic_load_explicit(&nvshare_active_captures, memory_order_acquire) != 0 &&
           nvshare_thread_capture_open_slow();
}

/* 1 when a call on stream (by a hook whose row says per_thread) only adds to a graph:
 * the calling thread has a capture open, or stream is capturing (another
 * thread's capture, in relaxed mode or joined through an event).  On every
 * gated call: one load while no capture is open. */
static inline int nvshare_capture_takes(CUstream stream, int per_thread)
{
    return atomic_load_explicit(&nvshare_active_captures, memory_order_acquire) != 0 &&
           nvshare_capture_takes_slow(stream, per_thread);
}

void nvshare_capture_forget_after_fork(void);

/* Destroys the stream; the driver ends a capture of it.  The captures' lock is
 * held across the destroy, so a new stream given the same handle cannot
 * begin a capture that would then be taken for the old one's. */
CUresult nvshare_capture_destroy_stream(CUstream stream, cuStreamDestroy_v2_fn destroy);
/* The driver has freed context, and with it its streams' captures. */
void nvshare_capture_forget_context(CUcontext context);

/* The calling thread's number, never given to another thread of the process
 * (a pthread_t is reused once its thread has exited). */
unsigned long nvshare_thread_serial(void);

/* The stream a call names: per-thread-stream (_ptsz) variants name the
 * calling thread's default stream by NULL. */
CUstream nvshare_actual_stream(CUstream stream, int per_thread);

/* 1 when the shim may record an event into stream: it is known not to be
 * capturing (a record there would add a node to the application's graph). */
int nvshare_stream_may_record(CUstream stream);

/* The shim's own waits and queries (its marks' events, prefetches) made from
 * a thread in global capture mode would invalidate a capture another thread
 * has open in global mode.  Relaxed makes the driver allow them; the value
 * returned gives the thread's mode back to nvshare_capture_restore. */
int nvshare_capture_relax(void);
void nvshare_capture_restore(int previous_mode);

#endif
