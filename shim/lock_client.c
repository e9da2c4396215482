/*
 * The lock client: one thread per process, started by the first CUDA call,
 * that talks to the agent (shim/nvshare_protocol.h) and opens and closes the
 * per-GPU gates of gate.h.
 *
 * Only this thread touches the socket (agent_link.c: frames, connecting,
 * running unscheduled).  Application threads that find a gate closed mark
 * the GPU "wanted", wake this thread through an eventfd and wait on a
 * condition variable; they never hold anything the application needs.
 *
 * Fail-open: with no agent (never there, or gone) every gate stays open and
 * the process runs unscheduled; the thread retries the connection every
 * second and, once back, closes the gates so the next GPU call asks again.
 */
#define _GNU_SOURCE
#include "lock_client.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "agent_link.h"
#include "capture.h"
#include "config.h"
#include "devices.h"
#include "contexts.h"
#include "gate.h"
#include "driver.h"
#include "lock_state.h"
#include "shim_threads.h"
#include "log.h"
#include "memory_accounting.h"
#include "memory_prefetch.h"
#include "nvshare_protocol.h"
#include "queue_bound.h"
#include "wire.h"

/* The one instance, by a short name. */
#define client nvshare_lock_client

/* ---- lock transitions ------------------------------------------------------------------ */

/* A grant's prefetch and a release's drain wait for the GPU: seconds for a
 * large working set or a long kernel.  Each GPU's wait runs on a worker
 * thread of that GPU, started at its first transition, so the client thread
 * goes on serving the process's other GPUs meanwhile (their grants, drops and
 * requests).  The socket stays the client thread's: a worker that has
 * drained its GPU marks the lock drained, and the client thread sends
 * RELEASED. */

enum release_reason { RELEASE_IDLE, RELEASE_DROP };

/* Called with the mutex held, the lock held and its gate closed; the caller
 * wakes the waiting threads.  Those that found the gate closed meanwhile
 * (during a grant's prefetch, or a release that did not happen) go through
 * now: none needs a new request. */
static void open_gate(int gpu)
{
    struct gpu_lock *lock = &client.locks[gpu];
    lock->want_again = 0;
    /* Idle counts from here: the prefetch before it may take longer than the idle release. */
    lock->seen_activity = atomic_load(&nvshare_gates[gpu].activity);
    lock->activity_changed_at_ms = nvshare_now_ms();
    atomic_store(&nvshare_gates[gpu].open, 1);
}

/* Called with the mutex held: is the job named ticket still the lock's? */
static int job_current(int gpu, unsigned ticket)
{
    return client.locks[gpu].job_ticket == ticket && client.locks[gpu].state == LOCK_HELD;
}

static void job_done(int gpu)
{
    struct gpu_lock *lock = &client.locks[gpu];
    lock->job = JOB_NONE;
    lock->job_taken = 0;
    lock->drop_requested = 0;
}

/* An idle release found the GPU busy after all.  Returns 1 when it goes on
 * as a drop instead: one came meanwhile, and the worker is the one to honour
 * it (the client thread only posts a drop while no job runs). */
static int abort_idle_release(int gpu, unsigned ticket, int gate_closed)
{
    int drop = 0;
    pthread_mutex_lock(&client.mutex);
    if (job_current(gpu, ticket)) {
        drop = client.locks[gpu].drop_requested;
        if (!drop) {
            job_done(gpu);
            if (gate_closed)
                open_gate(gpu);
            else
                client.locks[gpu].activity_changed_at_ms = nvshare_now_ms();
        }
    }
    pthread_cond_broadcast(&client.changed);
    pthread_mutex_unlock(&client.mutex);
    if (!drop)
        nvshare_client_wake(); /* its idle watch goes on */
    return drop;
}

/* The driver refuses cuCtxSynchronize during a capture of any mode, from any
 * thread, and invalidates the capture (capture.c).  Wait for it to end, but
 * not past the agent's drop grace: by then the lock is revoked anyway. */
