/*
 * Bounded queue-ahead.  A process may queue seconds of kernels ahead of the
 * GPU; on a drop request the release must wait for all of it, so a holder
 * could keep the GPU long past its quantum.  Every few launches of a thread
 * an event (a mark) is recorded on the launch's stream (events are created
 * once and reused from a ring); completed marks give the GPU time per launch,
 * and when the launches still queued would take longer than
 * NVSHARE_MAX_QUEUED_MS the launching thread waits on an old enough mark.
 * Most launches pay one relaxed store for it (how many launches since the last
 * mark, for the usage meter); it never synchronises the whole context on the
 * launch path.
 *
 * How few launches make a mark adapts: windows of about 1/8 of the bound are
 * fine enough, and each mark costs a few driver calls (an event record among
 * them), which at 8 launches a mark added ~0.5 us to every launch of a loop of
 * empty kernels on the H100.  So short kernels take a mark every 8 launches or
 * more; kernels of MARK_COVERS_MS or longer take one at every launch, which
 * costs them under 1 %: 8 of a trainer's 18 ms kernels queued between two
 * marks made a drop wait up to 300 ms for them (issue 35).
 *
 * Two estimates.  The average (a moving one) serves the bound as configured.
 * The longest recent window's time per launch serves the short bound (below):
 * kernels differ (a trainer's 18 ms GEMMs among many short ones), and by the
 * average a whole 330 ms step was queued, so that every drop waited for it (up
 * to 350 ms on the H100, issue 35).  It rises with any dense sample above it and
 * falls slowly, by the time the samples cover (ESTIMATE_DECAY_MS).  Not for the
 * configured bound: beside another process, a window's GPU time includes the
 * other's kernels (time-slicing), so a notebook beside a trainer took its own
 * small products for 18 ms ones and waited in the bound between them (its 15 ms
 * cells took 130-170 ms).
 *
 * The time between two marks is GPU time only if the GPU had the second
 * window's work queued when it finished the first (the first was still pending
 * when the second was recorded: a dense window).  Otherwise the GPU waited for
 * the host in between (an inference server's 50 ms between requests), and the
 * sample is an upper bound only: it may lower the estimate, never raise it.  An
 * estimate taught by the gaps once made light work wait in the bound for its
 * own kernels: 40-65 % on its median latency beside a trainer (issue 35).
 *
 * Two more uses: the usage meter (usage_meter.c) asks whether the newest mark is
 * still pending, or the launches after it should still run (note_newest_mark), and
 * once a burst is done, its GPU time by the marks' timestamps from an event recorded
 * before the burst's first launch (nvshare_queue_before_launch); and the launch after
 * the GPU ran dry is marked at once (a lone long kernel is then covered).  A lease granted SHORT_QUEUE (a turn that light work
 * will cut short) is bounded by the longest estimate, and while others wait for
 * this GPU (a WHEN_IDLE drop pending) the bound is SHORT_MAX_QUEUED_MS by it, so
 * that the drop which follows drains in milliseconds (lock_machine.c's
 * nvshare_lock_queue_length: only on such a lease).  (With 5 ms for the whole
 * turn, the mix's trainer kept 0.82x of its solo rate beside light work that cut
 * its turns short ten times a second, 0.85x with this; alone under SHORT_QUEUE it
 * runs at its plain rate, 2.738 steps/s both, on the H100.)
 */
#include "queue_bound.h"

#include <limits.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <string.h>

#include "capture.h"
#include "config.h"
#include "contexts.h"
#include "hooks.h"
#include "driver.h"
#include "lock_state.h"
#include "nvshare_protocol.h"

#define MIN_LAUNCHES_PER_MARK 8
/* GPU time a mark covers at the least: ~4 us of driver calls per 0.5 ms. */
#define MARK_COVERS_MS 0.5
/* Also caps how much a sudden switch to long kernels can queue before the
 * first of them completes and shrinks the windows again. */
