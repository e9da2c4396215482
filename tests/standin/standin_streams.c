/*
 * Stand-in driver: streams, and the host functions and callbacks queued on them.
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

struct CUstream_st {
    uint32_t magic;
    CUcontext ctx; /* made in; NULL for the stream of no context */
    int is_null;   /* a context's NULL stream: cannot be destroyed */
    struct CUstream_st
        *next_stream; /* every stream created (retired ones stay), for context-wide waits */
    struct standin_op *head, *tail;
    uint64_t submitted, completed;
    pid_t worker_pid; /* process whose worker serves this stream; 0: none */
    int destroyed;
    pthread_cond_t work;
};

/* Work submitted with no context current lands here (the driver would refuse
 * most such calls; the fixture stays defined). */
static struct CUstream_st no_context_stream = {
    .magic = STREAM_MAGIC, .is_null = 1, .work = PTHREAD_COND_INITIALIZER};
static struct CUstream_st *all_streams = &no_context_stream;

/* Each context has its own NULL stream, as with the real driver: a kernel on
 * GPU 1's NULL stream does not queue behind one on GPU 0's, and synchronising
 * GPU 0's context does not wait for GPU 1's work. */
void standin_give_null_stream(CUcontext ctx)
{
    if (ctx->null_stream != NULL)
        return;
    struct CUstream_st *stream = calloc(1, sizeof *stream);
    if (stream == NULL)
        return; /* standin_stream falls back to the stream of no context */
    stream->magic = STREAM_MAGIC;
    stream->ctx = ctx;
    stream->is_null = 1;
    pthread_cond_init(&stream->work, NULL);
    stream->next_stream = all_streams;
    all_streams = stream;
    ctx->null_stream = stream;
}

