/*
 * Stand-in driver: streams, events, fake kernels, modules, launches and graphs.
 *
 * Every stream (the default one included) is a FIFO of operations executed in
 * order by a worker thread of its own, so work really is asynchronous: a
 * launch returns at once, and synchronize/query/events observe when the fake
 * GPU has finished.  A fake kernel takes $STANDIN_KERNEL_US microseconds.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "standin.h"

#define STREAM_MAGIC 0x5354524du
#define EVENT_MAGIC 0x45564e54u
#define MODULE_MAGIC 0x4d4f4455u
#define FUNCTION_MAGIC 0x46554e43u
#define GRAPH_MAGIC 0x47524150u

struct CUstream_st {
    uint32_t magic;
    struct CUstream_st *next_stream;        /* all live streams, for context-wide waits */
    struct standin_op *head, *tail;
    uint64_t submitted, completed;
    pid_t worker_pid;                       /* process whose worker serves this stream; 0: none */
    int destroyed;
    pthread_cond_t work;
};

struct CUevent_st {
    uint32_t magic;
    uint64_t generation;                    /* number of records so far */
    uint64_t done_generation;               /* the last record the fake GPU reached */
    struct timespec when;
};

struct CUmod_st { uint32_t magic; };
struct CUgraph_st { uint32_t magic; };
struct CUgraphExec_st { uint32_t magic; };

enum { KERNEL_ADD_ONE, KERNEL_SPIN };
struct CUfunc_st { uint32_t magic; int kernel; const char *name; };
static struct CUfunc_st kernels[] = {
    {FUNCTION_MAGIC, KERNEL_ADD_ONE, "add_one"},  /* (int *p, int n): p[i] += 1 for i < n */
    {FUNCTION_MAGIC, KERNEL_SPIN, "spin"},        /* (): just takes time */
};

static struct CUstream_st default_stream = {.magic = STREAM_MAGIC, .work = PTHREAD_COND_INITIALIZER};
static struct CUstream_st *all_streams = &default_stream;

/* ---- the fake GPU ---- */
static void run_kernel(struct standin_op *op)
{
    const char *name = kernels[op->u.kernel.kernel].name;
    standin_log("@kernel_start", "name=%s via=%s seq=%llu", name, op->u.kernel.via, (unsigned long long)op->seq);
    unsigned us = standin_kernel_us();
    if (us > 0)
        usleep(us);
    if (op->u.kernel.kernel == KERNEL_ADD_ONE) {
        int *p = (int *)(uintptr_t)op->u.kernel.ptr;
        for (int i = 0; i < op->u.kernel.count; i++)
            p[i] += 1;
    }
    standin_log("@kernel_done", "name=%s via=%s seq=%llu", name, op->u.kernel.via, (unsigned long long)op->seq);
}

static void execute(struct standin_op *op)
{
    switch (op->kind) {
    case OP_KERNEL: run_kernel(op); break;
    case OP_COPY:
        memmove(op->u.copy.dst, op->u.copy.src, op->u.copy.bytes);
        free(op->u.copy.staging);
        break;
    case OP_MEMSET:
        if (op->u.memset.width == 1) {
            memset(op->u.memset.dst, (int)op->u.memset.value, op->u.memset.count);
        } else {
            uint32_t *words = op->u.memset.dst;
            for (size_t i = 0; i < op->u.memset.count; i++)
                words[i] = op->u.memset.value;
        }
        break;
    case OP_HOST_FN: op->u.host.fn(op->u.host.data); break;
    case OP_CALLBACK: op->u.callback.fn(op->u.callback.stream, CUDA_SUCCESS, op->u.callback.data); break;
    case OP_EVENT: {
        CUevent event = op->u.event.event;
        pthread_mutex_lock(&standin_lock);
        if (op->u.event.generation > event->done_generation) {
            clock_gettime(CLOCK_MONOTONIC, &event->when);
            event->done_generation = op->u.event.generation;
        }
        pthread_mutex_unlock(&standin_lock);
        break;
    }
    case OP_WAIT_EVENT: {
        CUevent event = op->u.wait.event;
        pthread_mutex_lock(&standin_lock);
        while (event->done_generation < op->u.wait.generation)
            pthread_cond_wait(&standin_progress, &standin_lock);
        pthread_mutex_unlock(&standin_lock);
        break;
    }
    case OP_FREE: standin_free_now(op->u.free.ptr); break;
    case OP_NOTHING: break;
    }
}

