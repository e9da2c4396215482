/*
 * One GPU's lock, as a pure transition (lock_machine.h).  Plain C: no
 * threads, no system calls, no driver.
 *
 * The lock goes IDLE -> WANTED (a thread waits at the closed gate) ->
 * REQUESTED (the client thread sent LOCK_REQUEST) -> HELD (granted) and back
 * to IDLE once RELEASED is sent.  While HELD, the slow halves of a transition
 * run on the GPU's worker: a grant's prefetch (the gate opens after it) and a
 * release's drain (the gate closes first, then the GPU finishes this
 * process's work).  Each posting of work gets a ticket; the worker's results
 * name it, and results for work the lock no longer has are dropped.
 */
#include "lock_machine.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "nvshare_protocol.h"

#define IDLE_LOOK_MIN_MS 1
#define IDLE_LOOK_MAX_MS 250

static void add(struct nvshare_lock_jobs *jobs, int kind, int work, uint32_t ticket, uint64_t lease)
{
    if (jobs->count < NVSHARE_LOCK_MAX_JOBS)
        jobs->job[jobs->count++] =
            (struct nvshare_lock_job){.kind = kind, .work = work, .ticket = ticket, .lease = lease};
}

static void add_released(struct nvshare_lock_jobs *jobs, uint64_t lease, uint32_t idle_ms)
{
    add(jobs, NVSHARE_JOB_SEND_RELEASED, NVSHARE_WORK_NONE, 0, lease);
    jobs->job[jobs->count - 1].idle_ms = idle_ms;
}

static void add_job(struct nvshare_lock_jobs *jobs, int kind)
{
    add(jobs, kind, NVSHARE_WORK_NONE, 0, 0);
}

/* Forgets the lease and anything about it; the gate and the tickets stay. */
static void forget_lease(struct nvshare_lock_machine *lock)
{
    int gate_open = lock->gate_open;
    uint32_t last_ticket = lock->last_ticket;
    double released_at_ms = lock->released_at_ms;
    memset(lock, 0, sizeof *lock);
    lock->gate_open = gate_open;
    lock->last_ticket = last_ticket;
    lock->released_at_ms = released_at_ms;
}

static void close_gate(struct nvshare_lock_machine *lock, struct nvshare_lock_jobs *jobs)
{
    if (lock->gate_open) {
        lock->gate_open = 0;
        add_job(jobs, NVSHARE_JOB_CLOSE_GATE);
    }
}

/* The lock is held and its gate closed.  Those that found the gate closed
 * meanwhile (during a grant's prefetch, or a release that did not happen) go
 * through now: none needs a new request.  Idle counts from here: the prefetch
 * before it may take longer than the idle release. */
static void open_gate(struct nvshare_lock_machine *lock, const struct nvshare_lock_event *event,
                      struct nvshare_lock_jobs *jobs)
{
    lock->want_again = 0;
    lock->seen_activity = event->activity;
    lock->activity_changed_at_ms = event->now_ms;
    if (!lock->gate_open) {
        lock->gate_open = 1;
        add_job(jobs, NVSHARE_JOB_OPEN_GATE);
    }
}

static void post_work(struct nvshare_lock_machine *lock, int work, struct nvshare_lock_jobs *jobs)
{
    if (++lock->last_ticket == 0)
        lock->last_ticket = 1; /* 0 names no work */
    lock->work = work;
    lock->ticket = lock->last_ticket;
    lock->work_taken = 0;
    lock->drop_requested = 0;
    lock->released_idle_ms = 0; /* an idle release says how long, after posting */
    add(jobs, NVSHARE_JOB_POST_WORK, work, lock->ticket, lock->lease);
}

static void work_done(struct nvshare_lock_machine *lock)
{
    lock->work = NVSHARE_WORK_NONE;
    lock->work_taken = 0;
    lock->drop_requested = 0;
}

/* Is the work named ticket still the lock's? */
static int current(const struct nvshare_lock_machine *lock, uint32_t ticket)
{
    return lock->ticket == ticket && lock->phase == NVSHARE_LOCK_HELD;
}

static int ours(const struct nvshare_lock_machine *lock, uint64_t lease)
{
    return lock->phase == NVSHARE_LOCK_HELD && lock->lease == lease;
}

