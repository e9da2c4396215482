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

static int beside(int launches)
{
    struct beside_work work = {.launches = launches};
    CUdeviceptr flag;
    CUgraph graph;
    CHECK(cuMemAlloc_v2(&work.counts, 4096));
    CHECK(cuMemAlloc_v2(&flag, 4096));
    int n = 1;
    void *params[] = {&flag, &n};
    /* Nothing has run yet: the second thread's launches ask for the GPU while
     * the capture is open. */
    CHECK(cuStreamBeginCapture_v2(captured, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuLaunchKernel(add_one, 1, 1, 1, 1, 1, 1, 0, captured, params, NULL));
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
    printf("client=capture result=ok status_before_end=%d end=%d counted=%d\n", status, (int)ended, counted);
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

static int ended_elsewhere(int mode)
{
    CUdeviceptr flag, mine;
    CHECK(cuMemAlloc_v2(&flag, 4096));
    int n = 1;
    void *params[] = {&flag, &n};
    CHECK(cuStreamBeginCapture_v2(captured, mode));
    CHECK(cuLaunchKernel(add_one, 1, 1, 1, 1, 1, 1, 0, captured, params, NULL));
    CUresult ended = CUDA_ERROR_UNKNOWN;
    pthread_t thread;
    if (pthread_create(&thread, NULL, end_capture, &ended) != 0)
        return 1;
    pthread_join(thread, NULL);
    int status = -1;
    CHECK(cuStreamIsCapturing(captured, &status));

    CHECK(cuMemAllocAsync(&mine, 4096, other));
    unsigned managed = 0;
    CHECK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, mine));
    void *mine_params[] = {&mine, &n};
    CHECK(cuMemsetD32Async(mine, 41, 1, other));
    CHECK(cuLaunchKernel(add_one, 1, 1, 1, 1, 1, 1, 0, other, mine_params, NULL));
    CHECK(cuStreamSynchronize(other));
    int counted = -1;
    CHECK(cuMemcpyDtoH_v2(&counted, mine, sizeof counted));
    CHECK(cuMemFreeAsync(mine, other));
    CHECK(cuStreamSynchronize(other));
    printf("client=capture result=ok end=%d status_after_end=%d managed=%u counted=%d\n", (int)ended, status,
           managed, counted);
    return 0;
}

int main(int argc, char **argv)
{
    int is_beside = argc == 3 && strcmp(argv[1], "beside") == 0;
    int is_elsewhere = argc == 3 && strcmp(argv[1], "ended_elsewhere") == 0 &&
                       (strcmp(argv[2], "relaxed") == 0 || strcmp(argv[2], "global") == 0);
    if (!is_beside && !is_elsewhere) {
        fprintf(stderr, "usage: client_capture beside LAUNCHES | ended_elsewhere relaxed|global\n");
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
    return ended_elsewhere(strcmp(argv[2], "relaxed") == 0 ? CU_STREAM_CAPTURE_MODE_RELAXED
                                                           : CU_STREAM_CAPTURE_MODE_GLOBAL);
}
