/* Test client for stream capture beside other threads' work, linked to libcuda
 * (-lcuda).  The stand-in enforces the capture rules driver 580 applies
 * (standin_capture.c).
 *
 *   client_capture beside LAUNCHES
 *       the main thread captures a launch on one stream in global mode; meanwhile
 *       a second thread (global mode too) launches LAUNCHES add_one kernels on
 *       another stream, which the driver allows.  Prints how the capture ended
 *       (end=<CUresult>) and what the second thread's kernels counted.
 *   client_capture ended_elsewhere relaxed|global
 *       the main thread begins a capture in that mode and captures a launch; a
 *       second thread ends it (relaxed: allowed; global: refused with
 *       CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, which ends it all the same).
 *       Then the main thread, capturing no more, allocates on another stream
 *       (managed=1 when that allocation is managed memory), launches there
 *       and reads the result back.
 *   client_capture ended_by destroy|reset
 *       the main thread begins a capture (global mode) and captures a launch;
 *       then destroys the stream, or resets the primary context (and opens it
 *       again), either of which ends the capture; then works on another
 *       stream like ended_elsewhere.
 *   client_capture into_other relaxed|global
 *       the main thread begins a capture in that mode and captures a launch; a
 *       second thread launches and sets memory into the same stream (only
 *       graph nodes; the driver allows it), then the main thread ends the
 *       capture.  Needs no GPU time: prints what the second thread's calls
 *       and the end returned.
 *   client_capture left_open
 *       a thread begins a capture (thread-local mode) and exits with it open;
 *       the next thread that gets its pthread_t (glibc reuses them) allocates,
 *       launches and reads back on another stream, like ended_elsewhere.
 *
 * Prints "client=capture result=ok key=value..." or the failing call. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_fixture.h"
#include "client_check.h"

#define CHECK(call) CLIENT_CHECK("capture", call)

static CUcontext context;
static CUfunction add_one;
static CUstream captured, other;

struct beside_work {
    CUdeviceptr counts;
    int launches;
    CUresult result;
};

static void *launch_beside(void *arg)
{
    struct beside_work *work = arg;
    work->result = cuCtxSetCurrent(context);
    int n = 1;
    void *params[] = {&work->counts, &n};
    for (int i = 0; i < work->launches && work->result == CUDA_SUCCESS; i++)
        work->result = cuLaunchKernel(add_one, 1, 1, 1, 1, 1, 1, 0, other, params, NULL);
    return NULL;
}

/* Allocates *flag, then begins a capture on the stream captured in mode and
 * captures one add_one launch on *flag there. */
static int begin_capture_with_a_launch(int mode, CUdeviceptr *flag)
{
    int n = 1;
    void *params[] = {flag, &n};
    CHECK(cuMemAlloc_v2(flag, 4096));
    CHECK(cuStreamBeginCapture_v2(captured, mode));
    CHECK(cuLaunchKernel(add_one, 1, 1, 1, 1, 1, 1, 0, captured, params, NULL));
    return 0;
}

static int beside(int launches)
{
    struct beside_work work = {.launches = launches};
    CUdeviceptr flag;
    CUgraph graph;
    CHECK(cuMemAlloc_v2(&work.counts, 4096));
    /* Nothing has run yet: the second thread's launches ask for the GPU while
     * the capture is open. */
    if (begin_capture_with_a_launch(CU_STREAM_CAPTURE_MODE_GLOBAL, &flag) != 0)
        return 1;
    pthread_t thread;
    if (pthread_create(&thread, NULL, launch_beside, &work) != 0)
        return 1;
    pthread_join(thread, NULL);
    int status = -1;
    CHECK(cuStreamIsCapturing(captured, &status));
    CUresult ended = cuStreamEndCapture(captured, &graph);
    CHECK(work.result);
    CHECK(cuStreamSynchronize(other));
    int counted = -1;
    CHECK(cuMemcpyDtoH_v2(&counted, work.counts, sizeof counted));
    printf("client=capture result=ok status_before_end=%d end=%d counted=%d\n", status, (int)ended,
           counted);
    return 0;
}