/* The lease is forgotten; a thread that arrived meanwhile asks again at once. */
static void end_lease(struct nvshare_lock_machine *lock, double now_ms,
                      struct nvshare_lock_jobs *jobs)
{
    int again = lock->want_again;
    forget_lease(lock);
    lock->released_at_ms = now_ms;
    if (again) {
        lock->phase = NVSHARE_LOCK_WANTED;
        add_job(jobs, NVSHARE_JOB_WAKE_CLIENT);
    }
}

static void on_grant(struct nvshare_lock_machine *lock, const struct nvshare_lock_event *event,
                     struct nvshare_lock_jobs *jobs)
{
    if (lock->phase != NVSHARE_LOCK_REQUESTED) {
        /* Not asked for: a duplicate is ignored, anything else given back. */
        jobs->stale = 1;
        if (!ours(lock, event->lease))
            add_released(jobs, event->lease, 0);
        return;
    }
    lock->phase = NVSHARE_LOCK_HELD;
    lock->lease = event->lease;
    lock->grant_flags = event->flags;
    lock->granted_at_ms = event->now_ms;
    /* Back after a short absence (a window of light work, a yield), little can have
     * been evicted, and what was comes back by faults; a prefetch of what stayed
     * resident still costs ~0.7 ms a GiB (H100), at every grant (issue 35).  Unless
     * the agent says another's turn pushed this process out meanwhile (DISPLACED):
     * then faults would bring it back at a sixth of a prefetch's speed. */
    int away_long = lock->released_at_ms <= 0 ||
                    event->now_ms - lock->released_at_ms >= event->prefetch_after_ms;
    int displaced = (event->flags & NVSHARE_GRANT_DISPLACED) != 0;
    if (event->prefetch && (away_long || displaced)) {
        post_work(lock, NVSHARE_WORK_PREFETCH, jobs); /* the worker opens the gate */
    } else {
        open_gate(lock, event, jobs);
        add_job(jobs, NVSHARE_JOB_WAKE_WAITERS);
    }
}

static void on_drop(struct nvshare_lock_machine *lock, const struct nvshare_lock_event *event,
                    struct nvshare_lock_jobs *jobs)
{
    if (!ours(lock, event->lease)) {
        jobs->stale = 1;
        return;
    }
    if (event->flags & NVSHARE_DROP_WHEN_IDLE) {
        /* Someone waits: release through the idle path once idle this long,
         * not at once.  Kept for this lease; a later plain drop still drains. */
        lock->idle_drop = 1;
        lock->idle_drop_ms = event->idle_ms;
        return;
    }
    if (lock->work == NVSHARE_WORK_NONE)
        post_work(lock, NVSHARE_WORK_RELEASE_DROP, jobs);
    else
        lock->drop_requested = 1; /* the running work ends in a release */
}

static void on_revoked(struct nvshare_lock_machine *lock, const struct nvshare_lock_event *event,
                       struct nvshare_lock_jobs *jobs)
{
    if (!ours(lock, event->lease)) {
        jobs->stale = 1;
        return;
    }
    close_gate(lock, jobs);
    end_lease(lock, 0, jobs); /* revoked: another holds the GPU now, the next grant prefetches */
    add_job(jobs, NVSHARE_JOB_WAKE_WAITERS);
}

/* A turn that light work may cut short (granted SHORT_QUEUE: not everyone's memory fits)
 * is bounded by the longest recent kernel, and to 5 ms once others wait (a WHEN_IDLE drop),
 * so that the drop which may follow drains in milliseconds.  Not where everyone's memory
 * fits: light work runs beside the turn, and a yield there goes to busy work that has
 * waited seconds; 5 ms for a whole turn cost a trainer 6 % of its steps on the H100. */
int nvshare_lock_queue_length(const struct nvshare_lock_machine *lock)
{
    if (lock->phase != NVSHARE_LOCK_HELD || !(lock->grant_flags & NVSHARE_GRANT_SHORT_QUEUE))
        return NVSHARE_QUEUE_AS_SET;
    return lock->idle_drop ? NVSHARE_QUEUE_SHORTEST : NVSHARE_QUEUE_SHORT;
}

/* How long this lease may stay idle before it is released: 1 and *limit_ms,
 * or 0 when it is never released for being idle.  Exclusive leases, and
 * shared ones granted with RELEASE_WHEN_IDLE, go after the agent's
 * idle_release_ms; a WHEN_IDLE drop request may ask for less (or, for a
 * plain shared lease, for any). */
