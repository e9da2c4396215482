/*
 * Stand-in driver: events.  A record is an operation on its stream; when the
 * stream's worker reaches it, the event's done_generation catches up with its
 * generation and its time is taken, so query, synchronize, elapsed time and
 * cuStreamWaitEvent see what the fake GPU has really done.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>

#include "standin.h"

static struct CUevent_st *all_events; /* guarded by standin_lock */
#define RETIRED_MAGIC 0x52455452u

/* An event of a torn-down context is an invalid handle; its use is logged as "stale". */
static int valid_event_in(const char *function, CUevent event)
{
    if (event != NULL && event->magic == RETIRED_MAGIC)
        standin_log(function, "event=%p stale", (void *)event);
    return event != NULL && event->magic == EVENT_MAGIC;
}
#define valid_event(event) valid_event_in(__func__, (event))

void standin_retire_context_events(CUcontext ctx)
{
    pthread_mutex_lock(&standin_lock);
    for (struct CUevent_st *event = all_events; event != NULL; event = event->next_event) {
        if (event->ctx == ctx && event->magic == EVENT_MAGIC)
            event->magic = RETIRED_MAGIC;
    }
    pthread_mutex_unlock(&standin_lock);
}

STANDIN_EXPORT CUresult cuEventCreate(CUevent *out, unsigned int flags)
{
    CUresult result = standin_require_ctx();
    if (result == CUDA_SUCCESS && out == NULL)
        result = CUDA_ERROR_INVALID_VALUE;
    CUevent event = NULL;
    if (result == CUDA_SUCCESS && (event = calloc(1, sizeof *event)) == NULL)
        result = CUDA_ERROR_OUT_OF_MEMORY;
    if (result == CUDA_SUCCESS) {
        event->magic = EVENT_MAGIC;
        event->ctx = standin_current_ctx();
        pthread_mutex_lock(&standin_lock);
        event->next_event = all_events;
        all_events = event;
        pthread_mutex_unlock(&standin_lock);
        *out = event;
    }
    standin_log("cuEventCreate", "flags=%u event=%p result=%d", flags, (void *)event, result);
    return result;
}

static CUresult event_record(const char *function, CUevent event, CUstream s)
{
    if (!valid_event(event))
        return CUDA_ERROR_INVALID_HANDLE;
    struct standin_op *op = standin_new_op(OP_EVENT);
    if (op == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&standin_lock);
    op->u.event.event = event;
    op->u.event.generation = ++event->generation;
    pthread_mutex_unlock(&standin_lock);
    char detail[64];
    snprintf(detail, sizeof detail, "event=%p", (void *)event);
    return standin_submit(function, s, op, detail);
}

STANDIN_EXPORT CUresult cuEventRecord(CUevent e, CUstream s)
{
    return event_record("cuEventRecord", e, s);
}
STANDIN_EXPORT CUresult cuEventRecord_ptsz(CUevent e, CUstream s)
{
    return event_record("cuEventRecord_ptsz", e, s);
}

STANDIN_EXPORT CUresult cuEventSynchronize(CUevent event)
{
    if (!valid_event(event))
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult refused = standin_capture_check_unsafe("cuEventSynchronize");
    if (refused != CUDA_SUCCESS) {
        standin_log("cuEventSynchronize", "event=%p result=%d", (void *)event, refused);
        return refused;
    }
    pthread_mutex_lock(&standin_lock);
    while (event->done_generation < event->generation)
        pthread_cond_wait(&standin_progress, &standin_lock);
    pthread_mutex_unlock(&standin_lock);
    standin_log("cuEventSynchronize", "event=%p", (void *)event);
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuEventQuery(CUevent event)
{
    if (!valid_event(event))
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult refused = standin_capture_check_unsafe("cuEventQuery");
    if (refused != CUDA_SUCCESS) {
        standin_log("cuEventQuery", "event=%p result=%d", (void *)event, refused);
        return refused;
    }
    pthread_mutex_lock(&standin_lock);
    CUresult result =
        event->done_generation < event->generation ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
    pthread_mutex_unlock(&standin_lock);
    standin_log("cuEventQuery", "event=%p result=%d", (void *)event, result);
    return result;
}

static CUresult elapsed(const char *function, float *ms, CUevent start, CUevent end)
{
    standin_log(function, "start=%p end=%p", (void *)start, (void *)end);
    if (ms == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!valid_event(start) || !valid_event(end))
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult result = CUDA_SUCCESS;
    pthread_mutex_lock(&standin_lock);
    if (start->generation == 0 || end->generation == 0)
        result = CUDA_ERROR_INVALID_HANDLE;
    else if (start->done_generation < start->generation || end->done_generation < end->generation)
        result = CUDA_ERROR_NOT_READY;
    else
        *ms = (float)((double)(end->when.tv_sec - start->when.tv_sec) * 1e3 +
                      (double)(end->when.tv_nsec - start->when.tv_nsec) / 1e6);
    pthread_mutex_unlock(&standin_lock);
    return result;
}

STANDIN_EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    return elapsed("cuEventElapsedTime", ms, a, b);
}
STANDIN_EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b)
{
    return elapsed("cuEventElapsedTime_v2", ms, a, b);
}

STANDIN_EXPORT CUresult cuEventDestroy_v2(CUevent event)
{
    standin_log("cuEventDestroy_v2", "event=%p", (void *)event);
    if (!valid_event(event))
        return CUDA_ERROR_INVALID_HANDLE;
    /* A record still queued would touch the event: let it land first. */
    pthread_mutex_lock(&standin_lock);
    while (event->done_generation < event->generation)
        pthread_cond_wait(&standin_progress, &standin_lock);
    event->magic = 0;
    for (struct CUevent_st **link = &all_events; *link != NULL; link = &(*link)->next_event) {
        if (*link == event) {
            *link = event->next_event;
            break;
        }
    }
    pthread_mutex_unlock(&standin_lock);
    free(event);
    return CUDA_SUCCESS;
}

static CUresult wait_event(const char *function, CUstream s, CUevent event)
{
    if (!valid_event(event))
        return CUDA_ERROR_INVALID_HANDLE;
    struct standin_op *op = standin_new_op(OP_WAIT_EVENT);
    if (op == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&standin_lock);
    op->u.wait.event = event;
    op->u.wait.generation = event->generation;
    pthread_mutex_unlock(&standin_lock);
    return standin_submit(function, s, op, "wait=event");
}

STANDIN_EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags)
{
    (void)flags;
    return wait_event("cuStreamWaitEvent", s, e);
}
STANDIN_EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned int flags)
{
    (void)flags;
    return wait_event("cuStreamWaitEvent_ptsz", s, e);
}
