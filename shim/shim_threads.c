/*
 * The shim's own threads: the client thread (lock_client.c) and one worker
 * per GPU (gpu_worker.c).  Each is started the same way, and the client
 * thread sleeps in poll() until its doorbell, an eventfd, rings: any thread
 * rings it, with one write and no lock.
 */
#define _GNU_SOURCE
#include "shim_threads.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <unistd.h>

static atomic_int doorbell = -1;

int nvshare_start_shim_thread(void *(*thread_main)(void *), void *arg)
{
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous); /* the thread inherits this mask */
    pthread_attr_t attributes;
    pthread_attr_init(&attributes);
    pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
    pthread_t thread;
    int failed = pthread_create(&thread, &attributes, thread_main, arg);
    pthread_attr_destroy(&attributes);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    return failed;
}

int nvshare_doorbell_open(void)
{
    int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    atomic_store(&doorbell, fd);
    return fd < 0 ? -1 : 0;
}

int nvshare_doorbell_fd(void)
{
    return atomic_load_explicit(&doorbell, memory_order_relaxed);
}

void nvshare_doorbell_drain(void)
{
    uint64_t count;
    ssize_t ignored = read(nvshare_doorbell_fd(), &count, sizeof count);
    (void)ignored;
}

void nvshare_client_wake(void)
{
    int saved_errno = errno;
    uint64_t one = 1;
    int fd = nvshare_doorbell_fd();
    if (fd >= 0) {
        ssize_t ignored = write(fd, &one, sizeof one);
        (void)ignored;
    }
    errno = saved_errno;
}

void nvshare_doorbell_forget_after_fork(void)
{
    int fd = atomic_exchange(&doorbell, -1);
    if (fd >= 0)
        close(fd);
}
