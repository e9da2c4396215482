/*
 * The lock client's state: one lock machine and one gate per GPU, the
 * agent's settings, one mutex.  Three kinds of threads step the machines
 * through here: application threads waiting at a closed gate, the client
 * thread (frames from the agent, its periodic looks), and each GPU's worker
 * (a prefetch or a drain done).  The jobs a step returns that touch this
 * state (the gate, the waiting threads, the worker's wake-up, the client's
 * doorbell) are carried out at once, under the mutex: a thread that checks
 * the gate under the mutex must see it as the machine has it.
 */
#define _GNU_SOURCE
#include "lock_state.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "shim_threads.h"

struct nvshare_gate nvshare_gates[NVSHARE_MAX_GPUS];
atomic_int nvshare_client_running;

static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER; /* a gate opened or a lock changed */
static pthread_cond_t work_posted[NVSHARE_MAX_GPUS] = {[0 ... NVSHARE_MAX_GPUS - 1] =
                                                           PTHREAD_COND_INITIALIZER};
static struct nvshare_lock_machine locks[NVSHARE_MAX_GPUS];
static struct nvshare_settings settings;
static int have_settings;

/* Called with the mutex held. */
static void carry_out(int gpu, const struct nvshare_lock_jobs *jobs)
{
    for (int i = 0; i < jobs->count; i++) {
        switch (jobs->job[i].kind) {
        case NVSHARE_JOB_OPEN_GATE:
            atomic_store(&nvshare_gates[gpu].open, 1);
            break;
        case NVSHARE_JOB_CLOSE_GATE:
            atomic_store(&nvshare_gates[gpu].open, 0);
            break;
        case NVSHARE_JOB_WAKE_WAITERS:
            pthread_cond_broadcast(&changed);
            break;
        case NVSHARE_JOB_POST_WORK:
            pthread_cond_signal(&work_posted[gpu]);
            break;
        case NVSHARE_JOB_WAKE_CLIENT:
            nvshare_client_wake();
            break;
        default:
            break; /* the caller's */
        }
    }
}

/* Called with the mutex held. */
static void step_locked(int gpu, struct nvshare_lock_event *event, struct nvshare_lock_jobs *jobs,
                        struct nvshare_lock_machine *before)
{
    event->now_ms = nvshare_now_ms();
    event->activity = atomic_load(&nvshare_gates[gpu].activity);
    if (before != NULL)
        *before = locks[gpu];
    memset(jobs, 0, sizeof *jobs);
    nvshare_lock_machine_step(&locks[gpu], event, jobs);
    carry_out(gpu, jobs);
    atomic_store_explicit(&nvshare_gates[gpu].short_queue, nvshare_lock_queue_length(&locks[gpu]),
                          memory_order_relaxed);
}

void nvshare_lock_step(int gpu, struct nvshare_lock_event *event, struct nvshare_lock_jobs *jobs,
                       struct nvshare_lock_machine *before)
{
    pthread_mutex_lock(&mutex);
    step_locked(gpu, event, jobs, before);
    pthread_mutex_unlock(&mutex);
}

void nvshare_lock_step_each(int count, const struct nvshare_lock_event *event,
                            struct nvshare_lock_jobs jobs[])
{
    pthread_mutex_lock(&mutex);
    for (int gpu = 0; gpu < count; gpu++) {
        struct nvshare_lock_event each = *event;
        step_locked(gpu, &each, &jobs[gpu], NULL);
    }
    pthread_mutex_unlock(&mutex);
}

