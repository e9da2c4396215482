// Stream capture beside other threads' work, under the shim (or not) on a real GPU.
//   capture beside LAUNCHES
//       the main thread captures one kernel on stream S in global mode; meanwhile a
//       second thread, in global mode too, zeroes a counter and launches LAUNCHES kernels
//       on stream T, which the driver allows.  Nothing ran before the capture, so under the shim the
//       process gets the GPU (and prefetches) and bounds its queue while the capture
//       is open.  The graph then runs twice.
//   capture ended_elsewhere relaxed|global
//       the main thread begins a capture on S in that mode and captures a kernel; a
//       second thread ends it (relaxed: allowed; global: refused with
//       CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, and ended all the same).  The main
//       thread then allocates on T with cudaMallocAsync and counts there.
//   capture into_other relaxed|global
//       the main thread begins a capture on S in that mode and captures a kernel; a
//       second thread adds a memset and a kernel to the same capture.  The graph then
//       runs once (graph_counted=1: the memset zeroes the first kernel's count).
//   capture ended_by destroy|reset
//       the main thread begins a capture on S (global mode) and captures a kernel, then
//       destroys S, or resets the device (cudaDeviceReset), which ends the capture; then
//       it works on T like ended_elsewhere.
//   capture left_open
//       a thread begins a capture on S (thread-local mode) and exits with it open; the
//       next thread given its pthread_t (glibc reuses them) does the same work on T.
// Writes "capture: begun" and "capture: ending" to stderr around the open capture (the
// shim's debug lines land in between), prints "result=ok key=value ..." or what failed.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>

#include "check.cuh"

__global__ void add_one(int *counter) { *counter += 1; }

static cudaStream_t captured, other;

struct beside_work {
    int *counts;
    int launches;
    cudaError_t result;
};

static void *launch_beside(void *arg) {
    beside_work *work = static_cast<beside_work *>(arg);
    work->result = cudaSetDevice(0);
    if (work->result == cudaSuccess)
        work->result = cudaMemsetAsync(work->counts, 0, sizeof(int), other);
    for (int i = 0; i < work->launches && work->result == cudaSuccess; i++) {
        add_one<<<1, 1, 0, other>>>(work->counts);
        work->result = cudaGetLastError();
    }
    return nullptr;
}

static void marker(const char *what) {
    std::fprintf(stderr, "capture: %s\n", what);
    std::fflush(stderr);
}

// Allocates a counter, marks "begun", begins a capture on S in mode and captures one
// kernel on the counter there; returns the counter.
static int *begin_capture_with_a_launch(cudaStreamCaptureMode mode) {
    int *counter;
    CHECK_RUNTIME(cudaMalloc(&counter, sizeof(int)));
    marker("begun");
    CHECK_RUNTIME(cudaStreamBeginCapture(captured, mode));
    add_one<<<1, 1, 0, captured>>>(counter);
    return counter;
}

static int beside(int launches) {
    beside_work work = {nullptr, launches, cudaSuccess};
    CHECK_RUNTIME(cudaMalloc(&work.counts, sizeof(int)));
    int *graph_counts = begin_capture_with_a_launch(cudaStreamCaptureModeGlobal);
    pthread_t thread;
    if (pthread_create(&thread, nullptr, launch_beside, &work) != 0)
        return 1;
    pthread_join(thread, nullptr);
    cudaStreamCaptureStatus status;
    CHECK_RUNTIME(cudaStreamIsCapturing(captured, &status));
    marker("ending");
    cudaGraph_t graph = nullptr;
    cudaError_t ended = cudaStreamEndCapture(captured, &graph);
    CHECK_RUNTIME(work.result);
    CHECK_RUNTIME(cudaStreamSynchronize(other));
    int counted = -1, graph_counted = -1;
    CHECK_RUNTIME(cudaMemcpy(&counted, work.counts, sizeof(int), cudaMemcpyDeviceToHost));
    if (ended == cudaSuccess) {
        cudaGraphExec_t exec;
        int zero = 0;
        CHECK_RUNTIME(cudaMemcpy(graph_counts, &zero, sizeof(int), cudaMemcpyHostToDevice));
        CHECK_RUNTIME(cudaGraphInstantiate(&exec, graph, 0));
        CHECK_RUNTIME(cudaGraphLaunch(exec, captured));
        CHECK_RUNTIME(cudaGraphLaunch(exec, captured));
        CHECK_RUNTIME(cudaStreamSynchronize(captured));
        CHECK_RUNTIME(cudaMemcpy(&graph_counted, graph_counts, sizeof(int), cudaMemcpyDeviceToHost));
    }
    std::printf("result=ok status_before_end=%d end=%d counted=%d graph_counted=%d\n", (int)status,
                (int)ended, counted, graph_counted);
    return 0;
}

