/* Test client using two GPUs from two threads, linked to libcuda (-lcuda).
 *
 *   client_two_gpus B_DELAY_MS
 *       thread A, on GPU 0: allocates 4 KiB (the shim converts it, so a grant
 *       prefetches it), launches one spin kernel and synchronises;
 *       thread B, on GPU 1, B_DELAY_MS after both started: one spin kernel,
 *       nothing allocated, synchronised.
 *
 * What one GPU's lock transition does (a long prefetch, a long drain) must
 * not hold up the other GPU.  Prints "client=two_gpus result=ok" with each
 * thread's times (CLOCK_REALTIME seconds): when its launch returned (it had
 * passed the shim's gate) and when its synchronisation returned. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda_fixture.h"
#include "client_check.h"

#define CHECK(call) CLIENT_CHECK("two_gpus", call)

struct thread_run {
    int device;
    long delay_ms;
    int allocate;
    double launched, done;
    int failed;
};

static double now_s(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return now.tv_sec + now.tv_nsec / 1e9;
}

static int run_on_gpu(struct thread_run *run)
{
    struct timespec pause = {run->delay_ms / 1000, (run->delay_ms % 1000) * 1000000L};
    nanosleep(&pause, NULL);
    CUdevice device;
    CUcontext context;
    CUmodule module;
    CUfunction spin;
    CUdeviceptr buffer;
    CHECK(cuDeviceGet(&device, run->device));
    CHECK(cuDevicePrimaryCtxRetain(&context, device));
    CHECK(cuCtxSetCurrent(context));
    if (run->allocate)
        CHECK(cuMemAlloc_v2(&buffer, 4096));
    CHECK(cuModuleLoadData(&module, "standin fake image"));
    CHECK(cuModuleGetFunction(&spin, module, "spin"));
    CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    run->launched = now_s();
    CHECK(cuCtxSynchronize());
    run->done = now_s();
    return 0;
}

static void *thread_main(void *argument)
{
    struct thread_run *run = argument;
    run->failed = run_on_gpu(run);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: client_two_gpus B_DELAY_MS\n");
        return 2;
    }
    int count = 0;
    CHECK(cuInit(0));
    CHECK(cuDeviceGetCount(&count));
    if (count < 2) {
        printf("client=two_gpus result=error devices=%d (STANDIN_DEVICE_COUNT=2)\n", count);
        return 1;
    }
    struct thread_run a = {.device = 0, .allocate = 1},
                      b = {.device = 1, .delay_ms = atol(argv[1])};
    pthread_t thread_a, thread_b;
    pthread_create(&thread_a, NULL, thread_main, &a);
    pthread_create(&thread_b, NULL, thread_main, &b);
    pthread_join(thread_a, NULL);
    pthread_join(thread_b, NULL);
    if (a.failed || b.failed)
        return 1;
    printf("client=two_gpus result=ok a_launched=%.6f a_done=%.6f b_launched=%.6f b_done=%.6f\n",
           a.launched, a.done, b.launched, b.done);
    return 0;
}
