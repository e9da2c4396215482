/* Test client: a thread that waits at the shim's gate is cancelled.
 *
 *   client_cancel
 *       Run while another process holds the GPU.  A second thread launches a
 *       kernel and so waits at the closed gate; the main thread cancels it
 *       (pthread_cond_timedwait is a cancellation point) and then launches
 *       itself, which must wait for the lock and run, not hang on a mutex the
 *       cancelled thread left locked.  A 20 s alarm reports a hang.
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

static void report_hang(int signal_number)
{
    (void)signal_number;
    static const char line[] = "client=cancel result=hang\n";
    (void)!write(STDOUT_FILENO, line, sizeof line - 1);
    _exit(3);
}

int main(void)
{
    CUmodule module;
    CLIENT_OPEN_PRIMARY_CONTEXT("cancel", &context);
    CHECK(cuModuleLoadData(&module, "standin fake image"));
    CHECK(cuModuleGetFunction(&kernel, module, "spin"));

    pthread_t waiter;
    if (pthread_create(&waiter, NULL, launch_at_the_closed_gate, NULL) != 0) {
        printf("client=cancel result=error call=pthread_create\n");
        return 1;
    }
    struct timespec pause = {0, 300 * 1000000L};
    nanosleep(&pause, NULL);            /* long enough to be waiting at the gate */
    pthread_cancel(waiter);
    pthread_join(waiter, NULL);

    signal(SIGALRM, report_hang);
    alarm(20);
    CHECK(cuLaunchKernel(kernel, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    CHECK(cuCtxSynchronize());
    alarm(0);
    printf("client=cancel result=ok\n");
    return 0;
}