#define MAX_LAUNCHES_PER_MARK 256
#define WINDOWS_PER_BOUND     8.0
#define RING_SLOTS            64
/* The slot just completed stays intact for the next elapsed-time sample. */
#define MAX_PENDING (RING_SLOTS - 2)
/* Marks queued before the first measurement bounds the queue. */
#define LEARNING_PENDING 2
/* The estimate falls by e at most per this much of the time the samples cover. */
#define ESTIMATE_DECAY_MS 500.0
/* The short bound: one or two of a trainer's kernels. */
#define SHORT_MAX_QUEUED_MS 5

struct mark {
    CUevent event;
    CUstream stream;
    unsigned long recorder; /* the per-thread default stream is one handle for many streams */
    unsigned launches;      /* the window it closes: launches since the thread's last mark */
    int dense;              /* recorded while the mark before it was still pending */
};

/* One per GPU and context (contexts.c): events belong to their context. */
struct launch_queue {
    /* Launches since the last launching thread's last try at a mark: stored at every
     * launch, so on a line apart from those every launch reads (at the end). */
    alignas(64) atomic_uint unmarked;
    atomic_uint ns_per_launch; /* ms_per_launch, for the usage meter's look */
    /* The usage meter's own (the client thread's): the launches after a completed
     * mark, and when they should be done. */
    unsigned tail_launches;
    CUevent tail_after;
    double tail_done_ms;
    struct mark ring[RING_SLOTS];
    unsigned head, tail;           /* pending marks: head..tail-1 (mod RING_SLOTS) */
    int have_completed;            /* ring[head - 1] holds the newest completed mark */
    double ms_per_launch;          /* GPU time, moving average; 0 until measured */
    double longest_ms_per_launch;  /* the longest recent window's, for the short bound */
    atomic_uint launches_per_mark; /* read on every launch, without the mutex */
    atomic_int ran_dry;            /* no mark pending at the usage meter's look: mark next launch */
    atomic_int length_seen;        /* the gate's queue length at the last mark: a change marks */
    _Atomic(CUevent) newest;       /* the mark recorded last: the usage meter's look, lock-free */
    /* A burst's GPU time by timestamps (note_newest_mark): its start is recorded before
     * the first launch after the meter saw the GPU dry. */
    atomic_int start_wanted;   /* the meter saw every mark done: the next launch starts a burst */
    CUevent burst_start;       /* written under the mutex */
    atomic_uint burst;         /* the current burst's number (next_burst's); 0: none yet */
    atomic_uint started_burst; /* the burst whose start was recorded */
    atomic_uint newest_burst;  /* the burst the newest mark belongs to */
    unsigned settled;          /* the meter's: 1 + the burst it saw every mark of done */
};

/* Burst numbers, for every queue: a context's queue is zeroed when it goes (and after
 * fork), and the meter must never take a new burst for an old one. */
static atomic_uint next_burst;

static struct launch_queue queues[NVSHARE_MAX_GPUS][NVSHARE_CONTEXT_SLOTS];
/* Apart from the queues, so a forked child resets them without copying every queue's pages. */
static pthread_mutex_t queue_mutexes[NVSHARE_MAX_GPUS][NVSHARE_CONTEXT_SLOTS];
static pthread_once_t queues_once = PTHREAD_ONCE_INIT;
static __thread unsigned launches_since_mark;

static void init_queues(void)
{
    for (int gpu = 0; gpu < NVSHARE_MAX_GPUS; gpu++) {
        for (int slot = 0; slot < NVSHARE_CONTEXT_SLOTS; slot++)
            pthread_mutex_init(&queue_mutexes[gpu][slot], NULL);
    }
}

