/* Test client: a thread is cancelled inside a shim hook.
 *
 *   client_cancel
 *       Run while another process holds the GPU.  A second thread launches a
 *       kernel and so waits at the closed gate; the main thread cancels it
 *       (pthread_cond_timedwait is a cancellation point) and then launches
 *       itself, which must wait for the lock and run, not hang on a mutex the
 *       cancelled thread left locked.  A 20 s alarm reports a hang.
 *   client_cancel --in-destroy
 *       Run with STANDIN_CTX_DESTROY_US (the stand-in then sleeps in
 *       cuCtxDestroy, a cancellation point, as a driver may reach one).  A
 *       second thread destroys a context and is cancelled meanwhile; the main
 *       thread then creates and destroys one itself, which must not hang on
 *       the contexts' mutexes the shim holds across a destruction.
 *
 * Prints "client=cancel result=ok", "result=hang" or the failing call. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_fixture.h"
#include "client_check.h"

#define CHECK(call) CLIENT_CHECK("cancel", call)

static CUcontext context;
static CUfunction kernel;

static void *launch_at_the_closed_gate(void *unused)
{
    (void)unused;
    cuCtxSetCurrent(context);
    cuLaunchKernel(kernel, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    return NULL;
}

static void *destroy_a_context(void *created)
{
    cuCtxDestroy_v2(*(CUcontext *)created);
    return NULL;
}

static void report_hang(int signal_number)
{
    (void)signal_number;
    static const char line[] = "client=cancel result=hang\n";
    (void)!write(STDOUT_FILENO, line, sizeof line - 1);
    _exit(3);
}

int main(int argc, char **argv)
{
    int in_destroy = argc > 1 && strcmp(argv[1], "--in-destroy") == 0;
    CUmodule module;
    CLIENT_OPEN_PRIMARY_CONTEXT("cancel", &context);
    CHECK(cuModuleLoadData(&module, "standin fake image"));
    CHECK(cuModuleGetFunction(&kernel, module, "spin"));

    CUdevice device;
    CUcontext created;
    CHECK(cuDeviceGet(&device, 0));
    if (in_destroy) {
        CHECK(cuCtxCreate_v2(&created, 0, device));
        CHECK(cuCtxSetCurrent(context));
    }
    pthread_t waiter;
    if (pthread_create(&waiter, NULL, in_destroy ? destroy_a_context : launch_at_the_closed_gate,
                       &created) != 0) {
        printf("client=cancel result=error call=pthread_create\n");
        return 1;
    }
    struct timespec pause = {0, 300 * 1000000L};
    nanosleep(&pause, NULL); /* long enough to be at the gate, or in the destruction */
    pthread_cancel(waiter);
    pthread_join(waiter, NULL);

    signal(SIGALRM, report_hang);
    alarm(20);
    if (in_destroy) {
        CHECK(cuCtxCreate_v2(&created, 0, device));
        CHECK(cuCtxDestroy_v2(created));
        CHECK(cuCtxSetCurrent(context));
    }
    CHECK(cuLaunchKernel(kernel, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    CHECK(cuCtxSynchronize());
    alarm(0);
    printf("client=cancel result=ok\n");
    return 0;
}