void nvshare_lock_wait_for_gate(int gpu)
{
    int saved_errno = errno;
    struct nvshare_gate *gate = &nvshare_gates[gpu];
    /* The waits below are cancellation points, and a thread cancelled while
     * it holds the mutex (a request timed out, a worker shut down) would leave
     * it locked for the client thread and every later call.  So cancellation
     * is held off while the mutex is held, and acted on between waits: at most
     * a second late.  (pthread_cleanup_push would need glibc 2.34's symbols.) */
    int cancel_state;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
    pthread_mutex_lock(&mutex);
    while (!atomic_load(&gate->open) && atomic_load(&nvshare_client_running)) {
        struct nvshare_lock_event waits = {.kind = NVSHARE_EVENT_THREAD_WAITS};
        struct nvshare_lock_jobs jobs;
        step_locked(gpu, &waits, &jobs, NULL);
        /* The timeout only guards against a lost wake-up; waking is by broadcast. */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 1;
        pthread_cond_timedwait(&changed, &mutex, &until);
        if (cancel_state == PTHREAD_CANCEL_ENABLE) {
            pthread_mutex_unlock(&mutex);
            pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
            pthread_testcancel();
            pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
            pthread_mutex_lock(&mutex);
        }
    }
    pthread_mutex_unlock(&mutex);
    pthread_setcancelstate(cancel_state, NULL);
    errno = saved_errno;
}

/* Called with the mutex held. */
static int take_work_locked(int gpu, int *work, uint32_t *ticket)
{
    struct nvshare_lock_event take = {.kind = NVSHARE_EVENT_TAKE_WORK};
    struct nvshare_lock_jobs jobs;
    step_locked(gpu, &take, &jobs, NULL);
    for (int i = 0; i < jobs.count; i++) {
        if (jobs.job[i].kind == NVSHARE_JOB_RUN_WORK) {
            *work = jobs.job[i].work;
            *ticket = jobs.job[i].ticket;
            return 1;
        }
    }
    return 0;
}

void nvshare_lock_wait_for_work(int gpu, int *work, uint32_t *ticket)
{
    pthread_mutex_lock(&mutex);
    while (!take_work_locked(gpu, work, ticket))
        pthread_cond_wait(&work_posted[gpu], &mutex);
    pthread_mutex_unlock(&mutex);
}

int nvshare_lock_take_work(int gpu, int *work, uint32_t *ticket)
{
    pthread_mutex_lock(&mutex);
    int taken = take_work_locked(gpu, work, ticket);
    pthread_mutex_unlock(&mutex);
    return taken;
}

int nvshare_lock_requests_waiting(void)
{
    int waiting = 0;
    pthread_mutex_lock(&mutex);
    for (int gpu = 0; gpu < NVSHARE_MAX_GPUS; gpu++)
        waiting += locks[gpu].phase == NVSHARE_LOCK_REQUESTED;
    pthread_mutex_unlock(&mutex);
    return waiting;
}

void nvshare_lock_set_settings(const struct nvshare_settings *agent_settings)
{
    pthread_mutex_lock(&mutex);
    settings = *agent_settings;
    have_settings = 1;
    pthread_mutex_unlock(&mutex);
}

int nvshare_lock_settings(struct nvshare_settings *agent_settings)
{
    pthread_mutex_lock(&mutex);
    int have = have_settings;
    if (have)
        *agent_settings = settings;
    pthread_mutex_unlock(&mutex);
    return have;
}

void nvshare_lock_run_unscheduled(void)
{
    struct nvshare_lock_event lost = {.kind = NVSHARE_EVENT_AGENT_LOST};
    struct nvshare_lock_jobs jobs[NVSHARE_MAX_GPUS];
    pthread_mutex_lock(&mutex);
    have_settings = 0;
    for (int gpu = 0; gpu < NVSHARE_MAX_GPUS; gpu++) {
        struct nvshare_lock_event each = lost;
        step_locked(gpu, &each, &jobs[gpu], NULL);
    }
    pthread_mutex_unlock(&mutex);
}

void nvshare_lock_forget_after_fork(void)
{
    mutex = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    changed = (pthread_cond_t)PTHREAD_COND_INITIALIZER;
    have_settings = 0;
    memset(locks, 0, sizeof locks);
    for (int gpu = 0; gpu < NVSHARE_MAX_GPUS; gpu++) {
        work_posted[gpu] = (pthread_cond_t)PTHREAD_COND_INITIALIZER;
        atomic_store(&nvshare_gates[gpu].open, 0);
        atomic_store(&nvshare_gates[gpu].inflight, 0);
        atomic_store(&nvshare_gates[gpu].short_queue, 0);
    }
}