static unsigned launches_per_mark_for(double ms_per_launch, unsigned max_queued_ms)
{
    double launches = max_queued_ms / WINDOWS_PER_BOUND / ms_per_launch;
    double fewest = MARK_COVERS_MS / ms_per_launch; /* long kernels: down to 1 */
    if (fewest > MIN_LAUNCHES_PER_MARK)
        fewest = MIN_LAUNCHES_PER_MARK;
    if (launches < fewest)
        launches = fewest;
    if (launches < 1)
        return 1;
    return launches > MAX_LAUNCHES_PER_MARK ? MAX_LAUNCHES_PER_MARK : (unsigned)launches;
}

static int on_one_stream(const struct mark *a, const struct mark *b)
{
    return a->stream == b->stream &&
           (a->stream != NVSHARE_CU_STREAM_PER_THREAD || a->recorder == b->recorder);
}

/* Pops completed marks, learning the GPU time per launch and sizing the windows. */
static void collect_completed(struct launch_queue *queue, unsigned max_queued_ms, int short_queue)
{
    while (queue->head != queue->tail) {
        struct mark *mark = &queue->ring[queue->head % RING_SLOTS];
        if (nvshare_driver.event_query(mark->event) != CUDA_SUCCESS)
            return;
        struct mark *previous = &queue->ring[(queue->head + RING_SLOTS - 1) % RING_SLOTS];
        float elapsed_ms;
        if (queue->have_completed && on_one_stream(previous, mark) && mark->launches > 0 &&
            nvshare_driver.event_elapsed_time(&elapsed_ms, previous->event, mark->event) ==
                CUDA_SUCCESS &&
            elapsed_ms >= 0) {
            /* Events closer than the timer's resolution read 0 ms apart. */
            double sample = elapsed_ms > 0 ? (double)elapsed_ms / (double)mark->launches : 1e-6;
            /* A sparse window's sample is an upper bound: it only ever lowers the average. */
            if (queue->ms_per_launch <= 0 || (!mark->dense && sample < queue->ms_per_launch))
                queue->ms_per_launch = sample;
            else if (mark->dense)
                queue->ms_per_launch = 0.8 * queue->ms_per_launch + 0.2 * sample;
            double ns = queue->ms_per_launch * 1e6;
            atomic_store_explicit(&queue->ns_per_launch, ns < UINT_MAX ? (unsigned)ns : UINT_MAX,
                                  memory_order_relaxed);
            /* The longest: a dense sample raises it at once; any sample lowers it, no
             * faster than by e per ESTIMATE_DECAY_MS of the time it covers (many short
             * kernels in a row are short), and a sparse one never raises it. */
            double longest = queue->longest_ms_per_launch;
            if (longest <= 0) {
                longest = sample;
            } else {
                double trusted = mark->dense || sample < longest ? sample : longest;
                /* 1/(1+x) >= e^-x: no faster than e per ESTIMATE_DECAY_MS, no libm */
                double decayed = longest / (1.0 + (double)elapsed_ms / ESTIMATE_DECAY_MS);
                longest = trusted > decayed ? trusted : decayed;
            }
            queue->longest_ms_per_launch = longest;
            /* Windows shrink at once when kernels get longer, grow as the estimate falls. */
            double slowest = short_queue ? longest : queue->ms_per_launch;
            if (sample > slowest)
                slowest = sample;
            atomic_store_explicit(&queue->launches_per_mark,
                                  launches_per_mark_for(slowest, max_queued_ms),
                                  memory_order_relaxed);
        }
        queue->have_completed = 1;
        queue->head++;
    }
}

/* The oldest pending mark behind which at most max_queued_ms of launches are
 * queued (waiting on it is the shortest wait that restores the bound), or
 * NULL when all that is pending fits. */
static CUevent mark_to_wait_for(struct launch_queue *queue, unsigned max_queued_ms,
                                double ms_per_launch)
{
    double allowed_launches = max_queued_ms / ms_per_launch;
    double behind = 0; /* launches queued behind the mark looked at */
    for (unsigned mark = queue->tail; mark != queue->head;) {
        mark--;
        unsigned launches = queue->ring[mark % RING_SLOTS].launches;
        if (behind + launches > allowed_launches)
            return queue->ring[mark % RING_SLOTS].event;
        behind += launches;
    }
    return NULL;
}