static int idle_limit(const struct nvshare_lock_machine *lock, uint32_t idle_release_ms,
                      uint32_t *limit_ms)
{
    int shared = (lock->grant_flags & NVSHARE_GRANT_SHARED) != 0;
    int when_idle = (lock->grant_flags & NVSHARE_GRANT_RELEASE_WHEN_IDLE) != 0;
    int limited = idle_release_ms > 0 && (!shared || when_idle);
    *limit_ms = idle_release_ms;
    if (lock->idle_drop && (!limited || lock->idle_drop_ms < *limit_ms))
        *limit_ms = lock->idle_drop_ms;
    return limited || lock->idle_drop;
}

/* Early release: a held lock whose gate saw no passage, and whose queued work
 * was not seen running, for its idle limit (its worker then checks again that
 * none of the work this process queued still runs). */
static void on_idle_look(struct nvshare_lock_machine *lock, const struct nvshare_lock_event *event,
                         struct nvshare_lock_jobs *jobs)
{
    jobs->look_in_ms = -1;
    uint32_t idle_ms;
    if (lock->phase != NVSHARE_LOCK_HELD || !lock->gate_open ||
        !idle_limit(lock, event->idle_release_ms, &idle_ms))
        return;
    uint32_t step = idle_ms / 4;
    jobs->look_in_ms = step < IDLE_LOOK_MIN_MS   ? IDLE_LOOK_MIN_MS
                       : step > IDLE_LOOK_MAX_MS ? IDLE_LOOK_MAX_MS
                                                 : (int)step;
    /* While work is posted, seen_activity stays what the idle decision saw:
     * its worker may start late (waiting for the contexts' mutex) and must
     * count the passages made since the decision, not since this look. */
    if (lock->work != NVSHARE_WORK_NONE)
        return;
    /* Queued work still running counts as a passage: a thread waiting in the
     * queue bound passes no gate, and its idle time counts from when that work
     * is done, not from its last launch (the worker's own check comes too late
     * where the work ended a moment before and the thread is not back yet). */
    if (event->activity != lock->seen_activity || event->work_pending) {
        lock->seen_activity = event->activity;
        lock->activity_changed_at_ms = event->now_ms;
    } else if (event->now_ms - lock->activity_changed_at_ms >= idle_ms) {
        double idle_for = event->now_ms - lock->activity_changed_at_ms;
        post_work(lock, NVSHARE_WORK_RELEASE_IDLE, jobs);
        lock->released_idle_ms = idle_for < UINT32_MAX ? (uint32_t)idle_for : UINT32_MAX;
    }
}

static void on_take_work(struct nvshare_lock_machine *lock, struct nvshare_lock_jobs *jobs)
{
    if (lock->work == NVSHARE_WORK_NONE || lock->work_taken)
        return;
    lock->work_taken = 1;
    add(jobs, NVSHARE_JOB_RUN_WORK, lock->work, lock->ticket, lock->lease);
}

static void on_prefetched(struct nvshare_lock_machine *lock, const struct nvshare_lock_event *event,
                          struct nvshare_lock_jobs *jobs)
{
    int is_current = current(lock, event->ticket);
    int drop = is_current && lock->drop_requested;
    jobs->stale = !is_current;
    if (is_current && !drop) {
        work_done(lock);
        open_gate(lock, event, jobs);
        add_job(jobs, NVSHARE_JOB_WAKE_CLIENT); /* its idle watch starts now */
    }
    if (drop) {
        lock->work = NVSHARE_WORK_RELEASE_DROP; /* a drop came during the prefetch */
        lock->released_idle_ms = 0;
        add(jobs, NVSHARE_JOB_DRAIN, NVSHARE_WORK_RELEASE_DROP, event->ticket, lock->lease);
    }
    add_job(jobs, NVSHARE_JOB_WAKE_WAITERS);
}

/* An idle release found the GPU busy after all.  It goes on as a drop when
 * one came meanwhile: the worker is the one to honour it (a drop is only
 * posted while no work runs). */
static void on_busy_after_all(struct nvshare_lock_machine *lock,
                              const struct nvshare_lock_event *event,
                              struct nvshare_lock_jobs *jobs)
{
    int drop = 0;
    if (current(lock, event->ticket)) {
        drop = lock->drop_requested;
        if (!drop) {
            work_done(lock);
            if (event->gate_closed)
                open_gate(lock, event, jobs);
            else
                lock->activity_changed_at_ms = event->now_ms;
        }
    } else {
        jobs->stale = 1;
    }
    add_job(jobs, NVSHARE_JOB_WAKE_WAITERS);
    if (drop) {
        lock->released_idle_ms = 0; /* not idle after all: a drop of a busy GPU */
        add(jobs, NVSHARE_JOB_DRAIN, NVSHARE_WORK_RELEASE_DROP, event->ticket, lock->lease);
    } else {
        add_job(jobs, NVSHARE_JOB_WAKE_CLIENT); /* its idle watch goes on */
    }
}