static void execute(struct standin_op *op)
{
    switch (op->kind) {
    case OP_KERNEL:
        standin_run_kernel(op);
        break;
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
    case OP_HOST_FN:
        op->u.host.fn(op->u.host.data);
        break;
    case OP_CALLBACK:
        op->u.callback.fn(op->u.callback.stream, CUDA_SUCCESS, op->u.callback.data);
        break;
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
    case OP_FREE:
        standin_free_now(op->u.free.ptr);
        break;
    case OP_NOTHING:
        break;
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
    int failed = pthread_create(&thread, &attr, stream_worker, stream);
    if (failed) {
        /* Work queued on a stream with no worker would never complete: a test would
         * see NOT_READY or hang.  A fixture fails loudly instead. */
        fprintf(stderr, "standin: no worker thread for stream %p: %s\n", (void *)stream,
                strerror(failed));
        abort();
    }
    stream->worker_pid = getpid();
    pthread_attr_destroy(&attr);
}

struct CUstream_st *standin_stream(CUstream handle)
{
    if (handle == NULL || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD) {
        CUcontext ctx = standin_current_ctx();
        return ctx != NULL && ctx->null_stream != NULL ? ctx->null_stream : &no_context_stream;
    }
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

void standin_wait_context_streams(CUcontext ctx)
{
    pthread_mutex_lock(&standin_lock);
    for (struct CUstream_st *s = all_streams; s != NULL; s = s->next_stream) {
        if (s->ctx != ctx && s != &no_context_stream)
            continue;
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
        stream->ctx = standin_current_ctx();
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

STANDIN_EXPORT CUresult cuStreamGetCtx(CUstream handle, CUcontext *pctx)
{
    standin_log("cuStreamGetCtx", "stream=%p", (void *)handle);
    CUresult result = standin_require_ctx();
    if (result == CUDA_SUCCESS && pctx == NULL)
        result = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&standin_lock);
    struct CUstream_st *stream = result == CUDA_SUCCESS ? standin_stream(handle) : NULL;
    if (result == CUDA_SUCCESS && stream == NULL)
        result = CUDA_ERROR_INVALID_HANDLE;
    else if (result == CUDA_SUCCESS)
        *pctx = stream->ctx != NULL ? stream->ctx : standin_current_ctx();
    pthread_mutex_unlock(&standin_lock);
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
    if (stream == NULL || stream->is_null) {
        pthread_mutex_unlock(&standin_lock);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    standin_capture_end_where(handle, NULL, "cuStreamDestroy_v2");
    stream->destroyed = 1; /* no new work from here on */
    while (stream->completed < stream->submitted)
        pthread_cond_wait(&standin_progress, &standin_lock);
    stream->magic = 0;
    pthread_cond_signal(&stream->work); /* its worker exits */
    pthread_mutex_unlock(&standin_lock);
    return CUDA_SUCCESS;
}

static CUresult stream_synchronize(const char *function, CUstream handle)
{
    CUresult result = standin_require_ctx();
    if (result == CUDA_SUCCESS)
        result = standin_capture_check_unsafe(function);
    struct CUstream_st *stream = standin_stream(handle);
    if (result == CUDA_SUCCESS && stream == NULL)
        result = CUDA_ERROR_INVALID_HANDLE;
    if (result == CUDA_SUCCESS)
        standin_stream_wait(stream, standin_stream_submitted(stream));
    standin_log(function, "stream=%p result=%d", (void *)handle, result);
    return result;
}

STANDIN_EXPORT CUresult cuStreamSynchronize(CUstream s)
{
    return stream_synchronize("cuStreamSynchronize", s);
}
STANDIN_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s)
{
    return stream_synchronize("cuStreamSynchronize_ptsz", s);
}

static CUresult stream_query(const char *function, CUstream handle)
{
    CUresult result = standin_require_ctx();
    if (result == CUDA_SUCCESS)
        result = standin_capture_check_unsafe(function);
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

STANDIN_EXPORT CUresult cuStreamQuery(CUstream s)
{
    return stream_query("cuStreamQuery", s);
}
STANDIN_EXPORT CUresult cuStreamQuery_ptsz(CUstream s)
{
    return stream_query("cuStreamQuery_ptsz", s);
}

CUresult standin_submit(const char *function, CUstream handle, struct standin_op *op,
                        const char *detail)
{
    CUresult result = standin_require_ctx();
    struct CUstream_st *stream = standin_stream(handle);
    if (result == CUDA_SUCCESS && stream == NULL)
        result = CUDA_ERROR_INVALID_HANDLE;
    uint64_t seq = 0;
    if (result == CUDA_SUCCESS && standin_capture_take(handle, &result)) {
        free(op);
        standin_log(function, "%s stream=%p captured=1 result=%d", detail, (void *)handle, result);
        return result;
    }
    if (result == CUDA_SUCCESS)
        seq = standin_enqueue(stream, op);
    else
        free(op);
    standin_log(function, "%s stream=%p seq=%llu result=%d", detail, (void *)handle,
                (unsigned long long)seq, result);
    return result;
}

struct standin_op *standin_new_op(enum standin_op_kind kind)
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
    struct standin_op *op = standin_new_op(OP_HOST_FN);
    if (op == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    op->u.host.fn = fn;
    op->u.host.data = data;
    return standin_submit(function, s, op, "fn=host");
}

STANDIN_EXPORT CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *d)
{
    return host_func("cuLaunchHostFunc", s, fn, d);
}
STANDIN_EXPORT CUresult cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *d)
{
    return host_func("cuLaunchHostFunc_ptsz", s, fn, d);
}

static CUresult add_callback(const char *function, CUstream s, CUstreamCallback fn, void *data)
{
    if (fn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct standin_op *op = standin_new_op(OP_CALLBACK);
    if (op == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    op->u.callback.fn = fn;
    op->u.callback.data = data;
    op->u.callback.stream = s;
    return standin_submit(function, s, op, "fn=callback");
}

STANDIN_EXPORT CUresult cuStreamAddCallback(CUstream s, CUstreamCallback fn, void *d,
                                            unsigned int flags)
{
    (void)flags;
    return add_callback("cuStreamAddCallback", s, fn, d);
}
STANDIN_EXPORT CUresult cuStreamAddCallback_ptsz(CUstream s, CUstreamCallback fn, void *d,
                                                 unsigned int flags)
{
    (void)flags;
    return add_callback("cuStreamAddCallback_ptsz", s, fn, d);
}