static void record_burst_start(int gpu, int slot, CUstream stream, int per_thread)
{
    struct launch_queue *queue = &queues[gpu][slot];
    /* A new number even where no start is recorded: marks of this burst then measure
     * nothing, rather than from an old start across the idle time since. */
    unsigned burst = atomic_fetch_add_explicit(&next_burst, 1, memory_order_relaxed) + 1;
    if (burst == 0) /* wrapped: 0 is "none" */
        burst = atomic_fetch_add_explicit(&next_burst, 1, memory_order_relaxed) + 1;
    atomic_store_explicit(&queue->burst, burst, memory_order_release);
    if (nvshare_config()->max_queued_ms == 0 || nvshare_driver.event_record == NULL ||
        nvshare_driver.event_elapsed_time == NULL)
        return; /* no marks to end it */
    pthread_once(&queues_once, init_queues);
    pthread_mutex_t *mutex = &queue_mutexes[gpu][slot];
    if (pthread_mutex_trylock(mutex) != 0)
        return; /* the meter counts this burst by its samples */
    stream = nvshare_actual_stream(stream, per_thread);
    if (nvshare_stream_may_record(stream)) {
        int capture_mode = nvshare_capture_relax();
        if ((queue->burst_start != NULL ||
             nvshare_driver.event_create(&queue->burst_start, CU_EVENT_DEFAULT) == CUDA_SUCCESS) &&
            nvshare_driver.event_record(queue->burst_start, stream) == CUDA_SUCCESS)
            atomic_store_explicit(&queue->started_burst, burst, memory_order_release);
        nvshare_capture_restore(capture_mode);
    }
    pthread_mutex_unlock(mutex);
}

int nvshare_queue_before_launch(int gpu, CUstream stream, int per_thread)
{
    int slot = nvshare_current_context_slot();
    if (slot < 0)
        return slot;
    struct launch_queue *queue = &queues[gpu][slot];
    if (atomic_load_explicit(&queue->start_wanted, memory_order_relaxed) &&
        atomic_exchange_explicit(&queue->start_wanted, 0, memory_order_relaxed))
        record_burst_start(gpu, slot, stream, per_thread);
    return slot;
}

