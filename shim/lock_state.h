/*
 * The lock client's state (lock_state.c): each GPU's lock machine and gate,
 * and the agent's settings, behind one mutex.  The only way to change a lock
 * is a step of its machine (lock_machine.h) through here; the gate and
 * wake-up jobs a step returns are carried out here, under the mutex, and the
 * rest (frames to send, work to start) go back to the caller.
 */
#ifndef NVSHARE_LOCK_STATE_H
#define NVSHARE_LOCK_STATE_H

#include <stdatomic.h>
#include <stdint.h>

#include "lock_machine.h"
#include "nvshare_protocol.h"

/*
 * The per-GPU gate every GATED hook passes (the fast path, gate.h).
 *
 * While this process holds a GPU (or runs unscheduled), passing costs two
 * atomic read-modify-writes and a load: no syscall, no mutex.  Otherwise the
 * caller asks the client thread for the lock and waits
 * (nvshare_lock_wait_for_gate).
 *
 * Why inflight is raised *before* open is read: a release closes the gate and
 * then waits for inflight to reach zero.  With both sides using sequentially
 * consistent operations, either the submitter sees the gate closed (and backs
 * out) or the release sees it inside; a submission can never slip past a
 * release.
 */
struct nvshare_gate {
    atomic_int open;      /* 1: held, shared, or unscheduled (no agent) */
    atomic_int inflight;  /* submissions between gate and driver right now */
    atomic_uint activity; /* bumped per passage; idle = unchanged */
    /* How short the queue bound keeps this process's queue, so that a drop drains
     * fast (queue_bound.c): enum nvshare_queue_length, nvshare_lock_queue_length()'s. */
    atomic_int short_queue;
    /* Another holder with work is owed more GPU time per weight: launches wait
     * (fair_share.c sets it; held_waiting counts the threads waiting). */
    atomic_int held;
    atomic_int held_waiting;
    /* This process is, or was within 10 ms, near a hold (fair_share.c): the queue bound
     * keeps its queue shortest, so that a hold takes effect within milliseconds. */
    atomic_int near_hold;
} __attribute__((aligned(64)));

extern struct nvshare_gate nvshare_gates[NVSHARE_MAX_GPUS];

/* 1 once the client thread runs (lifecycle.c). */
extern atomic_int nvshare_client_running;

/* Steps gpu's machine with event, its time and the gate's activity filled in
 * here.  before (may be NULL) receives the machine as it was. */
void nvshare_lock_step(int gpu, struct nvshare_lock_event *event, struct nvshare_lock_jobs *jobs,
                       struct nvshare_lock_machine *before);
/* The same event for GPUs 0..count-1 under one hold of the mutex;
 * jobs[gpu] receives each one's jobs. */
void nvshare_lock_step_each(int count, const struct nvshare_lock_event *event,
                            struct nvshare_lock_jobs jobs[]);

/* An application thread, at gpu's closed gate: asks for the lock (the client
 * thread hears) and waits until the gate opens or the client stops. */
void nvshare_lock_wait_for_gate(int gpu);

/* gpu's worker: waits until work is posted, takes it. */
void nvshare_lock_wait_for_work(int gpu, int *work, uint32_t *ticket);
/* Takes posted work without waiting (when no worker could be started):
 * 1 and the work, or 0. */
int nvshare_lock_take_work(int gpu, int *work, uint32_t *ticket);

/* How many GPUs' requests wait for a grant. */
int nvshare_lock_requests_waiting(void);

/* The agent's SETTINGS: kept while connected. */
void nvshare_lock_set_settings(const struct nvshare_settings *settings);
/* 1 and *settings when the agent has sent them, else 0. */
int nvshare_lock_settings(struct nvshare_settings *settings);

/* No agent: every lock forgotten (AGENT_LOST), every gate open, the
 * settings forgotten, waiting threads woken. */
void nvshare_lock_run_unscheduled(void);

/* In a forked child (lifecycle.c): as never started, with plain stores. */
void nvshare_lock_forget_after_fork(void);

#endif
