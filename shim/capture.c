/*
 * Stream capture (CUDA graphs).  Work "launched" into a capturing stream only
 * records graph nodes, so a thread with an open capture passes the gate
 * without the lock; and while any capture is open a release (on the GPU's
 * worker) must not call cuCtxSynchronize (the driver refuses it during a capture in any mode
 * and invalidates the capture), so releases wait for captures to end (idle
 * releases are skipped, drops wait up to the agent's drop grace).
 *
 * Captures are kept by stream, with the thread that began them: a capture in
 * relaxed mode may be ended by another thread, and one in another mode ended
 * from the wrong thread ends too (with CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
 * as driver 580 does).  Either way the thread that began it is capturing no
 * more.  So is it when the driver ends the capture for it: destroying the
 * stream, or tearing down the stream's context, ends it (driver 580).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>

#include "capture.h"
#include "hooks.h"
#include "driver.h"

enum { CAPTURE_STATUS_NONE = 0 };
enum { CAPTURE_MODE_RELAXED = 2 };

/* More at once is no program's pattern; one past it is counted but not owned
 * by its thread (its launches then wait at the gate like any other). */
#define OPEN_CAPTURES 64

struct open_capture {
    int in_use;
    CUstream stream;
    CUcontext context;   /* the stream's */
    unsigned long owner; /* nvshare_thread_serial() of the thread that began it */
};

atomic_int nvshare_active_captures;
static pthread_mutex_t captures_mutex = PTHREAD_MUTEX_INITIALIZER;
static struct open_capture open_captures[OPEN_CAPTURES];

/* Not pthread_self(): glibc gives an exited thread's pthread_t to the next
 * thread it starts, which would inherit a capture the first one left open and
 * pass the gate unlocked for good. */
static atomic_ulong next_thread_serial = 1;
static __thread unsigned long thread_serial;

unsigned long nvshare_thread_serial(void)
{
    if (thread_serial == 0)
        thread_serial = atomic_fetch_add(&next_thread_serial, 1);
    return thread_serial;
}

CUstream nvshare_actual_stream(CUstream stream, int per_thread)
{
    return stream == NULL && per_thread ? NVSHARE_CU_STREAM_PER_THREAD : stream;
}

int nvshare_stream_may_record(CUstream stream)
{
    int capturing = 0;
    return nvshare_driver.stream_is_capturing == NULL ||
           (nvshare_driver.stream_is_capturing(stream, &capturing) == CUDA_SUCCESS && !capturing);
}

int nvshare_thread_capture_open_slow(void)
{
    unsigned long self = nvshare_thread_serial();
    int open = 0;
    pthread_mutex_lock(&captures_mutex);
    for (int i = 0; i < OPEN_CAPTURES && !open; i++)
        open = open_captures[i].in_use && open_captures[i].owner == self;
    pthread_mutex_unlock(&captures_mutex);
    return open;
}

static int stream_capturing(CUstream stream);

int nvshare_capture_takes_slow(CUstream stream, int per_thread)
{
    if (nvshare_thread_capture_open_slow())
        return 1;
    stream = nvshare_actual_stream(stream, per_thread);
    if (stream == NULL || stream == NVSHARE_CU_STREAM_LEGACY)
        return 0; /* the legacy stream is never captured */
    int saved_errno = errno;
    int capturing = stream_capturing(stream);
    errno = saved_errno;
    return capturing;
}

int nvshare_capture_relax(void)
{
    int mode = CAPTURE_MODE_RELAXED;
    if (nvshare_driver.thread_exchange_capture_mode == NULL ||
        nvshare_driver.thread_exchange_capture_mode(&mode) != CUDA_SUCCESS)
        return -1;
    return mode;
}

void nvshare_capture_restore(int previous_mode)
{
    if (previous_mode >= 0 && previous_mode != CAPTURE_MODE_RELAXED)
        nvshare_driver.thread_exchange_capture_mode(&previous_mode);
}

static CUcontext context_of(CUstream stream)
{
    CUcontext context = NULL;
    if (stream != NVSHARE_CU_STREAM_PER_THREAD && nvshare_driver.stream_get_ctx != NULL &&
        nvshare_driver.stream_get_ctx(stream, &context) == CUDA_SUCCESS)
        return context;
    if (nvshare_driver.ctx_get_current == NULL ||
        nvshare_driver.ctx_get_current(&context) != CUDA_SUCCESS)
        context = NULL;
    return context;
}

static CUresult began(CUresult result, CUstream stream, int per_thread)
{
    if (result != CUDA_SUCCESS)
        return result;
    int saved_errno = errno;
    stream = nvshare_actual_stream(stream, per_thread);
    CUcontext context = context_of(stream);
    pthread_mutex_lock(&captures_mutex);
    for (int i = 0; i < OPEN_CAPTURES; i++) {
        if (!open_captures[i].in_use) {
            open_captures[i] = (struct open_capture){.in_use = 1,
                                                     .stream = stream,
                                                     .context = context,
                                                     .owner = nvshare_thread_serial()};
            break;
        }
    }
    atomic_fetch_add(&nvshare_active_captures, 1);
    pthread_mutex_unlock(&captures_mutex);
    errno = saved_errno;
    return result;
}

