/*
 * Internals shared by the stand-in driver's source files.  The stand-in is a
 * test fixture: it fakes one or more GPUs with host memory and worker threads
 * so that nvshare's shim can be tested on machines without a GPU.
 */
#ifndef STANDIN_H
#define STANDIN_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "cuda_fixture.h"

/* ---- logging (standin_core.c) ----
 * One line per driver call appended to $STANDIN_LOG:
 *   <pid> <tid> <function> t=<realtime seconds> key=value ...
 * Lines whose function starts with '@' are not calls but things the fake GPU
 * did (a kernel starting or finishing on a stream's worker thread). */
void standin_log(const char *function, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- global state (standin_core.c) ---- */
extern pthread_mutex_t standin_lock;    /* guards every table below */
extern pthread_cond_t standin_progress; /* broadcast whenever a stream completes work */
int standin_initialised(void);
int standin_device_count(void);
size_t standin_total_mem(void);
unsigned standin_kernel_us(void);
/* STANDIN_LAUNCH_NOOP=1: a spin() launch only checks its arguments (timing the shim's launch path). */
int standin_launch_noop(void);
/* STANDIN_LAUNCH_US: microseconds a launch spends in the driver before its kernel is queued
 * (widens the window in which a launch is between the shim's gate and the GPU). */
unsigned standin_launch_us(void);
unsigned standin_prefetch_us(void);    /* each cuMemPrefetchAsync call takes this long */
unsigned standin_ctx_destroy_us(void); /* and each cuCtxDestroy (freeing its memory) */

struct CUctx_st {
    uint32_t magic;
    CUdevice device;
    int primary;
    int refcount;
    struct CUstream_st *null_stream; /* its own, as the real driver's legacy default stream */
};
#define STANDIN_CTX_MAGIC 0x43545854u

/* Gives a context its NULL stream, if it has none yet; called with standin_lock
 * held (standin_streams.c). */
void standin_give_null_stream(CUcontext ctx);
/* CUDA_SUCCESS for a valid ordinal after cuInit (standin_context.c). */
CUresult standin_check_device(CUdevice dev);
/* The calling thread's current context, or NULL. */
CUcontext standin_current_ctx(void);
/* CUDA_SUCCESS when initialised and a context is current; else the error the
 * real driver gives (NOT_INITIALIZED, INVALID_CONTEXT). */
CUresult standin_require_ctx(void);

/* ---- streams (standin_streams.c) ---- */
enum standin_op_kind {
    OP_KERNEL,
    OP_COPY,
    OP_MEMSET,
    OP_HOST_FN,
    OP_CALLBACK,
    OP_EVENT,
    OP_WAIT_EVENT,
    OP_FREE,
    OP_NOTHING
};
struct standin_op {
    struct standin_op *next;
    enum standin_op_kind kind;
    uint64_t seq;
    union {
        struct {
            int kernel;
            CUdeviceptr ptr;
            int count;
            const char *via;
        } kernel;
        struct {
            void *dst;
            const void *src;
            size_t bytes;
            void *staging;
        } copy; /* staging: freed after */
        struct {
            void *dst;
            unsigned value;
            unsigned width;
            size_t count;
        } memset;
        struct {
            CUhostFn fn;
            void *data;
        } host;
        struct {
            CUstreamCallback fn;
            void *data;
            CUstream stream;
        } callback;
        struct {
            CUevent event;
            uint64_t generation;
        } event;
        struct {
            CUevent event;
            uint64_t generation;
        } wait;
        struct {
            CUdeviceptr ptr;
        } free;
    } u;
};

struct CUevent_st {
    uint32_t magic;
    CUcontext ctx;                 /* made in; its teardown retires the event */
    struct CUevent_st *next_event; /* every live or retired event */
    uint64_t generation;           /* number of records so far */
    uint64_t done_generation;      /* the last record the fake GPU reached */
    struct timespec when;
};
#define EVENT_MAGIC 0x45564e54u

struct standin_op *standin_new_op(enum standin_op_kind kind);
/* Queues op on the stream after the checks every stream call makes (context,
 * valid handle) and logs "<function> <detail> stream=.. seq=.. result=..". */
CUresult standin_submit(const char *function, CUstream handle, struct standin_op *op,
                        const char *detail);
/* Executes a kernel op (standin_launch.c), on the stream's worker. */
void standin_run_kernel(struct standin_op *op);

/* Resolves NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD to the default
 * stream; NULL result means an invalid handle. */
struct CUstream_st *standin_stream(CUstream handle);
/* Queues op (allocated with malloc; the worker frees it) and returns its
 * sequence number on that stream. */
uint64_t standin_enqueue(struct CUstream_st *stream, struct standin_op *op);
/* Blocks until every op queued so far on the stream has run. */
void standin_stream_wait(struct CUstream_st *stream, uint64_t seq);
uint64_t standin_stream_submitted(struct CUstream_st *stream);
void standin_wait_all_streams(void);
/* Waits for the streams made in ctx, and the default stream. */
void standin_wait_context_streams(CUcontext ctx);
/* ctx is being torn down (destroyed, primary reset or released): its events
 * become invalid handles; they stay allocated, so a later use by the shim is
 * logged as "stale" instead of touching freed memory. */
void standin_retire_context_events(CUcontext ctx);
/* Frees the arrays made in ctx (standin_arrays.c), as its destroy or reset does. */
void standin_retire_context_arrays(CUcontext ctx);
void standin_streams_after_fork_child(void);

/* ---- stream capture (standin_capture.c) ---- */
/* 1 when handle names a stream the calling thread sees capturing: the work
 * submitted is captured instead of queued, and *result is what the submission
 * returns (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED into an invalidated capture). */
int standin_capture_take(CUstream handle, CUresult *result);
/* A potentially unsafe call (allocation, free, query, synchronisation,
 * prefetch): CUDA_SUCCESS when the calling thread may make it now, else
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED with the conflicting captures invalidated. */
CUresult standin_capture_check_unsafe(const char *function);
/* cuCtxSynchronize: refused during any capture, whatever the modes. */
CUresult standin_capture_check_context_sync(const char *function);
/* The stream handle was destroyed (handle not NULL) or the context ctx torn
 * down: the captures there end.  Called with standin_lock held. */
void standin_capture_end_where(CUstream handle, CUcontext ctx, const char *by);
void standin_capture_after_fork_child(void);

/* ---- memory (standin_memory.c) ---- */
enum standin_alloc_kind {
    KIND_DEVICE,
    KIND_MANAGED,
    KIND_ASYNC,
    KIND_IPC,
    KIND_VMM_RESERVE,
    KIND_VMM_MAPPING
};
/* Table of fake allocations; each takes standin_lock itself. */
int standin_track(CUdeviceptr ptr, size_t bytes, enum standin_alloc_kind kind, CUdevice dev);
/* Removes the entry of that kind starting at ptr; its size in *bytes. 0 when found. */
int standin_untrack(CUdeviceptr ptr, enum standin_alloc_kind kind, size_t *bytes);
/* Counts physical device memory (VMM handles): 0, or -1 past STANDIN_TOTAL_MEM. */
int standin_charge_device(CUdevice dev, size_t bytes);
void standin_refund_device(CUdevice dev, size_t bytes);
/* Host address of [ptr, ptr+bytes) if it lies inside one fake allocation
 * (device, managed, VMM mapping or IPC mapping), else NULL. */
void *standin_device_range(CUdeviceptr ptr, size_t bytes);
void standin_free_now(CUdeviceptr ptr);

#endif /* STANDIN_H */