static void *end_capture(void *arg)
{
    CUgraph graph;
    CUresult *result = arg;
    *result = cuCtxSetCurrent(context);
    if (*result == CUDA_SUCCESS)
        *result = cuStreamEndCapture(captured, &graph);
    return NULL;
}

/* Allocates on the stream other (stream-ordered), launches there and reads the
 * result back; prints so_far, whether the allocation was managed memory and
 * what the kernel counted. */
static int work_on_other_stream(const char *so_far)
{
    CUdeviceptr mine;
    int n = 1;
    CHECK(cuMemAllocAsync(&mine, 4096, other));
    unsigned managed = 0;
    CHECK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, mine));
    void *params[] = {&mine, &n};
    CHECK(cuMemsetD32Async(mine, 41, 1, other));
    CHECK(cuLaunchKernel(add_one, 1, 1, 1, 1, 1, 1, 0, other, params, NULL));
    CHECK(cuStreamSynchronize(other));
    int counted = -1;
    CHECK(cuMemcpyDtoH_v2(&counted, mine, sizeof counted));
    CHECK(cuMemFreeAsync(mine, other));
    CHECK(cuStreamSynchronize(other));
    printf("client=capture result=ok %s managed=%u counted=%d\n", so_far, managed, counted);
    return 0;
}

static int ended_elsewhere(int mode)
{
    CUdeviceptr flag;
    if (begin_capture_with_a_launch(mode, &flag) != 0)
        return 1;
    CUresult ended = CUDA_ERROR_UNKNOWN;
    pthread_t thread;
    if (pthread_create(&thread, NULL, end_capture, &ended) != 0)
        return 1;
    pthread_join(thread, NULL);
    int status = -1;
    CHECK(cuStreamIsCapturing(captured, &status));
    char so_far[64];
    snprintf(so_far, sizeof so_far, "end=%d status_after_end=%d", (int)ended, status);
    return work_on_other_stream(so_far);
}

struct next_thread {
    pthread_t first; /* the thread that left its capture open */
    int reused;      /* this thread got the first one's pthread_t */
    int failed;
};

