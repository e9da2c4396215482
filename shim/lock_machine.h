/*
 * One GPU's lock as a pure transition: (state, event, now) -> (state, jobs).
 *
 * The machine never touches a thread, a socket, a clock or the driver.  The
 * threads that carry it (lock_state.c under its mutex, the client thread in
 * lock_client.c, the GPU's worker in gpu_worker.c) turn what happened into an
 * event, with the time and the gate's passage counter filled in, step the
 * machine, and carry out the jobs it returns: open or close the gate, wake
 * the threads waiting at it, wake the client thread, send a frame, hand work
 * to the worker.  tests/shim/test_lock_machine.py drives it directly.
 *
 * The text between the BEGIN/END markers is also read by cffi's ffi.cdef()
 * (the test), so it holds only what cdef accepts.
 */
#ifndef NVSHARE_LOCK_MACHINE_H
#define NVSHARE_LOCK_MACHINE_H

#include <stdint.h>

/* BEGIN NVSHARE LOCK MACHINE */
#define NVSHARE_LOCK_MAX_JOBS 8

enum nvshare_lock_phase {
    NVSHARE_LOCK_IDLE = 0,      /* not held, nobody waiting */
    NVSHARE_LOCK_WANTED = 1,    /* a thread waits; the request is not sent yet */
    NVSHARE_LOCK_REQUESTED = 2, /* LOCK_REQUEST sent, no grant yet */
    NVSHARE_LOCK_HELD = 3       /* granted (gate open), or being released (gate closed) */
};

/* The slow half of a transition, which runs on the GPU's worker thread: a
 * grant's prefetch, a release's drain. */
enum nvshare_lock_work {
    NVSHARE_WORK_NONE = 0,
    NVSHARE_WORK_PREFETCH = 1,
    NVSHARE_WORK_RELEASE_IDLE = 2,
    NVSHARE_WORK_RELEASE_DROP = 3
};

struct nvshare_lock_machine {
    uint64_t lease;
    double requested_at_ms;
    double granted_at_ms;
    double activity_changed_at_ms; /* idle detection: when the gate's passages last changed */
    int phase;                     /* enum nvshare_lock_phase */
    int gate_open;                 /* what the gate is: the carrier opens and closes the real one */
    uint32_t grant_flags;          /* enum nvshare_grant_flags of the lease */
    int want_again;                /* a thread arrived while the lock was being released */
    uint32_t seen_activity;        /* idle detection: the gate's passages at the last look */
    int work; /* enum nvshare_lock_work posted to the worker, or running there */
    /* Names that posting: a worker's results for work the lock no longer has
     * (revoked, agent lost) are dropped. */
    uint32_t ticket;
    int work_taken;        /* the worker has started it */
    int drop_requested;    /* a drop request came while work ran */
    int drained;           /* released on the GPU: RELEASED is due */
    int idle_drop;         /* a DROP_REQUEST with NVSHARE_DROP_WHEN_IDLE came for this lease: */
    uint32_t idle_drop_ms; /* release once idle this long (if sooner than idle_release_ms) */
    /* RELEASED's idle_ms: how long no gated call had run when an idle release
     * was decided; 0 for a drop. */
    uint32_t released_idle_ms;
    uint32_t last_ticket;  /* the last ticket given; outlives the lease, so none repeats */
    double released_at_ms; /* when the last lease ended (0: none yet); outlives it too */
};

enum nvshare_lock_event_kind {
    NVSHARE_EVENT_THREAD_WAITS = 1,     /* an application thread found the gate closed */
    NVSHARE_EVENT_SEND_REQUEST = 2,     /* the client thread may send requests now */
    NVSHARE_EVENT_GRANT = 3,            /* LOCK_GRANT: lease, flags, prefetch */
    NVSHARE_EVENT_DROP = 4,             /* DROP_REQUEST: lease, flags */
    NVSHARE_EVENT_REVOKED = 5,          /* REVOKED: lease */
    NVSHARE_EVENT_IDLE_LOOK = 6,        /* the client thread looks for idleness: idle_release_ms */
    NVSHARE_EVENT_TAKE_WORK = 7,        /* the worker looks for posted work */
    NVSHARE_EVENT_PREFETCHED = 8,       /* the worker finished a grant's prefetch: ticket */
    NVSHARE_EVENT_BUSY_AFTER_ALL = 9,   /* an idle release found work: ticket, gate_closed */
    NVSHARE_EVENT_CLOSE_FOR_DRAIN = 10, /* the worker is about to drain: ticket */
    NVSHARE_EVENT_DRAINED = 11,         /* the GPU finished this process's work: ticket */
    NVSHARE_EVENT_SEND_RELEASE = 12,    /* the client thread may send RELEASED now */
    NVSHARE_EVENT_AGENT_LOST = 13,      /* no agent: run unscheduled */
    NVSHARE_EVENT_CONNECTED = 14        /* (re)connected: scheduled from now on */
};