static void *end_capture(void *arg) {
    cudaError_t *result = static_cast<cudaError_t *>(arg);
    cudaGraph_t graph = nullptr;
    *result = cudaSetDevice(0);
    if (*result == cudaSuccess)
        *result = cudaStreamEndCapture(captured, &graph);
    return nullptr;
}

// Allocates on T with cudaMallocAsync, counts 42 kernels there and reads the count
// back; prints so_far, whether the allocation was managed memory and the count.
static int work_on_other_stream(const char *so_far) {
    int *mine;
    CHECK_RUNTIME(cudaMallocAsync(&mine, sizeof(int), other));
    unsigned managed = 0;
    if (cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, (CUdeviceptr)mine) != CUDA_SUCCESS)
        managed = 99;
    CHECK_RUNTIME(cudaMemsetAsync(mine, 0, sizeof(int), other));
    for (int i = 0; i < 42; i++)
        add_one<<<1, 1, 0, other>>>(mine);
    CHECK_RUNTIME(cudaGetLastError());
    int counted = -1;
    CHECK_RUNTIME(cudaMemcpyAsync(&counted, mine, sizeof(int), cudaMemcpyDeviceToHost, other));
    CHECK_RUNTIME(cudaStreamSynchronize(other));
    CHECK_RUNTIME(cudaFreeAsync(mine, other));
    CHECK_RUNTIME(cudaStreamSynchronize(other));
    std::printf("result=ok %s managed=%u counted=%d\n", so_far, managed, counted);
    return 0;
}

static int ended_elsewhere(cudaStreamCaptureMode mode) {
    begin_capture_with_a_launch(mode);
    cudaError_t ended = cudaErrorUnknown;
    pthread_t thread;
    if (pthread_create(&thread, nullptr, end_capture, &ended) != 0)
        return 1;
    pthread_join(thread, nullptr);
    marker("ending");
    cudaStreamCaptureStatus status;
    CHECK_RUNTIME(cudaStreamIsCapturing(captured, &status));
    char so_far[64];
    std::snprintf(so_far, sizeof so_far, "end=%d status_after_end=%d", (int)ended, (int)status);
    return work_on_other_stream(so_far);
}

struct into_work {
    int *counts;
    cudaError_t result;
};

static void *work_into_capture(void *arg) {
    into_work *work = static_cast<into_work *>(arg);
    work->result = cudaSetDevice(0);
    if (work->result == cudaSuccess)
        work->result = cudaMemsetAsync(work->counts, 0, sizeof(int), captured);
    if (work->result == cudaSuccess) {
        add_one<<<1, 1, 0, captured>>>(work->counts);
        work->result = cudaGetLastError();
    }
    return nullptr;
}

static int into_other(cudaStreamCaptureMode mode) {
    into_work work = {nullptr, cudaSuccess};
    // Nothing runs before the capture: under the shim the process holds no lock during it.
    work.counts = begin_capture_with_a_launch(mode);
    pthread_t thread;
    if (pthread_create(&thread, nullptr, work_into_capture, &work) != 0)
        return 1;
    pthread_join(thread, nullptr);
    marker("ending");
    cudaGraph_t graph = nullptr;
    cudaError_t ended = cudaStreamEndCapture(captured, &graph);
    CHECK_RUNTIME(work.result);
    int graph_counted = -1;
    if (ended == cudaSuccess) {
        cudaGraphExec_t exec;
        CHECK_RUNTIME(cudaGraphInstantiate(&exec, graph, 0));
        CHECK_RUNTIME(cudaGraphLaunch(exec, captured));
        CHECK_RUNTIME(cudaStreamSynchronize(captured));
        CHECK_RUNTIME(cudaMemcpy(&graph_counted, work.counts, sizeof(int), cudaMemcpyDeviceToHost));
    }
    std::printf("result=ok end=%d graph_counted=%d\n", (int)ended, graph_counted);
    return 0;
}