static void wait_for_captures_to_end(void)
{
    pthread_mutex_lock(&client.mutex);
    double grace_ms = client.have_settings ? client.settings.drop_grace_ms : 5000;
    pthread_mutex_unlock(&client.mutex);
    double deadline = nvshare_now_ms() + grace_ms;
    while (atomic_load(&nvshare_active_captures) > 0 && nvshare_now_ms() < deadline) {
        struct timespec pause = {.tv_nsec = 1000000};
        nanosleep(&pause, NULL);
    }
}

static void synchronize_context(int gpu, int slot, void *unused)
{
    (void)gpu, (void)slot, (void)unused;
    nvshare_driver.ctx_synchronize();
}

/* Close the gate, let submissions in progress leave it, wait for the GPU to
 * finish what was submitted, then mark the lock drained.  Runs on the GPU's
 * worker (never an application thread: no application launch ever
 * synchronises). */
static void drain(int gpu, enum release_reason reason, unsigned ticket)
{
    struct nvshare_gate *gate = &nvshare_gates[gpu];
    struct gpu_lock *lock = &client.locks[gpu];
    double started = nvshare_now_ms();

    /* No passage, but the GPU still runs what was queued (a thread may be
     * waiting for it in the queue bound, making no passage meanwhile): not
     * idle yet.  The idle time counts from when that work is done. */
    if (reason == RELEASE_IDLE && nvshare_queue_work_pending(gpu)) {
        if (!abort_idle_release(gpu, ticket, 0))
            return;
        reason = RELEASE_DROP;
    }
    pthread_mutex_lock(&client.mutex);
    if (!job_current(gpu, ticket)) {
        pthread_mutex_unlock(&client.mutex);
        return;
    }
    unsigned idle_activity = lock->seen_activity;
    atomic_store(&gate->open, 0);
    pthread_mutex_unlock(&client.mutex);

    for (unsigned spins = 0; atomic_load(&gate->inflight) != 0; spins++) {
        struct timespec pause = {.tv_nsec = spins < 100 ? 20000 : 1000000};
        nanosleep(&pause, NULL);
    }
    /* A launch got in just before the gate closed (not idle after all), or
     * a capture is open (its end would be waited for). */
    if (reason == RELEASE_IDLE && (atomic_load(&gate->activity) != idle_activity ||
                                   atomic_load(&nvshare_active_captures) > 0)) {
        if (!abort_idle_release(gpu, ticket, 1))
            return;
        reason = RELEASE_DROP;
    }
    wait_for_captures_to_end();
    nvshare_in_each_context(gpu, synchronize_context, NULL);
    double drained = nvshare_now_ms();

    pthread_mutex_lock(&client.mutex);
    int current = job_current(gpu, ticket);
    uint64_t lease = lock->lease;
    double held_ms = drained - lock->granted_at_ms;
    if (current)
        lock->drained = 1;
    pthread_mutex_unlock(&client.mutex);
    if (!current)
        return;
    nvshare_debug("release gpu=%d lease=%llu reason=%s held_ms=%.1f drain_ms=%.2f", gpu,
                  (unsigned long long)lease, reason == RELEASE_IDLE ? "idle" : "drop", held_ms,
                  drained - started);
    nvshare_client_wake(); /* the client thread sends RELEASED */
}

