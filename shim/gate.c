/*
 * The application side of the lock: waiting at a closed gate.  The client
 * thread itself is in lock_client.c.
 */
#define _GNU_SOURCE
#include "gate.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shim_threads.h"
#include "lock_state.h"

struct nvshare_gate nvshare_gates[NVSHARE_MAX_GPUS];
atomic_int nvshare_client_running;

struct lock_client nvshare_lock_client = {
    .mutex = PTHREAD_MUTEX_INITIALIZER,
    .changed = PTHREAD_COND_INITIALIZER,
    .workers = {[0 ... NVSHARE_MAX_GPUS - 1] = {.wake = PTHREAD_COND_INITIALIZER}},
    .socket_fd = -1,
};
/* The one instance, by a short name. */
#define client nvshare_lock_client

void nvshare_wait_for_gate(int gpu)
{
    int saved_errno = errno;
    struct nvshare_gate *gate = &nvshare_gates[gpu];
    struct gpu_lock *lock = &client.locks[gpu];
    /* The waits below are cancellation points, and a thread cancelled while
     * it holds the mutex (a request timed out, a worker shut down) would leave
     * it locked for the client thread and every later call.  So cancellation
     * is held off while the mutex is held, and acted on between waits: at most
     * a second late.  (pthread_cleanup_push would need glibc 2.34's symbols.) */
    int cancel_state;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
    pthread_mutex_lock(&client.mutex);
    while (!atomic_load(&gate->open) && atomic_load(&nvshare_client_running)) {
        if (lock->state == LOCK_IDLE) {
            lock->state = LOCK_WANTED;
            nvshare_client_wake();
        } else if (lock->state == LOCK_HELD) {
            lock->want_again = 1; /* being released: ask again right after */
        }
        /* The timeout only guards against a lost wake-up; waking is by broadcast. */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 1;
        pthread_cond_timedwait(&client.changed, &client.mutex, &until);
        if (cancel_state == PTHREAD_CANCEL_ENABLE) {
            pthread_mutex_unlock(&client.mutex);
            pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
            pthread_testcancel();
            pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
            pthread_mutex_lock(&client.mutex);
        }
    }
    pthread_mutex_unlock(&client.mutex);
    pthread_setcancelstate(cancel_state, NULL);
    errno = saved_errno;
}

/* In a forked child (lifecycle.c): the lock client as never started, with
 * plain stores. */
void nvshare_lock_forget_after_fork(void)
{
    if (client.socket_fd >= 0)
        close(client.socket_fd);
    client.socket_fd = -1;
    client.mutex = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    client.changed = (pthread_cond_t)PTHREAD_COND_INITIALIZER;
    client.have_settings = 0;
    client.inbox.used = 0;
    memset(client.locks, 0, sizeof client.locks);
    for (int gpu = 0; gpu < NVSHARE_MAX_GPUS; gpu++) {
        client.workers[gpu].started = 0; /* the parent's workers are not in the child */
        client.workers[gpu].wake = (pthread_cond_t)PTHREAD_COND_INITIALIZER;
        atomic_store(&nvshare_gates[gpu].open, 0);
        atomic_store(&nvshare_gates[gpu].inflight, 0);
    }
}