static int ended_by(bool reset) {
    begin_capture_with_a_launch(cudaStreamCaptureModeGlobal);
    if (reset) {
        CHECK_RUNTIME(cudaDeviceReset());
        CHECK_RUNTIME(cudaSetDevice(0));
        CHECK_RUNTIME(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    } else {
        CHECK_RUNTIME(cudaStreamDestroy(captured));
    }
    marker("ending");
    char so_far[32];
    std::snprintf(so_far, sizeof so_far, "sync_after=%d", (int)cudaDeviceSynchronize());
    return work_on_other_stream(so_far);
}

static void *begin_and_exit(void *arg) {
    int *flag = static_cast<int *>(arg);
    if (cudaSetDevice(0) == cudaSuccess &&
        cudaStreamBeginCapture(captured, cudaStreamCaptureModeThreadLocal) == cudaSuccess)
        add_one<<<1, 1, 0, captured>>>(flag);
    return nullptr;
}

struct next_thread {
    pthread_t first;  // the thread that left its capture open
    bool reused;      // this thread got the first one's pthread_t
    int failed;
};

static void *work_if_reused(void *arg) {
    next_thread *next = static_cast<next_thread *>(arg);
    next->reused = pthread_equal(pthread_self(), next->first);
    if (next->reused) {
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        next->failed = cudaSetDevice(0) != cudaSuccess || cudaStreamIsCapturing(captured, &status) != cudaSuccess;
        char so_far[64];
        std::snprintf(so_far, sizeof so_far, "reused=1 status_left_open=%d", (int)status);
        next->failed = next->failed || work_on_other_stream(so_far) != 0;
    }
    return nullptr;
}

static int left_open() {
    int *flag;
    CHECK_RUNTIME(cudaMalloc(&flag, sizeof(int)));
    next_thread next = {};
    marker("begun");
    if (pthread_create(&next.first, nullptr, begin_and_exit, flag) != 0)
        return 1;
    pthread_join(next.first, nullptr);
    marker("left open");
    for (int tries = 0; tries < 100 && !next.reused; tries++) {
        pthread_t thread;
        if (pthread_create(&thread, nullptr, work_if_reused, &next) != 0)
            return 1;
        pthread_join(thread, nullptr);
    }
    if (!next.reused)
        std::printf("result=error no thread got the exited thread's pthread_t\n");
    return !next.reused || next.failed;
}

int main(int argc, char **argv) {
    bool is_beside = argc == 3 && !std::strcmp(argv[1], "beside");
    bool is_elsewhere = argc == 3 && !std::strcmp(argv[1], "ended_elsewhere") &&
                        (!std::strcmp(argv[2], "relaxed") || !std::strcmp(argv[2], "global"));
    bool is_left_open = argc == 2 && !std::strcmp(argv[1], "left_open");
    bool is_ended_by = argc == 3 && !std::strcmp(argv[1], "ended_by") &&
                       (!std::strcmp(argv[2], "destroy") || !std::strcmp(argv[2], "reset"));
    bool is_into = argc == 3 && !std::strcmp(argv[1], "into_other") &&
                   (!std::strcmp(argv[2], "relaxed") || !std::strcmp(argv[2], "global"));
    if (!is_beside && !is_elsewhere && !is_left_open && !is_ended_by && !is_into) {
        std::fprintf(stderr, "usage: capture beside LAUNCHES | ended_elsewhere relaxed|global | left_open"
                             " | ended_by destroy|reset | into_other relaxed|global\n");
        return 2;
    }
    CHECK_RUNTIME(cudaSetDevice(0));
    CHECK_RUNTIME(cudaStreamCreateWithFlags(&captured, cudaStreamNonBlocking));
    CHECK_RUNTIME(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    if (is_beside)
        return beside(std::atoi(argv[2]));
    if (is_left_open)
        return left_open();
    if (is_ended_by)
        return ended_by(!std::strcmp(argv[2], "reset"));
    if (is_into)
        return into_other(!std::strcmp(argv[2], "relaxed") ? cudaStreamCaptureModeRelaxed
                                                            : cudaStreamCaptureModeGlobal);
    return ended_elsewhere(!std::strcmp(argv[2], "relaxed") ? cudaStreamCaptureModeRelaxed
                                                             : cudaStreamCaptureModeGlobal);
}