static void prefetch_then_open(int gpu, unsigned ticket)
{
    nvshare_in_one_context(gpu, nvshare_memory_prefetch, NULL);
    pthread_mutex_lock(&client.mutex);
    struct gpu_lock *lock = &client.locks[gpu];
    int current = job_current(gpu, ticket), drop = current && lock->drop_requested;
    uint64_t lease = lock->lease;
    double since_grant_ms = nvshare_now_ms() - lock->granted_at_ms;
    if (current && !drop) {
        job_done(gpu);
        open_gate(gpu);
    }
    if (drop)
        lock->job = JOB_RELEASE_DROP; /* a drop came during the prefetch */
    pthread_cond_broadcast(&client.changed);
    pthread_mutex_unlock(&client.mutex);
    if (current)
        nvshare_debug("gate gpu=%d lease=%llu %s ms_after_grant=%.2f", gpu,
                      (unsigned long long)lease, drop ? "stays closed for a drop" : "open",
                      since_grant_ms);
    if (current && !drop)
        nvshare_client_wake(); /* its idle watch starts now */
    if (drop)
        drain(gpu, RELEASE_DROP, ticket);
}

static void run_job(int gpu, enum lock_job job, unsigned ticket)
{
    if (job == JOB_PREFETCH)
        prefetch_then_open(gpu, ticket);
    else
        drain(gpu, job == JOB_RELEASE_IDLE ? RELEASE_IDLE : RELEASE_DROP, ticket);
}

static void *gpu_worker_main(void *argument)
{
    int gpu = (int)(intptr_t)argument;
    char name[16];
    snprintf(name, sizeof name, "nvshare-gpu%d", gpu);
    prctl(PR_SET_NAME, name, 0, 0, 0);
    /* Its driver calls are the shim's own (prefetches, synchronisations):
     * none may invalidate an application's capture. */
    nvshare_capture_relax();
    pthread_mutex_lock(&client.mutex);
    for (;;) {
        struct gpu_lock *lock = &client.locks[gpu];
        if (lock->job == JOB_NONE || lock->job_taken) {
            pthread_cond_wait(&client.workers[gpu].wake, &client.mutex);
            continue;
        }
        lock->job_taken = 1;
        enum lock_job job = lock->job;
        unsigned ticket = lock->job_ticket;
        pthread_mutex_unlock(&client.mutex);
        run_job(gpu, job, ticket);
        pthread_mutex_lock(&client.mutex);
    }
    return NULL;
}

/* Called with the mutex held, by the client thread: hands job to gpu's
 * worker.  Returns the job's ticket when no worker could be started, and
 * the caller runs it itself once it has let go of the mutex; 0 otherwise. */
static unsigned post_job(int gpu, enum lock_job job)
{
    struct gpu_lock *lock = &client.locks[gpu];
    struct gpu_worker *worker = &client.workers[gpu];
    if (++worker->last_ticket == 0)
        worker->last_ticket = 1; /* 0 names no job */
    lock->job = job;
    lock->job_ticket = worker->last_ticket;
    lock->job_taken = 0;
    lock->drop_requested = 0;
    if (!worker->started && nvshare_start_shim_thread(gpu_worker_main, (void *)(intptr_t)gpu) == 0)
        worker->started = 1;
    if (worker->started) {
        pthread_cond_signal(&worker->wake);
        return 0;
    }
    NVSHARE_WARN_ONCE(
        "cannot start a GPU worker thread: lock transitions wait on the client thread");
    lock->job_taken = 1;
    return lock->job_ticket;
}

/* Locks whose GPU a worker has drained: forget them and tell the agent. */
static void send_releases(void)
{
    struct {
        int gpu;
        uint64_t lease;
    } released[NVSHARE_MAX_GPUS];
    int count = 0, again = 0;
    pthread_mutex_lock(&client.mutex);
    for (int gpu = 0; gpu < nvshare_gpu_count(); gpu++) {
        struct gpu_lock *lock = &client.locks[gpu];
        if (!lock->drained)
            continue;
        released[count].gpu = gpu;
        released[count++].lease = lock->lease;
        int wanted = lock->want_again;
        memset(lock, 0, sizeof *lock);
        if (wanted) {
            lock->state = LOCK_WANTED; /* asked again right after RELEASED */
            again = 1;
        }
    }
    pthread_mutex_unlock(&client.mutex);
    for (int i = 0; i < count; i++) {
        if (nvshare_send_lock_message(NVSHARE_MSG_RELEASED, released[i].gpu, released[i].lease) !=
            0) {
            nvshare_lose_agent("release not sent");
            return;
        }
    }
    if (again)
        nvshare_client_wake();
}