void nvshare_queue_note_launch(int gpu, int slot, CUstream stream, int per_thread)
{
    if (slot < 0)
        return; /* a context with no slot: not bounded */
    struct launch_queue *queue = &queues[gpu][slot];
    unsigned every = atomic_load_explicit(&queue->launches_per_mark, memory_order_relaxed);
    /* A yield shortens the bound: the window sized for the longer one must not run on. */
    int length = atomic_load_explicit(&nvshare_gates[gpu].short_queue, memory_order_relaxed);
    /* Near a fair hold (fair_share.c): what is queued cannot be held. */
    if (atomic_load_explicit(&nvshare_gates[gpu].near_hold, memory_order_relaxed))
        length = NVSHARE_QUEUE_SHORTEST;
    if (++launches_since_mark < (every ? every : MIN_LAUNCHES_PER_MARK) &&
        !atomic_load_explicit(&queue->ran_dry, memory_order_relaxed) &&
        length == atomic_load_explicit(&queue->length_seen, memory_order_relaxed)) {
        atomic_store_explicit(&queue->unmarked, launches_since_mark, memory_order_relaxed);
        return;
    }
    unsigned max_queued_ms = nvshare_config()->max_queued_ms;
    int short_queue = length != NVSHARE_QUEUE_AS_SET;
    if (length == NVSHARE_QUEUE_SHORTEST && max_queued_ms > SHORT_MAX_QUEUED_MS)
        max_queued_ms = SHORT_MAX_QUEUED_MS;
    if (max_queued_ms == 0 || nvshare_driver.event_record == NULL ||
        nvshare_driver.event_query == NULL || nvshare_driver.event_elapsed_time == NULL) {
        launches_since_mark = 0;
        return;
    }
    pthread_once(&queues_once, init_queues);
    pthread_mutex_t *mutex = &queue_mutexes[gpu][slot];
    /* Another thread is taking a mark, or the usage meter is looking at them (every
     * millisecond): the window goes on, and the next launch takes the mark. */
    if (pthread_mutex_trylock(mutex) != 0)
        return;
    atomic_store_explicit(&queue->ran_dry, 0, memory_order_relaxed);
    atomic_store_explicit(&queue->length_seen, length, memory_order_relaxed);
    unsigned launches = launches_since_mark;
    launches_since_mark = 0;
    atomic_store_explicit(&queue->unmarked, 0, memory_order_relaxed);
    stream = nvshare_actual_stream(stream, per_thread);
    if (!nvshare_stream_may_record(stream)) {
        pthread_mutex_unlock(mutex);
        return;
    }
    /* The application's launch was allowed during another thread's capture;
     * querying and waiting on the marks must not invalidate that capture. */
    int capture_mode = nvshare_capture_relax();
    collect_completed(queue, max_queued_ms, short_queue);

    CUevent wait_for = NULL;
    int dense = queue->tail != queue->head; /* the mark before it still runs */
    if (queue->tail - queue->head < MAX_PENDING) {
        struct mark *mark = &queue->ring[queue->tail % RING_SLOTS];
        if (mark->event != NULL ||
            nvshare_driver.event_create(&mark->event, CU_EVENT_DEFAULT) == CUDA_SUCCESS) {
            if (nvshare_driver.event_record(mark->event, stream) == CUDA_SUCCESS) {
                mark->stream = stream;
                mark->recorder = nvshare_thread_serial();
                mark->launches = launches;
                mark->dense = dense;
                queue->tail++;
                atomic_store_explicit(&queue->newest_burst,
                                      atomic_load_explicit(&queue->burst, memory_order_relaxed),
                                      memory_order_relaxed);
                atomic_store_explicit(&queue->newest, mark->event, memory_order_release);
            }
        }
    }
    unsigned pending = queue->tail - queue->head;
    if (pending >= MAX_PENDING) {
        wait_for = queue->ring[queue->head % RING_SLOTS].event;
    } else if (queue->ms_per_launch <= 0 && pending >= LEARNING_PENDING) {
        /* Nothing measured yet: let two marks complete, which gives the first
         * sample, before queueing further ahead. */
        wait_for = queue->ring[(queue->head + 1) % RING_SLOTS].event;
    } else if (queue->ms_per_launch > 0) {
        wait_for =
            mark_to_wait_for(queue, max_queued_ms,
                             short_queue ? queue->longest_ms_per_launch : queue->ms_per_launch);
    }
    pthread_mutex_unlock(mutex);
    if (wait_for != NULL)
        nvshare_driver.event_synchronize(wait_for);
    nvshare_capture_restore(capture_mode);
}

static int mark_runs(CUevent mark)
{
    return mark != NULL && nvshare_driver.event_query(mark) == CUDA_ERROR_NOT_READY;
}

/* Whether any mark of the queue still runs, on any stream: under the mutex, so once a
 * burst (settle), not at every look. */
static int any_mark_pending(struct launch_queue *queue)
{
    for (unsigned mark = queue->tail; mark != queue->head;)
        if (mark_runs(queue->ring[--mark % RING_SLOTS].event))
            return 1;
    return 0;
}

static void note_pending_mark(int gpu, int slot, void *pending)
{
    pthread_mutex_t *mutex = &queue_mutexes[gpu][slot];
    if (pthread_mutex_trylock(mutex) != 0) {
        *(int *)pending = 1; /* a launching thread is taking a mark right now */
        return;
    }
    if (!*(int *)pending && any_mark_pending(&queues[gpu][slot]))
        *(int *)pending = 1;
    pthread_mutex_unlock(mutex);
}