static void *stream_worker(void *arg)
{
    struct CUstream_st *stream = arg;
    pthread_mutex_lock(&standin_lock);
    for (;;) {
        while (stream->head == NULL && !stream->destroyed)
            pthread_cond_wait(&stream->work, &standin_lock);
        if (stream->head == NULL)
            break;
        struct standin_op *op = stream->head;
        stream->head = op->next;
        if (stream->head == NULL)
            stream->tail = NULL;
        pthread_mutex_unlock(&standin_lock);
        execute(op);
        pthread_mutex_lock(&standin_lock);
        stream->completed = op->seq;
        free(op);
        pthread_cond_broadcast(&standin_progress);
    }
    pthread_mutex_unlock(&standin_lock);
    return NULL;
}

/* Called with standin_lock held. */
static void ensure_worker(struct CUstream_st *stream)
{
    if (stream->worker_pid == getpid())
        return;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t thread;
    if (pthread_create(&thread, &attr, stream_worker, stream) == 0)
        stream->worker_pid = getpid();
    pthread_attr_destroy(&attr);
}

struct CUstream_st *standin_stream(CUstream handle)
{
    if (handle == NULL || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD)
        return &default_stream;
    return handle->magic == STREAM_MAGIC && !handle->destroyed ? handle : NULL;
}

uint64_t standin_enqueue(struct CUstream_st *stream, struct standin_op *op)
{
    pthread_mutex_lock(&standin_lock);
    ensure_worker(stream);
    op->next = NULL;
    op->seq = ++stream->submitted;
    if (stream->tail != NULL)
        stream->tail->next = op;
    else
        stream->head = op;
    stream->tail = op;
    pthread_cond_signal(&stream->work);
    uint64_t seq = op->seq;
    pthread_mutex_unlock(&standin_lock);
    return seq;
}

uint64_t standin_stream_submitted(struct CUstream_st *stream)
{
    pthread_mutex_lock(&standin_lock);
    uint64_t submitted = stream->submitted;
    pthread_mutex_unlock(&standin_lock);
    return submitted;
}

void standin_stream_wait(struct CUstream_st *stream, uint64_t seq)
{
    pthread_mutex_lock(&standin_lock);
    while (stream->completed < seq)
        pthread_cond_wait(&standin_progress, &standin_lock);
    pthread_mutex_unlock(&standin_lock);
}

/* Waits for the work queued so far on every stream.  Streams are never freed
 * (see cuStreamDestroy_v2), so the walk stays valid while the lock is dropped
 * inside the wait. */
void standin_wait_all_streams(void)
{
    pthread_mutex_lock(&standin_lock);
    for (struct CUstream_st *s = all_streams; s != NULL; s = s->next_stream) {
        uint64_t target = s->submitted;
        while (s->completed < target)
            pthread_cond_wait(&standin_progress, &standin_lock);
    }
    pthread_mutex_unlock(&standin_lock);
}

/* The parent's workers do not exist in a forked child, and neither does the
 * parent's queued work: the child starts with empty streams. */
void standin_streams_after_fork_child(void)
{
    for (struct CUstream_st *s = all_streams; s != NULL; s = s->next_stream) {
        pthread_cond_init(&s->work, NULL);
        s->head = s->tail = NULL;
        s->completed = s->submitted;
        s->worker_pid = 0;
    }
}

/* ---- streams ---- */
STANDIN_EXPORT CUresult cuStreamCreate(CUstream *out, unsigned int flags)
{
    CUresult result = standin_require_ctx();
    if (result == CUDA_SUCCESS && out == NULL)
        result = CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *stream = NULL;
    if (result == CUDA_SUCCESS && (stream = calloc(1, sizeof *stream)) == NULL)
        result = CUDA_ERROR_OUT_OF_MEMORY;
    if (result == CUDA_SUCCESS) {
        stream->magic = STREAM_MAGIC;
        pthread_cond_init(&stream->work, NULL);
        pthread_mutex_lock(&standin_lock);
        stream->next_stream = all_streams;
        all_streams = stream;
        pthread_mutex_unlock(&standin_lock);
        *out = stream;
    }
    standin_log("cuStreamCreate", "flags=%u stream=%p result=%d", flags, (void *)stream, result);
    return result;
}

/* A destroyed stream is drained and retired but stays allocated and listed:
 * other threads may be walking the list in standin_wait_all_streams with the
 * lock dropped.  A fixture can afford the few bytes. */