static void on_grant(int gpu, uint64_t lease, uint32_t flags)
{
    struct gpu_lock *lock = &client.locks[gpu];
    pthread_mutex_lock(&client.mutex);
    if (lock->state != LOCK_REQUESTED) {
        int duplicate = lock->state == LOCK_HELD && lock->lease == lease;
        pthread_mutex_unlock(&client.mutex);
        nvshare_debug("grant gpu=%d lease=%llu not asked for: %s", gpu, (unsigned long long)lease,
                      duplicate ? "ignored" : "released");
        if (!duplicate && nvshare_send_lock_message(NVSHARE_MSG_RELEASED, gpu, lease) != 0)
            nvshare_lose_agent("release not sent");
        return;
    }
    double now = nvshare_now_ms();
    lock->state = LOCK_HELD;
    lock->lease = lease;
    lock->shared = (flags & NVSHARE_GRANT_SHARED) != 0;
    lock->granted_at_ms = now;
    int shared = lock->shared;
    double waited_ms = now - lock->requested_at_ms;
    unsigned inline_ticket = 0;
    if (nvshare_config()->prefetch) {
        inline_ticket = post_job(gpu, JOB_PREFETCH); /* the worker opens the gate */
    } else {
        open_gate(gpu);
        pthread_cond_broadcast(&client.changed);
    }
    pthread_mutex_unlock(&client.mutex);
    nvshare_debug("grant gpu=%d lease=%llu mode=%s waited_ms=%.2f", gpu, (unsigned long long)lease,
                  shared ? "shared" : "exclusive", waited_ms);
    if (inline_ticket)
        run_job(gpu, JOB_PREFETCH, inline_ticket);
}

static void on_drop_request(int gpu, uint64_t lease)
{
    struct gpu_lock *lock = &client.locks[gpu];
    unsigned inline_ticket = 0;
    pthread_mutex_lock(&client.mutex);
    int ours = lock->state == LOCK_HELD && lock->lease == lease;
    if (ours && lock->job == JOB_NONE)
        inline_ticket = post_job(gpu, JOB_RELEASE_DROP);
    else if (ours)
        lock->drop_requested = 1; /* the running job ends in a release */
    pthread_mutex_unlock(&client.mutex);
    nvshare_debug("drop gpu=%d lease=%llu%s", gpu, (unsigned long long)lease,
                  ours ? "" : " (stale, ignored)");
    if (inline_ticket)
        run_job(gpu, JOB_RELEASE_DROP, inline_ticket);
}

static void on_revoked(int gpu, uint64_t lease)
{
    struct gpu_lock *lock = &client.locks[gpu];
    pthread_mutex_lock(&client.mutex);
    if (lock->state == LOCK_HELD && lock->lease == lease) {
        atomic_store(&nvshare_gates[gpu].open, 0);
        int again = lock->want_again;
        memset(lock, 0, sizeof *lock);
        if (again) {
            lock->state = LOCK_WANTED;
            nvshare_client_wake();
        }
        pthread_cond_broadcast(&client.changed);
    }
    pthread_mutex_unlock(&client.mutex);
    NVSHARE_WARN_ONCE("the nvshare agent revoked this process's lock of a GPU (a drop request "
                      "was not honoured in time)");
    nvshare_debug("revoked gpu=%d lease=%llu", gpu, (unsigned long long)lease);
}