struct nvshare_lock_event {
    int kind; /* enum nvshare_lock_event_kind */
    double now_ms;
    uint32_t activity;          /* the gate's passage counter now */
    uint64_t lease;             /* GRANT, DROP, REVOKED */
    uint32_t flags;             /* GRANT: enum nvshare_grant_flags; DROP: enum nvshare_drop_flags */
    uint32_t idle_ms;           /* DROP with NVSHARE_DROP_WHEN_IDLE: the idle time to release at */
    int prefetch;               /* GRANT: prefetch before the gate opens ... */
    uint32_t prefetch_after_ms; /* ... if the last lease ended at least this long ago */
    uint32_t ticket;            /* the worker's events: the work they are about */
    int gate_closed;            /* BUSY_AFTER_ALL: the worker had closed the gate */
    uint32_t idle_release_ms;   /* IDLE_LOOK: the agent's setting; 0: no idle release */
    int work_pending; /* IDLE_LOOK: its newest mark runs, or a thread is inside a gated call */
};

enum nvshare_lock_job_kind {
    NVSHARE_JOB_SEND_REQUEST = 1,  /* LOCK_REQUEST for this GPU */
    NVSHARE_JOB_SEND_RELEASED = 2, /* RELEASED of lease */
    NVSHARE_JOB_POST_WORK = 3,     /* work is posted for the GPU's worker: wake it */
    NVSHARE_JOB_RUN_WORK = 4,      /* (TAKE_WORK) carry out work, ticket, now */
    NVSHARE_JOB_DRAIN = 5,         /* the worker goes on to drain, as for a drop */
    NVSHARE_JOB_OPEN_GATE = 6,
    NVSHARE_JOB_CLOSE_GATE = 7,
    NVSHARE_JOB_WAKE_WAITERS = 8, /* threads waiting at the gate look again */
    NVSHARE_JOB_WAKE_CLIENT = 9   /* the client thread looks again (its doorbell) */
};

struct nvshare_lock_job {
    int kind; /* enum nvshare_lock_job_kind */
    int work; /* POST_WORK, RUN_WORK: enum nvshare_lock_work */
    uint32_t ticket;
    uint64_t lease;   /* SEND_RELEASED */
    uint32_t idle_ms; /* SEND_RELEASED: the lock message's idle_ms */
};

struct nvshare_lock_jobs {
    struct nvshare_lock_job job[NVSHARE_LOCK_MAX_JOBS];
    int count;
    int stale;              /* the event named a lease or work the lock no longer has */
    int look_in_ms;         /* IDLE_LOOK: look again after this long; -1: no need */
    uint32_t seen_activity; /* CLOSE_FOR_DRAIN: the gate's passages the idle decision saw */
};

/* Applies event to lock; jobs must start empty (count 0). */
void nvshare_lock_machine_step(struct nvshare_lock_machine *lock,
                               const struct nvshare_lock_event *event,
                               struct nvshare_lock_jobs *jobs);
enum nvshare_queue_length {
    NVSHARE_QUEUE_AS_SET = 0,  /* NVSHARE_MAX_QUEUED_MS by the average kernel */
    NVSHARE_QUEUE_SHORT = 1,   /* NVSHARE_MAX_QUEUED_MS by the longest recent kernel */
    NVSHARE_QUEUE_SHORTEST = 2 /* 5 ms by the longest recent kernel */
};

/* How short the queue bound keeps the queue now (enum nvshare_queue_length). */
int nvshare_lock_queue_length(const struct nvshare_lock_machine *lock);
/* END NVSHARE LOCK MACHINE */

#endif