STANDIN_EXPORT CUresult cuStreamDestroy_v2(CUstream handle)
{
    standin_log("cuStreamDestroy_v2", "stream=%p", (void *)handle);
    pthread_mutex_lock(&standin_lock);
    struct CUstream_st *stream = standin_stream(handle);
    if (stream == NULL || stream == &default_stream) {
        pthread_mutex_unlock(&standin_lock);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    stream->destroyed = 1;                 /* no new work from here on */
    while (stream->completed < stream->submitted)
        pthread_cond_wait(&standin_progress, &standin_lock);
    stream->magic = 0;
    pthread_cond_signal(&stream->work);    /* its worker exits */
    pthread_mutex_unlock(&standin_lock);
    return CUDA_SUCCESS;
}

static CUresult stream_synchronize(const char *function, CUstream handle)
{
    CUresult result = standin_require_ctx();
    struct CUstream_st *stream = standin_stream(handle);
    if (result == CUDA_SUCCESS && stream == NULL)
        result = CUDA_ERROR_INVALID_HANDLE;
    if (result == CUDA_SUCCESS)
        standin_stream_wait(stream, standin_stream_submitted(stream));
    standin_log(function, "stream=%p result=%d", (void *)handle, result);
    return result;
}

STANDIN_EXPORT CUresult cuStreamSynchronize(CUstream s) { return stream_synchronize("cuStreamSynchronize", s); }
STANDIN_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { return stream_synchronize("cuStreamSynchronize_ptsz", s); }

static CUresult stream_query(const char *function, CUstream handle)
{
    CUresult result = standin_require_ctx();
    struct CUstream_st *stream = standin_stream(handle);
    if (result == CUDA_SUCCESS && stream == NULL)
        result = CUDA_ERROR_INVALID_HANDLE;
    if (result == CUDA_SUCCESS) {
        pthread_mutex_lock(&standin_lock);
        result = stream->completed < stream->submitted ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
        pthread_mutex_unlock(&standin_lock);
    }
    standin_log(function, "stream=%p result=%d", (void *)handle, result);
    return result;
}

STANDIN_EXPORT CUresult cuStreamQuery(CUstream s) { return stream_query("cuStreamQuery", s); }
STANDIN_EXPORT CUresult cuStreamQuery_ptsz(CUstream s) { return stream_query("cuStreamQuery_ptsz", s); }

/* Queues a ready-made op on a stream after the usual checks; logs the call. */
static CUresult submit(const char *function, CUstream handle, struct standin_op *op, const char *detail)
{
    CUresult result = standin_require_ctx();
    struct CUstream_st *stream = standin_stream(handle);
    if (result == CUDA_SUCCESS && stream == NULL)
        result = CUDA_ERROR_INVALID_HANDLE;
    uint64_t seq = 0;
    if (result == CUDA_SUCCESS)
        seq = standin_enqueue(stream, op);
    else
        free(op);
    standin_log(function, "%s stream=%p seq=%llu result=%d", detail, (void *)handle, (unsigned long long)seq, result);
    return result;
}

static struct standin_op *new_op(enum standin_op_kind kind)
{
    struct standin_op *op = calloc(1, sizeof *op);
    if (op != NULL)
        op->kind = kind;
    return op;
}

static CUresult host_func(const char *function, CUstream s, CUhostFn fn, void *data)
{
    if (fn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct standin_op *op = new_op(OP_HOST_FN);
    if (op == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    op->u.host.fn = fn;
    op->u.host.data = data;
    return submit(function, s, op, "fn=host");
}

STANDIN_EXPORT CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *d) { return host_func("cuLaunchHostFunc", s, fn, d); }
STANDIN_EXPORT CUresult cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *d) { return host_func("cuLaunchHostFunc_ptsz", s, fn, d); }

static CUresult add_callback(const char *function, CUstream s, CUstreamCallback fn, void *data)
{
    if (fn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct standin_op *op = new_op(OP_CALLBACK);
    if (op == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    op->u.callback.fn = fn;
    op->u.callback.data = data;
    op->u.callback.stream = s;
    return submit(function, s, op, "fn=callback");
}

STANDIN_EXPORT CUresult cuStreamAddCallback(CUstream s, CUstreamCallback fn, void *d, unsigned int flags)
{
    (void)flags;
    return add_callback("cuStreamAddCallback", s, fn, d);
}
STANDIN_EXPORT CUresult cuStreamAddCallback_ptsz(CUstream s, CUstreamCallback fn, void *d, unsigned int flags)
{
    (void)flags;
    return add_callback("cuStreamAddCallback_ptsz", s, fn, d);
}

/* ---- events ---- */
static int valid_event(CUevent event) { return event != NULL && event->magic == EVENT_MAGIC; }

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
        *out = event;
    }
    standin_log("cuEventCreate", "flags=%u event=%p result=%d", flags, (void *)event, result);
    return result;
}

static CUresult event_record(const char *function, CUevent event, CUstream s)
{
    if (!valid_event(event))
        return CUDA_ERROR_INVALID_HANDLE;
    struct standin_op *op = new_op(OP_EVENT);
    if (op == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&standin_lock);
    op->u.event.event = event;
    op->u.event.generation = ++event->generation;
    pthread_mutex_unlock(&standin_lock);
    char detail[64];
    snprintf(detail, sizeof detail, "event=%p", (void *)event);
    return submit(function, s, op, detail);
}

STANDIN_EXPORT CUresult cuEventRecord(CUevent e, CUstream s) { return event_record("cuEventRecord", e, s); }
STANDIN_EXPORT CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return event_record("cuEventRecord_ptsz", e, s); }