static void on_frame(const struct nvshare_header *header, const unsigned char *payload)
{
    switch (header->type) {
    case NVSHARE_MSG_SETTINGS:
        if (header->payload_bytes != sizeof(struct nvshare_settings))
            break;
        pthread_mutex_lock(&client.mutex);
        memcpy(&client.settings, payload, sizeof client.settings);
        client.have_settings = 1;
        pthread_mutex_unlock(&client.mutex);
        nvshare_debug("settings anti_thrash=%u time_quantum_ms=%u idle_release_ms=%u",
                      client.settings.anti_thrash, client.settings.time_quantum_ms,
                      client.settings.idle_release_ms);
        return;
    case NVSHARE_MSG_LOCK_GRANT:
    case NVSHARE_MSG_DROP_REQUEST:
    case NVSHARE_MSG_REVOKED: {
        struct nvshare_lock_message message;
        if (header->payload_bytes != sizeof message)
            break;
        memcpy(&message, payload, sizeof message);
        int gpu = nvshare_gpu_of_uuid(&message.gpu);
        if (gpu < 0)
            return;
        if (header->type == NVSHARE_MSG_LOCK_GRANT)
            on_grant(gpu, message.lease, message.flags);
        else if (header->type == NVSHARE_MSG_DROP_REQUEST)
            on_drop_request(gpu, message.lease);
        else
            on_revoked(gpu, message.lease);
        return;
    }
    case NVSHARE_MSG_ERROR: {
        struct nvshare_error error;
        if (header->payload_bytes != sizeof error)
            break;
        memcpy(&error, payload, sizeof error);
        error.text[sizeof error.text - 1] = '\0';
        NVSHARE_WARN_ONCE("the nvshare agent refused this process: %s", error.text);
        nvshare_lose_agent("agent sent an error");
        return;
    }
    default:
        break;
    }
    nvshare_debug("ignored a frame of type %u with %u payload bytes", header->type,
                  header->payload_bytes);
}

static void read_frames(void)
{
    int status = nvshare_wire_receive(client.socket_fd, &client.inbox);
    if (status <= 0) {
        nvshare_lose_agent(status == 0 ? "connection closed" : strerror(errno));
        return;
    }
    struct nvshare_header header;
    unsigned char payload[NVSHARE_MAX_PAYLOAD_BYTES];
    while (client.socket_fd >= 0 &&
           (status = nvshare_wire_next_frame(&client.inbox, &header, payload)) != 0) {
        if (status < 0) {
            NVSHARE_WARN_ONCE("the nvshare agent speaks another protocol (magic 0x%x, "
                              "version %u; this shim speaks %u)",
                              header.magic, header.version, NVSHARE_PROTOCOL_VERSION);
            nvshare_lose_agent("protocol mismatch");
            return;
        }
        on_frame(&header, payload);
    }
}

/* ---- the thread -------------------------------------------------------------------------- */

static void send_wanted_requests(void)
{
    int wanted[NVSHARE_MAX_GPUS], count = 0;
    pthread_mutex_lock(&client.mutex);
    for (int gpu = 0; gpu < nvshare_gpu_count(); gpu++) {
        if (client.locks[gpu].state == LOCK_WANTED) {
            client.locks[gpu].state = LOCK_REQUESTED;
            client.locks[gpu].requested_at_ms = nvshare_now_ms();
            wanted[count++] = gpu;
        }
    }
    pthread_mutex_unlock(&client.mutex);
    for (int i = 0; i < count; i++) {
        nvshare_debug("request gpu=%d", wanted[i]);
        if (nvshare_send_lock_message(NVSHARE_MSG_LOCK_REQUEST, wanted[i], 0) != 0) {
            nvshare_lose_agent("request not sent");
            return;
        }
    }
}

static void send_memory_reports(void)
{
    for (int gpu = 0; gpu < nvshare_gpu_count() && client.socket_fd >= 0; gpu++) {
        struct nvshare_memory_report report = {.gpu = *nvshare_gpu_uuid(gpu)};
        if (!nvshare_memory_take_report(gpu, &report.managed_bytes, &report.unmanaged_bytes))
            continue;
        if (nvshare_send_frame(NVSHARE_MSG_MEMORY_REPORT, &report, sizeof report) != 0)
            nvshare_lose_agent("memory report not sent");
    }
}