/* Called with captures_mutex held. */
static void forget(struct open_capture *capture)
{
    capture->in_use = 0;
    if (atomic_load(&nvshare_active_captures) > 0)
        atomic_fetch_sub(&nvshare_active_captures, 1);
}

/* The per-thread default stream is one handle for every thread's own stream:
 * only its owner can name (and end) a capture of it. */
static void ended(CUstream stream)
{
    unsigned long self = nvshare_thread_serial();
    pthread_mutex_lock(&captures_mutex);
    struct open_capture *found = NULL;
    for (int i = 0; i < OPEN_CAPTURES && found == NULL; i++) {
        struct open_capture *capture = &open_captures[i];
        if (capture->in_use && capture->stream == stream &&
            (stream != NVSHARE_CU_STREAM_PER_THREAD || capture->owner == self))
            found = capture;
    }
    if (found != NULL)
        forget(found);
    else if (atomic_load(&nvshare_active_captures) > 0)
        atomic_fetch_sub(&nvshare_active_captures, 1); /* one past OPEN_CAPTURES */
    pthread_mutex_unlock(&captures_mutex);
}

CUresult nvshare_capture_destroy_stream(CUstream stream, cuStreamDestroy_v2_fn destroy)
{
    if (atomic_load(&nvshare_active_captures) == 0)
        return destroy(stream);
    pthread_mutex_lock(&captures_mutex);
    CUresult result = destroy(stream);
    for (int i = 0; result == CUDA_SUCCESS && i < OPEN_CAPTURES; i++) {
        if (open_captures[i].in_use && open_captures[i].stream == stream)
            forget(&open_captures[i]);
    }
    pthread_mutex_unlock(&captures_mutex);
    return result;
}

void nvshare_capture_forget_context(CUcontext context)
{
    pthread_mutex_lock(&captures_mutex);
    for (int i = 0; i < OPEN_CAPTURES; i++) {
        if (open_captures[i].in_use && open_captures[i].context == context)
            forget(&open_captures[i]);
    }
    pthread_mutex_unlock(&captures_mutex);
}

#define BEGIN_CAPTURE(name, params, args)                                \
    NVSHARE_EXPORT CUresult name params                                  \
    {                                                                    \
        NVSHARE_REAL_OR_RETURN(name, real);                              \
        return began(real args, hStream, NVSHARE_HOOK_PER_THREAD(name)); \
    }

#define TO_GRAPH_PARAMS                                                 \
    (CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies, \
     const void *dependencyData, size_t numDependencies, int mode)
#define TO_GRAPH_ARGS (hStream, hGraph, dependencies, dependencyData, numDependencies, mode)

BEGIN_CAPTURE(cuStreamBeginCapture, (CUstream hStream), (hStream))
BEGIN_CAPTURE(cuStreamBeginCapture_ptsz, (CUstream hStream), (hStream))
BEGIN_CAPTURE(cuStreamBeginCapture_v2, (CUstream hStream, int mode), (hStream, mode))
BEGIN_CAPTURE(cuStreamBeginCapture_v2_ptsz, (CUstream hStream, int mode), (hStream, mode))
BEGIN_CAPTURE(cuStreamBeginCaptureToGraph, TO_GRAPH_PARAMS, TO_GRAPH_ARGS)
BEGIN_CAPTURE(cuStreamBeginCaptureToGraph_ptsz, TO_GRAPH_PARAMS, TO_GRAPH_ARGS)

static int stream_capturing(CUstream stream)
{
    int status = CAPTURE_STATUS_NONE;
    if (nvshare_driver.stream_is_capturing != NULL &&
        nvshare_driver.stream_is_capturing(stream, &status) != CUDA_SUCCESS)
        status = CAPTURE_STATUS_NONE;
    return status != CAPTURE_STATUS_NONE;
}

/* Whatever the call returns (an invalidated capture ends with an error, one
 * ended from the wrong thread too), what counts is whether the stream was
 * capturing before the call and is not after it. */
static CUresult end_capture(CUstream stream, CUgraph *graph, int per_thread,
                            cuStreamEndCapture_fn real)
{
    CUstream actual = nvshare_actual_stream(stream, per_thread);
    int saved_errno = errno;
    int was_capturing = stream_capturing(actual);
    errno = saved_errno;
    CUresult result = real(stream, graph);
    saved_errno = errno;
    if (was_capturing && !stream_capturing(actual))
        ended(actual);
    errno = saved_errno;
    return result;
}

NVSHARE_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    NVSHARE_REAL_OR_RETURN(cuStreamEndCapture, real);
    return end_capture(hStream, phGraph, NVSHARE_HOOK_PER_THREAD(cuStreamEndCapture), real);
}

NVSHARE_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    NVSHARE_REAL_OR_RETURN(cuStreamEndCapture_ptsz, real);
    return end_capture(hStream, phGraph, NVSHARE_HOOK_PER_THREAD(cuStreamEndCapture_ptsz), real);
}

void nvshare_capture_forget_after_fork(void)
{
    captures_mutex = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    for (int i = 0; i < OPEN_CAPTURES; i++)
        open_captures[i].in_use = 0;
    atomic_store(&nvshare_active_captures, 0);
}
