/*
 * Stand-in driver: stream capture, with the rules driver 580 applied on the
 * H100 (probed there with two threads, 2026-11-23):
 *
 *  - Work submitted to a capturing stream is captured, not run; an ended
 *    capture gives a graph (which, like every graph here, runs as one spin).
 *  - "Potentially unsafe" calls (allocations and frees, stream-ordered ones
 *    included; event and stream queries and synchronisations; prefetches)
 *    fail with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidate the
 *    capture they conflict with: the caller's own capture unless it is
 *    relaxed, and, when the caller's thread mode is global, every other
 *    thread's capture begun in global mode.  A thread in relaxed mode
 *    (cuThreadExchangeStreamCaptureMode) may make them.
 *  - cuCtxSynchronize fails and invalidates every open capture, whatever
 *    the modes.
 *  - Only a relaxed capture may be ended by another thread; ending another
 *    one from the wrong thread fails with CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
 *    and ends it all the same.
 *  - Destroying a capturing stream ends its capture, and tearing down a
 *    context (destroy, primary reset, last primary release) ends the captures
 *    in it: afterwards cuCtxSynchronize succeeds.
 *
 * The per-thread default stream can be captured by its handle
 * CU_STREAM_PER_THREAD (or NULL through a _ptsz begin); work reaches the
 * capture only through that explicit handle.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>

#include "standin.h"

#define CAPTURES 16

struct capture {
    int in_use;
    int invalidated;
    CUstream stream;
    int mode;
    CUcontext ctx;       /* current when it began */
    unsigned long owner; /* thread_number() of the thread that began it */
    unsigned nodes;
};

static struct capture captures[CAPTURES]; /* guarded by standin_lock */
static __thread int thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

/* A thread's capture state lives with the thread (the driver's, like this
 * one's, in thread-local storage): a thread that gets an exited thread's
 * pthread_t owns none of its captures. */
static unsigned long thread_number(void)
{
    static unsigned long next = 1; /* guarded by standin_lock */
    static __thread unsigned long number;
    if (number == 0)
        number = next++;
    return number;
}

static struct capture *find(CUstream stream)
{
    for (int i = 0; i < CAPTURES; i++) {
        struct capture *c = &captures[i];
        if (c->in_use && c->stream == stream &&
            (stream != CU_STREAM_PER_THREAD || c->owner == thread_number()))
            return c;
    }
    return NULL;
}

static void invalidate(struct capture *c, const char *by)
{
    if (!c->invalidated)
        standin_log("@capture_invalidated", "stream=%p by=%s", (void *)c->stream, by);
    c->invalidated = 1;
}

int standin_capture_take(CUstream handle, CUresult *result)
{
    if (handle == NULL || handle == CU_STREAM_LEGACY)
        return 0;
    pthread_mutex_lock(&standin_lock);
    struct capture *c = find(handle);
    if (c != NULL) {
        c->nodes++;
        *result = c->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&standin_lock);
    return c != NULL;
}

