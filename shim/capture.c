/*
 * Stream capture (CUDA graphs).  Work "launched" into a capturing stream only
 * records graph nodes, so a capturing thread passes the gate without the
 * lock; and while any capture is open the client thread must not call
 * cuCtxSynchronize (unsupported during a cudaStreamCaptureModeGlobal capture:
 * it would invalidate the application's graph), so releases wait for the
 * capture to end (idle releases are skipped, drops wait up to the agent's
 * drop grace).
 */
#include <errno.h>

#include "capture.h"
#include "hooks.h"
#include "interpose.h"

enum { CAPTURE_STATUS_NONE = 0 };

atomic_int nvshare_active_captures;
__thread int nvshare_thread_capture_depth;

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

static CUresult began(CUresult result)
{
    if (result == CUDA_SUCCESS) {
        atomic_fetch_add(&nvshare_active_captures, 1);
        nvshare_thread_capture_depth++;
    }
    return result;
}

NVSHARE_EXPORT CUresult cuStreamBeginCapture(CUstream hStream)
{
    if (nvshare_resolve_driver() != 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    return began(NVSHARE_REAL(cuStreamBeginCapture, cuStreamBeginCapture_fn)(hStream));
}

NVSHARE_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream hStream)
{
    if (nvshare_resolve_driver() != 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    return began(NVSHARE_REAL(cuStreamBeginCapture_ptsz, cuStreamBeginCapture_fn)(hStream));
}

NVSHARE_EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, int mode)
{
    if (nvshare_resolve_driver() != 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    return began(NVSHARE_REAL(cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_fn)(hStream, mode));
}

NVSHARE_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, int mode)
{
    if (nvshare_resolve_driver() != 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    return began(
        NVSHARE_REAL(cuStreamBeginCapture_v2_ptsz, cuStreamBeginCapture_v2_fn)(hStream, mode));
}

NVSHARE_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                                    const CUgraphNode *dependencies,
                                                    const void *dependencyData,
                                                    size_t numDependencies, int mode)
{
    if (nvshare_resolve_driver() != 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    return began(NVSHARE_REAL(cuStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph_fn)(
        hStream, hGraph, dependencies, dependencyData, numDependencies, mode));
}

NVSHARE_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                         const CUgraphNode *dependencies,
                                                         const void *dependencyData,
                                                         size_t numDependencies, int mode)
{
    if (nvshare_resolve_driver() != 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    return began(NVSHARE_REAL(cuStreamBeginCaptureToGraph_ptsz, cuStreamBeginCaptureToGraph_fn)(
        hStream, hGraph, dependencies, dependencyData, numDependencies, mode));
}

/* Ending an invalidated capture also ends it (with an error), so what counts
 * is whether the stream was capturing before the call. */
static CUresult end_capture(CUstream stream, CUgraph *graph, int per_thread,
                            cuStreamEndCapture_fn real)
{
    if (nvshare_resolve_driver() != 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    int saved_errno = errno;
    int status = CAPTURE_STATUS_NONE;
    if (nvshare_driver.stream_is_capturing != NULL)
        nvshare_driver.stream_is_capturing(nvshare_actual_stream(stream, per_thread), &status);
    errno = saved_errno;
    CUresult result = real(stream, graph);
    if (status != CAPTURE_STATUS_NONE) {
        atomic_fetch_sub(&nvshare_active_captures, 1);
        if (nvshare_thread_capture_depth > 0)
            nvshare_thread_capture_depth--;
    }
    return result;
}

NVSHARE_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    return end_capture(hStream, phGraph, 0, NVSHARE_REAL(cuStreamEndCapture, cuStreamEndCapture_fn));
}

NVSHARE_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    return end_capture(hStream, phGraph, 1,
                       NVSHARE_REAL(cuStreamEndCapture_ptsz, cuStreamEndCapture_fn));
}

void nvshare_capture_forget_after_fork(void)
{
    atomic_store(&nvshare_active_captures, 0);
    nvshare_thread_capture_depth = 0;
}
