/* The lock client's state, shared by the application side (gate.c) and the
 * client thread (lock_client.c).  Everything here is guarded by
 * nvshare_lock_client.mutex unless a field says otherwise. */
#ifndef NVSHARE_LOCK_STATE_H
#define NVSHARE_LOCK_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "nvshare_protocol.h"
#include "wire.h"

struct nvshare_gate {
    atomic_int open;      /* 1: held, shared, or unscheduled (no agent) */
    atomic_int inflight;  /* submissions between gate and driver right now */
    atomic_uint activity; /* bumped per passage; idle = unchanged */
} __attribute__((aligned(64)));

extern struct nvshare_gate nvshare_gates[NVSHARE_MAX_GPUS];

/* 1 once the client thread runs. */
extern atomic_int nvshare_client_running;

enum lock_state {
    LOCK_IDLE = 0,  /* not held, nobody waiting */
    LOCK_WANTED,    /* a thread waits; the request is not sent yet */
    LOCK_REQUESTED, /* LOCK_REQUEST sent, no grant yet */
    LOCK_HELD       /* granted (gate open), or being released (gate closed) */
};

/* The slow half of a transition, which runs on the GPU's worker thread
 * (lock_client.c): a grant's prefetch, a release's drain. */
enum lock_job { JOB_NONE = 0, JOB_PREFETCH, JOB_RELEASE_IDLE, JOB_RELEASE_DROP };

struct gpu_lock {
    enum lock_state state;
    uint64_t lease;
    int shared;     /* granted with anti-thrash off */
    int want_again; /* a thread arrived while the lock was being released */
    double requested_at_ms;
    double granted_at_ms;
    unsigned seen_activity; /* idle detection: gate activity at the last look */
    double activity_changed_at_ms;
    enum lock_job job;   /* posted to the GPU's worker, or running there */
    unsigned job_ticket; /* names that posting: a worker drops the results of a job
                                       its lock no longer has (revoked, agent lost) */
    int job_taken;       /* the worker has started it */
    int drop_requested;  /* a drop request came while a job ran */
    int drained;         /* released on the GPU: the client thread sends RELEASED */
};

struct gpu_worker {
    pthread_cond_t wake; /* a job was posted */
    int started;
    unsigned last_ticket;
};

struct lock_client {
    pthread_mutex_t mutex;
    pthread_cond_t changed; /* a gate opened or a lock changed state */
    int socket_fd;          /* -1 while unscheduled; only the client thread uses it */
    struct nvshare_settings settings;
    int have_settings;
    struct gpu_lock locks[NVSHARE_MAX_GPUS];
    struct gpu_worker workers[NVSHARE_MAX_GPUS];
    double retry_at_ms;         /* client thread only */
    struct nvshare_inbox inbox; /* client thread only */
};

extern struct lock_client nvshare_lock_client;

void nvshare_set_all_gates(int open);

/* In a forked child (lifecycle.c). */
void nvshare_lock_forget_after_fork(void);

#endif