static void *begin_and_exit(void *arg)
{
    CUdeviceptr *flag = arg;
    int n = 1;
    void *params[] = {flag, &n};
    if (cuCtxSetCurrent(context) == CUDA_SUCCESS &&
        cuStreamBeginCapture_v2(captured, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS)
        cuLaunchKernel(add_one, 1, 1, 1, 1, 1, 1, 0, captured, params, NULL);
    return NULL;
}

static void *work_if_reused(void *arg)
{
    struct next_thread *next = arg;
    next->reused = pthread_equal(pthread_self(), next->first);
    if (next->reused)
        next->failed =
            cuCtxSetCurrent(context) != CUDA_SUCCESS || work_on_other_stream("reused=1") != 0;
    return NULL;
}

static int left_open(void)
{
    CUdeviceptr flag;
    CHECK(cuMemAlloc_v2(&flag, 4096));
    struct next_thread next = {.reused = 0};
    if (pthread_create(&next.first, NULL, begin_and_exit, &flag) != 0)
        return 1;
    pthread_join(next.first, NULL);
    int status = -1;
    CHECK(cuStreamIsCapturing(captured, &status));
    if (status != CU_STREAM_CAPTURE_STATUS_ACTIVE) {
        printf("client=capture result=error the first thread's capture is not open (status %d)\n",
               status);
        return 1;
    }
    for (int tries = 0; tries < 100 && !next.reused; tries++) {
        pthread_t thread;
        if (pthread_create(&thread, NULL, work_if_reused, &next) != 0)
            return 1;
        pthread_join(thread, NULL);
    }
    if (!next.reused)
        printf("client=capture result=error no thread got the exited thread's pthread_t\n");
    return !next.reused || next.failed;
}

struct into_work {
    CUdeviceptr flag;
    CUresult launched, set;
};

static void *launch_into_capture(void *arg)
{
    struct into_work *work = arg;
    int n = 1;
    void *params[] = {&work->flag, &n};
    work->launched = cuCtxSetCurrent(context);
    if (work->launched == CUDA_SUCCESS)
        work->launched = cuLaunchKernel(add_one, 1, 1, 1, 1, 1, 1, 0, captured, params, NULL);
    work->set = cuMemsetD32Async(work->flag, 7, 1, captured);
    return NULL;
}

static int into_other(int mode)
{
    struct into_work work = {0};
    CUgraph graph;
    if (begin_capture_with_a_launch(mode, &work.flag) != 0)
        return 1;
    pthread_t thread;
    if (pthread_create(&thread, NULL, launch_into_capture, &work) != 0)
        return 1;
    pthread_join(thread, NULL);
    CUresult ended = cuStreamEndCapture(captured, &graph);
    printf("client=capture result=ok launched=%d set=%d end=%d\n", (int)work.launched,
           (int)work.set, (int)ended);
    return 0;
}

static int ended_by(int reset)
{
    CUdeviceptr flag;
    if (begin_capture_with_a_launch(CU_STREAM_CAPTURE_MODE_GLOBAL, &flag) != 0)
        return 1;
    if (reset) {
        CUmodule module;
        CHECK(cuDevicePrimaryCtxReset(0));
        CHECK(cuDevicePrimaryCtxRelease(0));
        CLIENT_OPEN_PRIMARY_CONTEXT("capture", &context);
        CHECK(cuModuleLoadData(&module, "standin fake image"));
        CHECK(cuModuleGetFunction(&add_one, module, "add_one"));
        CHECK(cuStreamCreate(&other, 0));
    } else {
        CHECK(cuStreamDestroy_v2(captured));
    }
    char so_far[32];
    snprintf(so_far, sizeof so_far, "sync_after=%d", (int)cuCtxSynchronize());
    return work_on_other_stream(so_far);
}

int main(int argc, char **argv)
{
    int is_beside = argc == 3 && strcmp(argv[1], "beside") == 0;
    int is_elsewhere = argc == 3 && strcmp(argv[1], "ended_elsewhere") == 0 &&
                       (strcmp(argv[2], "relaxed") == 0 || strcmp(argv[2], "global") == 0);
    int is_left_open = argc == 2 && strcmp(argv[1], "left_open") == 0;
    int is_ended_by = argc == 3 && strcmp(argv[1], "ended_by") == 0 &&
                      (strcmp(argv[2], "destroy") == 0 || strcmp(argv[2], "reset") == 0);
    int is_into = argc == 3 && strcmp(argv[1], "into_other") == 0 &&
                  (strcmp(argv[2], "relaxed") == 0 || strcmp(argv[2], "global") == 0);
    if (!is_beside && !is_elsewhere && !is_left_open && !is_ended_by && !is_into) {
        fprintf(stderr,
                "usage: client_capture beside LAUNCHES | ended_elsewhere relaxed|global | left_open"
                " | ended_by destroy|reset | into_other relaxed|global\n");
        return 2;
    }
    CUmodule module;
    CLIENT_OPEN_PRIMARY_CONTEXT("capture", &context);
    CHECK(cuModuleLoadData(&module, "standin fake image"));
    CHECK(cuModuleGetFunction(&add_one, module, "add_one"));
    CHECK(cuStreamCreate(&captured, 0));
    CHECK(cuStreamCreate(&other, 0));
    if (is_beside)
        return beside(atoi(argv[2]));
    if (is_left_open)
        return left_open();
    if (is_ended_by)
        return ended_by(strcmp(argv[2], "reset") == 0);
    if (is_into)
        return into_other(strcmp(argv[2], "relaxed") == 0 ? CU_STREAM_CAPTURE_MODE_RELAXED
                                                          : CU_STREAM_CAPTURE_MODE_GLOBAL);
    return ended_elsewhere(strcmp(argv[2], "relaxed") == 0 ? CU_STREAM_CAPTURE_MODE_RELAXED
                                                           : CU_STREAM_CAPTURE_MODE_GLOBAL);
}