/* The burst's GPU time by timestamps, once its newest mark is done: from its start to
 * that mark, plus tail_ms.  The first time, every mark of the queue must be done too (a
 * mark on another stream may run on: the looks count it); then the next launch starts a
 * new burst, timed or not (no start recorded, marks off for it). */
static void time_the_burst(int gpu, int slot, struct launch_queue *queue, CUevent newest,
                           double tail_ms, struct nvshare_queue_look *look)
{
    unsigned burst = look->burst;
    if (queue->settled != burst + 1) { /* + 1: a zeroed queue has settled nothing */
        pthread_mutex_t *mutex = &queue_mutexes[gpu][slot];
        if (pthread_mutex_trylock(mutex) != 0)
            return; /* a launching thread takes a mark: not done yet */
        int pending = any_mark_pending(queue);
        pthread_mutex_unlock(mutex);
        if (pending) {
            look->pending = 1;
            return;
        }
        queue->settled = burst + 1;
        if (!atomic_load_explicit(&queue->start_wanted, memory_order_relaxed))
            atomic_store_explicit(&queue->start_wanted, 1, memory_order_relaxed);
    }
    float elapsed_ms;
    /* A start or mark recorded meanwhile reads negative or not ready: known next look. */
    if (burst != 0 && atomic_load_explicit(&queue->newest_burst, memory_order_relaxed) == burst &&
        atomic_load_explicit(&queue->started_burst, memory_order_acquire) == burst &&
        queue->burst_start != NULL &&
        nvshare_driver.event_elapsed_time(&elapsed_ms, queue->burst_start, newest) ==
            CUDA_SUCCESS &&
        elapsed_ms >= 0 && atomic_load_explicit(&queue->burst, memory_order_acquire) == burst)
        look->burst_ms = elapsed_ms + tail_ms;
}

/* The usage meter's look, every millisecond: the newest mark only, without the
 * queue's mutex.  Holding it there, a client thread preempted on a busy host kept
 * launching threads from taking their marks (the stand-in test of the windows got
 * 10 of its 50 marks beside a loaded CPU).  A mark on another stream may still
 * run: the look then counts a little less, and the next launch takes a mark.
 *
 * Launches after the newest mark (up to a window's: an eighth of the bound) run
 * after it completes, and no mark shows when they are done.  A burst that ends in
 * a wait the shim does not see (cuStreamSynchronize, cuEventSynchronize) counted
 * only up to its last mark: 5 ms bursts at 5 launches a window read 30 % of their
 * GPU time, and a user's weight of 2 gave 58-62 % instead of 67 %
 * (tests/shim/test_shares.py).  So they count as running for as long as that
 * many launches take by the queue's average, from the look that first saw the
 * mark done, and never longer than a window.  Over by at most a window (and the
 * look's lateness); under where the tail's kernels are longer than the average.
 *
 * Once the newest mark is done, the burst's GPU time is known to the microsecond:
 * from its start (recorded before its first launch) to that mark, plus the launches
 * after it by the same estimate (time_the_burst).  Counting whole looks instead made an
 * inference server's 0.9 ms requests read 3.4 ms each on an H200 (docs/benchmarks.md). */