STANDIN_EXPORT CUresult cuEventSynchronize(CUevent event)
{
    if (!valid_event(event))
        return CUDA_ERROR_INVALID_HANDLE;
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
    pthread_mutex_lock(&standin_lock);
    CUresult result = event->done_generation < event->generation ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
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

STANDIN_EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) { return elapsed("cuEventElapsedTime", ms, a, b); }
STANDIN_EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) { return elapsed("cuEventElapsedTime_v2", ms, a, b); }

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
    pthread_mutex_unlock(&standin_lock);
    free(event);
    return CUDA_SUCCESS;
}

static CUresult wait_event(const char *function, CUstream s, CUevent event)
{
    if (!valid_event(event))
        return CUDA_ERROR_INVALID_HANDLE;
    struct standin_op *op = new_op(OP_WAIT_EVENT);
    if (op == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&standin_lock);
    op->u.wait.event = event;
    op->u.wait.generation = event->generation;
    pthread_mutex_unlock(&standin_lock);
    return submit(function, s, op, "wait=event");
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

/* ---- modules: any image loads; functions are the fake kernels above ---- */
STANDIN_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    CUresult result = standin_require_ctx();
    if (result == CUDA_SUCCESS && (module == NULL || image == NULL))
        result = CUDA_ERROR_INVALID_VALUE;
    CUmodule loaded = NULL;
    if (result == CUDA_SUCCESS && (loaded = calloc(1, sizeof *loaded)) == NULL)
        result = CUDA_ERROR_OUT_OF_MEMORY;
    if (result == CUDA_SUCCESS) {
        loaded->magic = MODULE_MAGIC;
        *module = loaded;
    }
    standin_log("cuModuleLoadData", "module=%p result=%d", (void *)loaded, result);
    return result;
}