/* Early release: a held, exclusive GPU whose gate saw no passage for
 * idle_release_ms (its worker then checks that no work this process queued
 * is still running).  Returns the poll timeout until the next look. */
static int release_idle_gpus(void)
{
    pthread_mutex_lock(&client.mutex);
    unsigned idle_ms = client.have_settings ? client.settings.idle_release_ms : 0;
    int exclusive_holds = 0, inline_gpus[NVSHARE_MAX_GPUS], inline_count = 0;
    unsigned inline_tickets[NVSHARE_MAX_GPUS];
    double now = nvshare_now_ms();
    for (int gpu = 0; gpu < nvshare_gpu_count() && idle_ms > 0; gpu++) {
        struct gpu_lock *lock = &client.locks[gpu];
        if (lock->state != LOCK_HELD || lock->shared || !atomic_load(&nvshare_gates[gpu].open))
            continue;
        exclusive_holds++;
        /* While a job is posted, seen_activity stays what the idle decision saw:
         * its worker may start late (waiting for the contexts' mutex) and must
         * count the passages made since the decision, not since this look. */
        if (lock->job != JOB_NONE)
            continue;
        unsigned activity = atomic_load(&nvshare_gates[gpu].activity);
        if (activity != lock->seen_activity) {
            lock->seen_activity = activity;
            lock->activity_changed_at_ms = now;
        } else if (lock->job == JOB_NONE && now - lock->activity_changed_at_ms >= idle_ms) {
            unsigned ticket = post_job(gpu, JOB_RELEASE_IDLE);
            if (ticket) {
                inline_gpus[inline_count] = gpu;
                inline_tickets[inline_count++] = ticket;
            }
        }
    }
    pthread_mutex_unlock(&client.mutex);
    for (int i = 0; i < inline_count; i++)
        run_job(inline_gpus[i], JOB_RELEASE_IDLE, inline_tickets[i]);
    if (exclusive_holds == 0)
        return -1;
    int step = (int)(idle_ms / 4);
    return step < 1 ? 1 : step > 250 ? 250 : step;
}

void *nvshare_client_main(void *unused)
{
    (void)unused;
    prctl(PR_SET_NAME, "nvshare-client", 0, 0, 0);
    /* Every driver call of this thread is the shim's own (prefetches, their
     * stream's synchronisation): none may invalidate an application's capture. */
    nvshare_capture_relax();
    nvshare_connect_to_agent(1);
    for (;;) {
        int timeout = -1;
        if (client.socket_fd >= 0)
            send_releases();
        if (client.socket_fd >= 0) {
            send_wanted_requests();
            send_memory_reports();
        }
        if (client.socket_fd >= 0)
            timeout = release_idle_gpus();
        if (client.socket_fd < 0) {
            double wait = client.retry_at_ms - nvshare_now_ms();
            timeout = wait < 0 ? 0 : (int)wait + 1;
        }
        struct pollfd watched[2] = {
            {.fd = nvshare_doorbell_fd(), .events = POLLIN},
            {.fd = client.socket_fd, .events = POLLIN},
        };
        int ready = poll(watched, client.socket_fd >= 0 ? 2 : 1, timeout);
        if (ready < 0 && errno != EINTR) {
            struct timespec pause = {.tv_nsec = 10000000};
            nanosleep(&pause, NULL);
        }
        if (ready > 0 && (watched[0].revents & POLLIN))
            nvshare_doorbell_drain();
        if (client.socket_fd >= 0 && ready > 0 && watched[1].revents)
            read_frames();
        if (client.socket_fd < 0 && nvshare_now_ms() >= client.retry_at_ms)
            nvshare_connect_to_agent(0);
    }
    return NULL;
}
