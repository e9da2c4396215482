/*
 * Bounded queue-ahead.  A process may queue seconds of kernels ahead of the
 * GPU; on a drop request the release must wait for all of it, so a holder
 * could keep the GPU long past its quantum.  Every RECORD_EVERY launches of a
 * thread an event is recorded on the launch's stream (events are created once
 * and reused from a ring); completed events give the GPU time per window, and
 * when the windows still queued would take longer than NVSHARE_MAX_QUEUED_MS
 * the launching thread waits on an old enough event.  This costs nothing on
 * most launches and never synchronises the whole context on the launch path.
 */
#include "queue_bound.h"

#include <pthread.h>
#include <string.h>

#include "config.h"
#include "gate.h"
#include "hooks.h"
#include "interpose.h"
#include "nvshare_protocol.h"

#define RECORD_EVERY 8
#define RING_SLOTS 64
/* The slot just completed stays intact for the next elapsed-time sample. */
#define MAX_PENDING (RING_SLOTS - 2)
/* Marks queued before the first measurement bounds the queue. */
#define LEARNING_PENDING 2

struct mark {
    CUevent event;
    CUstream stream;
};

struct launch_queue {
    pthread_mutex_t mutex;
    CUcontext context;              /* events belong to this context */
    struct mark ring[RING_SLOTS];
    unsigned head, tail;            /* pending marks: head..tail-1 (mod RING_SLOTS) */
    int have_completed;             /* ring[head - 1] holds the newest completed mark */
    double ms_per_window;           /* moving average; 0 until measured */
};

static struct launch_queue queues[NVSHARE_MAX_GPUS];
static pthread_once_t queues_once = PTHREAD_ONCE_INIT;
static __thread unsigned launches_since_mark;

static void init_queues(void)
{
    for (int gpu = 0; gpu < NVSHARE_MAX_GPUS; gpu++)
        pthread_mutex_init(&queues[gpu].mutex, NULL);
}

static int is_per_thread(int hook_id)
{
    const char *name = nvshare_hooks[hook_id].name;
    size_t length = strlen(name);
    return length > 5 && strcmp(name + length - 5, "_ptsz") == 0;
}

/* Pops completed marks, learning the GPU time per window. */
static void collect_completed(struct launch_queue *queue)
{
    while (queue->head != queue->tail) {
        struct mark *mark = &queue->ring[queue->head % RING_SLOTS];
        if (nvshare_driver.event_query(mark->event) != CUDA_SUCCESS)
            return;
        struct mark *previous = &queue->ring[(queue->head + RING_SLOTS - 1) % RING_SLOTS];
        float elapsed_ms;
        if (queue->have_completed && previous->stream == mark->stream &&
            nvshare_driver.event_elapsed_time(&elapsed_ms, previous->event, mark->event) ==
                CUDA_SUCCESS && elapsed_ms >= 0) {
            queue->ms_per_window = queue->ms_per_window > 0
                                       ? 0.8 * queue->ms_per_window + 0.2 * elapsed_ms
                                       : elapsed_ms;
        }
        queue->have_completed = 1;
        queue->head++;
    }
}

void nvshare_queue_note_launch(int gpu, CUstream stream, int hook_id)
{
    if (++launches_since_mark < RECORD_EVERY)
        return;
    launches_since_mark = 0;
    unsigned max_queued_ms = nvshare_config()->max_queued_ms;
    if (max_queued_ms == 0 || nvshare_driver.event_record == NULL ||
        nvshare_driver.event_query == NULL || nvshare_driver.event_elapsed_time == NULL)
        return;
    pthread_once(&queues_once, init_queues);
    struct launch_queue *queue = &queues[gpu];
    if (pthread_mutex_trylock(&queue->mutex) != 0)
        return;             /* another thread is taking this mark */
    if (stream == NULL && is_per_thread(hook_id))
        stream = NVSHARE_CU_STREAM_PER_THREAD;
    /* Recording into a stream being captured would add a node to the graph. */
    int capturing = 0;
    if (nvshare_driver.stream_is_capturing != NULL &&
        (nvshare_driver.stream_is_capturing(stream, &capturing) != CUDA_SUCCESS || capturing)) {
        pthread_mutex_unlock(&queue->mutex);
        return;
    }
    CUcontext context = atomic_load_explicit(&nvshare_gates[gpu].context, memory_order_relaxed);
    if (queue->context != context) {
        /* Another context: its events cannot be mixed with the old ones. */
        memset(queue->ring, 0, sizeof queue->ring);
        queue->head = queue->tail = 0;
        queue->have_completed = 0;
        queue->ms_per_window = 0;
        queue->context = context;
    }
    collect_completed(queue);

    CUevent wait_for = NULL;
    if (queue->tail - queue->head < MAX_PENDING) {
        struct mark *mark = &queue->ring[queue->tail % RING_SLOTS];
        if (mark->event != NULL ||
            nvshare_driver.event_create(&mark->event, CU_EVENT_DEFAULT) == CUDA_SUCCESS) {
            if (nvshare_driver.event_record(mark->event, stream) == CUDA_SUCCESS) {
                mark->stream = stream;
                queue->tail++;
            }
        }
    }
    unsigned pending = queue->tail - queue->head;
    if (pending >= MAX_PENDING) {
        wait_for = queue->ring[queue->head % RING_SLOTS].event;
    } else if (queue->ms_per_window <= 0 && pending >= LEARNING_PENDING) {
        /* Nothing measured yet: let two marks complete, which gives the first
         * sample, before queueing further ahead. */
        wait_for = queue->ring[(queue->head + 1) % RING_SLOTS].event;
    } else if (queue->ms_per_window > 0 && pending * queue->ms_per_window > max_queued_ms) {
        /* Wait until at most max_queued_ms of windows are left behind it. */
        unsigned keep = (unsigned)(max_queued_ms / queue->ms_per_window);
        wait_for = queue->ring[(queue->tail - 1 - keep) % RING_SLOTS].event;
    }
    pthread_mutex_unlock(&queue->mutex);
    if (wait_for != NULL)
        nvshare_driver.event_synchronize(wait_for);
}

void nvshare_queue_forget_after_fork(void)
{
    /* The parent's events belong to its contexts; leave them untouched. */
    memset(queues, 0, sizeof queues);
    for (int gpu = 0; gpu < NVSHARE_MAX_GPUS; gpu++)
        queues[gpu].mutex = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    queues_once = PTHREAD_ONCE_INIT;
}