static void note_newest_mark(int gpu, int slot, void *arg)
{
    struct nvshare_queue_look *look = arg;
    struct launch_queue *queue = &queues[gpu][slot];
    look->contexts++;
    look->burst = atomic_load_explicit(&queue->burst, memory_order_acquire);
    CUevent newest = atomic_load_explicit(&queue->newest, memory_order_acquire);
    if (mark_runs(newest)) {
        look->pending = 1;
        return;
    }
    if (!atomic_load_explicit(&queue->ran_dry, memory_order_relaxed))    /* a line launches read */
        atomic_store_explicit(&queue->ran_dry, 1, memory_order_relaxed); /* the next launch marks */
    unsigned unmarked = atomic_load_explicit(&queue->unmarked, memory_order_relaxed);
    double ms = atomic_load_explicit(&queue->ns_per_launch, memory_order_relaxed) / 1e6;
    double window = nvshare_config()->max_queued_ms / WINDOWS_PER_BOUND;
    double tail_ms = ms * unmarked < window ? ms * unmarked : window;
    if (newest == NULL)
        return;
    time_the_burst(gpu, slot, queue, newest, tail_ms, look);
    if (unmarked == 0)
        return;
    if (queue->tail_after != newest || queue->tail_launches != unmarked) {
        double done = look->now_ms + tail_ms;
        if (queue->tail_after == newest && queue->tail_done_ms > done)
            done = queue->tail_done_ms; /* more launches in the same tail: never sooner */
        queue->tail_after = newest;
        queue->tail_launches = unmarked;
        queue->tail_done_ms = done;
    }
    if (look->now_ms < queue->tail_done_ms)
        look->pending = 1;
}

static int marks_recorded(void)
{
    return nvshare_config()->max_queued_ms != 0 && nvshare_driver.event_query != NULL;
}

static void note_newest_pending(int gpu, int slot, void *pending)
{
    if (mark_runs(atomic_load_explicit(&queues[gpu][slot].newest, memory_order_acquire)))
        *(int *)pending = 1;
}

/* Marks only: the queue look's estimate of the launches after the newest mark (up to an
 * eighth of the bound) would hold a yield, idle 2 ms, past a trainer's short pauses. */
int nvshare_queue_newest_pending(int gpu)
{
    if (!marks_recorded())
        return 0;
    pthread_once(&queues_once, init_queues);
    int pending = 0;
    return !nvshare_try_in_each_context(gpu, note_newest_pending, &pending) || pending;
}

/* Under the contexts' mutex, so no context (and none of its events) is freed
 * while its marks are queried. */
int nvshare_queue_work_pending(int gpu)
{
    if (!marks_recorded())
        return 0;
    pthread_once(&queues_once, init_queues);
    int pending = 0;
    nvshare_in_each_context(gpu, note_pending_mark, &pending);
    return pending;
}

void nvshare_queue_look(int gpu, double now_ms, struct nvshare_queue_look *look)
{
    *look = (struct nvshare_queue_look){.now_ms = now_ms, .burst_ms = -1};
    if (!marks_recorded())
        return;
    pthread_once(&queues_once, init_queues);
    if (!nvshare_try_in_each_context(gpu, note_newest_mark, look)) {
        look->pending = 1; /* a worker prefetches or drains: the lease is changing hands */
        look->contexts = 0;
    }
    if (look->contexts != 1)
        look->burst_ms = -1; /* two contexts' bursts: the samples count them */
}

void nvshare_queue_forget_context(int gpu, int slot)
{
    pthread_once(&queues_once, init_queues);
    struct launch_queue *queue = &queues[gpu][slot];
    pthread_mutex_lock(&queue_mutexes[gpu][slot]);
    /* The driver frees the events with their context: forget, never destroy. */
    memset(queue, 0, sizeof *queue);
    pthread_mutex_unlock(&queue_mutexes[gpu][slot]);
}

void nvshare_queue_forget_after_fork(void)
{
    /* The parent's events belong to its contexts; leave them untouched.  Only
     * queues that were used are written, so the child copies few pages. */
    for (int gpu = 0; gpu < NVSHARE_MAX_GPUS; gpu++) {
        for (int slot = 0; slot < NVSHARE_CONTEXT_SLOTS; slot++) {
            struct launch_queue *queue = &queues[gpu][slot];
            if (queue->tail != 0 || queue->ring[0].event != NULL || queue->burst_start != NULL ||
                atomic_load_explicit(&queue->launches_per_mark, memory_order_relaxed) != 0)
                memset(queue, 0, sizeof *queue);
            queue_mutexes[gpu][slot] = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
        }
    }
    queues_once = PTHREAD_ONCE_INIT;
}