CUresult standin_capture_check_unsafe(const char *function)
{
    if (thread_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_SUCCESS;
    CUresult result = CUDA_SUCCESS;
    pthread_mutex_lock(&standin_lock);
    unsigned long self = thread_number();
    for (int i = 0; i < CAPTURES; i++) {
        struct capture *c = &captures[i];
        if (!c->in_use)
            continue;
        int own = c->owner == self;
        if ((own && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
            (!own && thread_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
             c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
            invalidate(c, function);
            result = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    }
    pthread_mutex_unlock(&standin_lock);
    return result;
}

CUresult standin_capture_check_context_sync(const char *function)
{
    CUresult result = CUDA_SUCCESS;
    pthread_mutex_lock(&standin_lock);
    for (int i = 0; i < CAPTURES; i++) {
        if (captures[i].in_use) {
            invalidate(&captures[i], function);
            result = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    }
    pthread_mutex_unlock(&standin_lock);
    return result;
}

void standin_capture_end_where(CUstream handle, CUcontext ctx, const char *by)
{
    for (int i = 0; i < CAPTURES; i++) {
        struct capture *c = &captures[i];
        if (c->in_use && (handle != NULL ? c->stream == handle : c->ctx == ctx)) {
            standin_log("@capture_ended", "stream=%p by=%s", (void *)c->stream, by);
            c->in_use = 0;
        }
    }
}

void standin_capture_after_fork_child(void)
{
    for (int i = 0; i < CAPTURES; i++)
        captures[i].in_use = 0;
}

static CUresult begin(const char *function, CUstream handle, int per_thread, int mode)
{
    CUresult result = standin_require_ctx();
    if (handle == NULL && per_thread)
        handle = CU_STREAM_PER_THREAD;
    if (result == CUDA_SUCCESS && (handle == NULL || handle == CU_STREAM_LEGACY))
        result = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    else if (result == CUDA_SUCCESS && standin_stream(handle) == NULL)
        result = CUDA_ERROR_INVALID_HANDLE;
    else if (result == CUDA_SUCCESS &&
             (mode < CU_STREAM_CAPTURE_MODE_GLOBAL || mode > CU_STREAM_CAPTURE_MODE_RELAXED))
        result = CUDA_ERROR_INVALID_VALUE;
    if (result == CUDA_SUCCESS) {
        pthread_mutex_lock(&standin_lock);
        struct capture *slot = NULL;
        for (int i = 0; i < CAPTURES && slot == NULL; i++)
            slot = captures[i].in_use ? NULL : &captures[i];
        if (find(handle) != NULL)
            result = CUDA_ERROR_ILLEGAL_STATE;
        else if (slot == NULL)
            result = CUDA_ERROR_OUT_OF_MEMORY;
        else
            *slot = (struct capture){.in_use = 1,
                                     .stream = handle,
                                     .mode = mode,
                                     .ctx = standin_current_ctx(),
                                     .owner = thread_number()};
        pthread_mutex_unlock(&standin_lock);
    }
    standin_log(function, "stream=%p mode=%d result=%d", (void *)handle, mode, result);
    return result;
}

STANDIN_EXPORT CUresult cuStreamBeginCapture(CUstream s)
{
    return begin("cuStreamBeginCapture", s, 0, CU_STREAM_CAPTURE_MODE_GLOBAL);
}
STANDIN_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream s)
{
    return begin("cuStreamBeginCapture_ptsz", s, 1, CU_STREAM_CAPTURE_MODE_GLOBAL);
}
STANDIN_EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, int mode)
{
    return begin("cuStreamBeginCapture_v2", s, 0, mode);
}
STANDIN_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, int mode)
{
    return begin("cuStreamBeginCapture_v2_ptsz", s, 1, mode);
}

static CUresult end(const char *function, CUstream handle, int per_thread, CUgraph *graph)
{
    if (handle == NULL && per_thread)
        handle = CU_STREAM_PER_THREAD;
    CUresult result = CUDA_SUCCESS;
    unsigned nodes = 0;
    if (graph == NULL)
        result = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&standin_lock);
    struct capture *c = result == CUDA_SUCCESS ? find(handle) : NULL;
    if (result == CUDA_SUCCESS && c == NULL) {
        result = CUDA_ERROR_ILLEGAL_STATE;
    } else if (c != NULL) {
        nodes = c->nodes;
        if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && c->owner != thread_number())
            result = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
        else if (c->invalidated)
            result = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        c->in_use = 0;
    }
    pthread_mutex_unlock(&standin_lock);
    if (graph != NULL)
        *graph = NULL;
    if (result == CUDA_SUCCESS)
        result = cuGraphCreate(graph, 0);
    standin_log(function, "stream=%p nodes=%u result=%d", (void *)handle, nodes, result);
    return result;
}

STANDIN_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g)
{
    return end("cuStreamEndCapture", s, 0, g);
}
STANDIN_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g)
{
    return end("cuStreamEndCapture_ptsz", s, 1, g);
}

static CUresult is_capturing(const char *function, CUstream handle, int per_thread, int *status)
{
    if (status == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (handle == NULL && per_thread)
        handle = CU_STREAM_PER_THREAD;
    if (handle != NULL && handle != CU_STREAM_LEGACY && handle != CU_STREAM_PER_THREAD &&
        standin_stream(handle) == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&standin_lock);
    struct capture *c = find(handle);
    *status = c == NULL        ? CU_STREAM_CAPTURE_STATUS_NONE
              : c->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                               : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    pthread_mutex_unlock(&standin_lock);
    standin_log(function, "stream=%p status=%d", (void *)handle, *status);
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuStreamIsCapturing(CUstream s, int *status)
{
    return is_capturing("cuStreamIsCapturing", s, 0, status);
}
STANDIN_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream s, int *status)
{
    return is_capturing("cuStreamIsCapturing_ptsz", s, 1, status);
}

STANDIN_EXPORT CUresult cuThreadExchangeStreamCaptureMode(int *mode)
{
    if (mode == NULL || *mode < CU_STREAM_CAPTURE_MODE_GLOBAL ||
        *mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    int previous = thread_mode;
    thread_mode = *mode;
    *mode = previous;
    standin_log("cuThreadExchangeStreamCaptureMode", "mode=%d previous=%d", thread_mode, previous);
    return CUDA_SUCCESS;
}
