/* Test client: the shim's idle release decided while the process was quiet,
 * carried out late, after the process had started launching again.
 *
 *   client_late_idle DESTROY_AT_MS B_START_MS B_END_MS TAIL_MS
 *       the main thread, on GPU 0's primary context: a burst of 16 launches,
 *       synchronised (time A); from A + B_START_MS to A + B_END_MS a launch
 *       every 10 ms; then quiet for TAIL_MS.
 *       a second thread: creates a context on GPU 0 before the burst and
 *       destroys it at A + DESTROY_AT_MS (run with STANDIN_CTX_DESTROY_US: the
 *       shim holds every GPU's contexts mutex for that long, so the GPU's
 *       worker, which takes it for its idle check, starts late).
 *
 * Prints "client=late_idle result=ok" with the times (CLOCK_REALTIME seconds)
 * of A, the last launch, and the destroy's start and end. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda_fixture.h"
#include "client_check.h"

#define CHECK(call) CLIENT_CHECK("late_idle", call)

static double now_s(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return now.tv_sec + now.tv_nsec / 1e9;
}

static void sleep_until(double when_s)
{
    for (double left = when_s - now_s(); left > 0; left = when_s - now_s()) {
        struct timespec pause = {(time_t)left, (long)((left - (time_t)left) * 1e9)};
        nanosleep(&pause, NULL);
    }
}

struct destroyer {
    CUcontext context;
    pthread_mutex_t mutex;
    pthread_cond_t started;
    double burst_done; /* A, once the main thread has set it */
    long destroy_at_ms;
    double destroy_started, destroy_done;
    int failed;
};

static int destroy_later(struct destroyer *d)
{
    pthread_mutex_lock(&d->mutex);
    while (d->burst_done == 0)
        pthread_cond_wait(&d->started, &d->mutex);
    double at = d->burst_done + d->destroy_at_ms / 1000.0;
    pthread_mutex_unlock(&d->mutex);
    sleep_until(at);
    d->destroy_started = now_s();
    CHECK(cuCtxDestroy_v2(d->context));
    d->destroy_done = now_s();
    return 0;
}

static void *destroyer_main(void *arg)
{
    struct destroyer *d = arg;
    d->failed = destroy_later(d) != 0;
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s DESTROY_AT_MS B_START_MS B_END_MS TAIL_MS\n", argv[0]);
        return 2;
    }
    long b_start_ms = atol(argv[2]), b_end_ms = atol(argv[3]), tail_ms = atol(argv[4]);
    struct destroyer d = {.mutex = PTHREAD_MUTEX_INITIALIZER,
                          .started = PTHREAD_COND_INITIALIZER,
                          .destroy_at_ms = atol(argv[1])};
    CUcontext primary;
    CUdevice device;
    CUmodule module;
    CUfunction spin;
    CUdeviceptr buffer;
    CLIENT_OPEN_PRIMARY_CONTEXT("late_idle", &primary);
    CHECK(cuDeviceGet(&device, 0));
    /* Destroyed by the other thread; cuCtxCreate also makes it current. */
    CHECK(cuCtxCreate_v2(&d.context, 0, device));
    CHECK(cuCtxSetCurrent(primary));
    CHECK(cuMemAlloc_v2(&buffer, 4096));
    CHECK(cuModuleLoadData(&module, "standin fake image"));
    CHECK(cuModuleGetFunction(&spin, module, "spin"));
    pthread_t thread;
    if (pthread_create(&thread, NULL, destroyer_main, &d) != 0) {
        printf("client=late_idle result=fail step=pthread_create\n");
        return 1;
    }
    for (int i = 0; i < 16; i++)
        CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    CHECK(cuCtxSynchronize());
    double a = now_s(), last = a;
    pthread_mutex_lock(&d.mutex);
    d.burst_done = a;
    pthread_cond_signal(&d.started);
    pthread_mutex_unlock(&d.mutex);

    sleep_until(a + b_start_ms / 1000.0);
    while (now_s() < a + b_end_ms / 1000.0) {
        CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        last = now_s();
        sleep_until(last + 0.010);
    }
    sleep_until(last + tail_ms / 1000.0);
    pthread_join(thread, NULL);
    if (d.failed)
        return 1;
    printf("client=late_idle result=ok a=%.6f last_launch=%.6f destroy_started=%.6f "
           "destroy_done=%.6f\n",
           a, last, d.destroy_started, d.destroy_done);
    return 0;
}