static void on_close_for_drain(struct nvshare_lock_machine *lock,
                               const struct nvshare_lock_event *event,
                               struct nvshare_lock_jobs *jobs)
{
    if (!current(lock, event->ticket)) {
        jobs->stale = 1;
        return;
    }
    jobs->seen_activity = lock->seen_activity;
    close_gate(lock, jobs);
}

static void on_drained(struct nvshare_lock_machine *lock, const struct nvshare_lock_event *event,
                       struct nvshare_lock_jobs *jobs)
{
    if (!current(lock, event->ticket)) {
        jobs->stale = 1;
        return;
    }
    lock->drained = 1;
    add_job(jobs, NVSHARE_JOB_WAKE_CLIENT); /* the client thread sends RELEASED */
}

static void on_send_release(struct nvshare_lock_machine *lock,
                            const struct nvshare_lock_event *event, struct nvshare_lock_jobs *jobs)
{
    if (!lock->drained)
        return;
    add_released(jobs, lock->lease, lock->released_idle_ms);
    end_lease(lock, event->now_ms, jobs); /* asked again right after RELEASED */
}

void nvshare_lock_machine_step(struct nvshare_lock_machine *lock,
                               const struct nvshare_lock_event *event,
                               struct nvshare_lock_jobs *jobs)
{
    switch (event->kind) {
    case NVSHARE_EVENT_THREAD_WAITS:
        if (lock->gate_open)
            break;
        if (lock->phase == NVSHARE_LOCK_IDLE) {
            lock->phase = NVSHARE_LOCK_WANTED;
            add_job(jobs, NVSHARE_JOB_WAKE_CLIENT);
        } else if (lock->phase == NVSHARE_LOCK_HELD) {
            lock->want_again = 1; /* being released: ask again right after */
        }
        break;
    case NVSHARE_EVENT_SEND_REQUEST:
        if (lock->phase == NVSHARE_LOCK_WANTED) {
            lock->phase = NVSHARE_LOCK_REQUESTED;
            lock->requested_at_ms = event->now_ms;
            add_job(jobs, NVSHARE_JOB_SEND_REQUEST);
        }
        break;
    case NVSHARE_EVENT_GRANT:
        on_grant(lock, event, jobs);
        break;
    case NVSHARE_EVENT_DROP:
        on_drop(lock, event, jobs);
        break;
    case NVSHARE_EVENT_REVOKED:
        on_revoked(lock, event, jobs);
        break;
    case NVSHARE_EVENT_IDLE_LOOK:
        on_idle_look(lock, event, jobs);
        break;
    case NVSHARE_EVENT_TAKE_WORK:
        on_take_work(lock, jobs);
        break;
    case NVSHARE_EVENT_PREFETCHED:
        on_prefetched(lock, event, jobs);
        break;
    case NVSHARE_EVENT_BUSY_AFTER_ALL:
        on_busy_after_all(lock, event, jobs);
        break;
    case NVSHARE_EVENT_CLOSE_FOR_DRAIN:
        on_close_for_drain(lock, event, jobs);
        break;
    case NVSHARE_EVENT_DRAINED:
        on_drained(lock, event, jobs);
        break;
    case NVSHARE_EVENT_SEND_RELEASE:
        on_send_release(lock, event, jobs);
        break;
    case NVSHARE_EVENT_AGENT_LOST:
        /* Unscheduled: every gate open, nothing held or asked for. */
        forget_lease(lock);
        if (!lock->gate_open) {
            lock->gate_open = 1;
            add_job(jobs, NVSHARE_JOB_OPEN_GATE);
        }
        add_job(jobs, NVSHARE_JOB_WAKE_WAITERS);
        break;
    case NVSHARE_EVENT_CONNECTED:
        /* Scheduled from now on: the next GPU call asks for the lock.  Threads
         * already waiting (before the first connection) keep their place. */
        if (lock->phase != NVSHARE_LOCK_WANTED)
            forget_lease(lock);
        close_gate(lock, jobs);
        add_job(jobs, NVSHARE_JOB_WAKE_WAITERS);
        break;
    default:
        break;
    }
}