STANDIN_EXPORT CUresult cuModuleUnload(CUmodule module)
{
    standin_log("cuModuleUnload", "module=%p", (void *)module);
    if (module == NULL || module->magic != MODULE_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    module->magic = 0;
    free(module);
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuModuleGetFunction(CUfunction *fn, CUmodule module, const char *name)
{
    CUresult result = standin_require_ctx();
    if (result == CUDA_SUCCESS && (fn == NULL || name == NULL))
        result = CUDA_ERROR_INVALID_VALUE;
    if (result == CUDA_SUCCESS && (module == NULL || module->magic != MODULE_MAGIC))
        result = CUDA_ERROR_INVALID_HANDLE;
    if (result == CUDA_SUCCESS) {
        result = CUDA_ERROR_NOT_FOUND;
        for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++) {
            if (strcmp(kernels[i].name, name) == 0) {
                *fn = &kernels[i];
                result = CUDA_SUCCESS;
            }
        }
    }
    standin_log("cuModuleGetFunction", "name=%s result=%d", name != NULL ? name : "(null)", result);
    return result;
}

/* ---- launches ---- */
static CUresult launch(const char *via, CUfunction f, CUstream s, void **params, unsigned grid, unsigned block)
{
    if (f == NULL || f->magic != FUNCTION_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    if (grid == 0 || block == 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct standin_op *op = new_op(OP_KERNEL);
    if (op == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    op->u.kernel.kernel = f->kernel;
    op->u.kernel.via = via;
    char detail[96];
    if (f->kernel == KERNEL_ADD_ONE) {
        /* Parameters are read at launch time, as the real driver does. */
        if (params == NULL || params[0] == NULL || params[1] == NULL) {
            free(op);
            return CUDA_ERROR_INVALID_VALUE;
        }
        op->u.kernel.ptr = *(CUdeviceptr *)params[0];
        op->u.kernel.count = *(int *)params[1];
        if (op->u.kernel.count < 0 ||
            standin_device_range(op->u.kernel.ptr, (size_t)op->u.kernel.count * sizeof(int)) == NULL) {
            standin_log(via, "func=add_one ptr=0x%llx n=%d result=%d", op->u.kernel.ptr, op->u.kernel.count,
                        CUDA_ERROR_INVALID_VALUE);
            free(op);
            return CUDA_ERROR_INVALID_VALUE;
        }
        snprintf(detail, sizeof detail, "func=add_one ptr=0x%llx n=%d", op->u.kernel.ptr, op->u.kernel.count);
    } else {
        snprintf(detail, sizeof detail, "func=%s", f->name);
    }
    return submit(via, s, op, detail);
}

STANDIN_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                       unsigned bz, unsigned shared, CUstream s, void **params, void **extra)
{
    (void)shared, (void)extra;
    return launch("cuLaunchKernel", f, s, params, gx * gy * gz, bx * by * bz);
}

STANDIN_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                            unsigned by, unsigned bz, unsigned shared, CUstream s, void **params,
                                            void **extra)
{
    (void)shared, (void)extra;
    return launch("cuLaunchKernel_ptsz", f, s, params, gx * gy * gz, bx * by * bz);
}

static CUresult launch_ex(const char *via, const CUlaunchConfig *c, CUfunction f, void **params)
{
    if (c == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(via, f, c->hStream, params, c->gridDimX * c->gridDimY * c->gridDimZ,
                  c->blockDimX * c->blockDimY * c->blockDimZ);
}

STANDIN_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
    (void)extra;
    return launch_ex("cuLaunchKernelEx", c, f, params);
}

STANDIN_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
    (void)extra;
    return launch_ex("cuLaunchKernelEx_ptsz", c, f, params);
}

STANDIN_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                                  unsigned by, unsigned bz, unsigned shared, CUstream s, void **params)
{
    (void)shared;
    return launch("cuLaunchCooperativeKernel", f, s, params, gx * gy * gz, bx * by * bz);
}

STANDIN_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                                       unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                                       CUstream s, void **params)
{
    (void)shared;
    return launch("cuLaunchCooperativeKernel_ptsz", f, s, params, gx * gy * gz, bx * by * bz);
}

/* ---- graphs: an instantiated graph runs as one "spin" kernel ---- */
STANDIN_EXPORT CUresult cuGraphCreate(CUgraph *graph, unsigned int flags)
{
    standin_log("cuGraphCreate", "flags=%u", flags);
    if (graph == NULL || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if ((*graph = calloc(1, sizeof **graph)) == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    (*graph)->magic = GRAPH_MAGIC;
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuGraphDestroy(CUgraph graph)
{
    standin_log("cuGraphDestroy", "graph=%p", (void *)graph);
    if (graph == NULL || graph->magic != GRAPH_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    graph->magic = 0;
    free(graph);
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags)
{
    standin_log("cuGraphInstantiateWithFlags", "graph=%p flags=%llu", (void *)graph, flags);
    if (exec == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (graph == NULL || graph->magic != GRAPH_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    if ((*exec = calloc(1, sizeof **exec)) == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    (*exec)->magic = GRAPH_MAGIC;
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec)
{
    standin_log("cuGraphExecDestroy", "exec=%p", (void *)exec);
    if (exec == NULL || exec->magic != GRAPH_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    exec->magic = 0;
    free(exec);
    return CUDA_SUCCESS;
}

static CUresult graph_launch(const char *via, CUgraphExec exec, CUstream s)
{
    if (exec == NULL || exec->magic != GRAPH_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    return launch(via, &kernels[KERNEL_SPIN], s, NULL, 1, 1);
}

STANDIN_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream s) { return graph_launch("cuGraphLaunch", exec, s); }
STANDIN_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream s) { return graph_launch("cuGraphLaunch_ptsz", exec, s); }
