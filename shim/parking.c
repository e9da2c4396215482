/*
 * Stream-ordered frees, parked.  cuMemAllocAsync and cuMemAllocFromPoolAsync
 * become cuMemAllocManaged (memory.c), which is synchronous and slow, and a
 * fresh managed block reaches the GPU by page faults.  cuMemFreeAsync may
 * only free once the work queued on its stream before it is done: freeing at
 * once meant synchronising that stream on every free, and JAX with
 * XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async ran its steps 2.6-4.2x slower so on
 * the H100.
 *
 * So such a free parks the block: an event recorded on the freeing stream
 * marks when that stream is done with it.  A later stream-ordered allocation
 * of a fitting size (at most twice as large) takes it back if it is on the
 * same stream (stream order covers it, as in the driver's own pools) or the
 * event has completed.  Parked blocks stay counted as the process's memory
 * but are not prefetched on a grant.  They are freed for real, oldest first,
 * when a context parks more than PARKED_BLOCKS of them or more than 1/8 of
 * its GPU's memory, when an allocation needs the room, and when the
 * application trims a memory pool.  A destroyed stream's handle may name a
 * new stream at once: its blocks then wait for their events.
 *
 * Each entry keeps its event for its next block: the events live as long as
 * their context and are never destroyed here.  The mutex is held across the
 * few fast driver calls of parking and reuse (event create, record, query),
 * not across waiting for a block's stream.
 */
#define _GNU_SOURCE
#include "parking.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "capture.h"
#include "contexts.h"
#include "devices.h"
#include "hooks.h"
#include "driver.h"
#include "log.h"
#include "memory_accounting.h"
#include "nvshare_protocol.h"

#define PARKED_BLOCKS       32 /* per GPU and context */
#define PARKED_SHARE_OF_GPU 8  /* per context, at most 1/8 of its GPU's memory parked */

enum entry_state { ENTRY_FREE, ENTRY_PARKED, ENTRY_FREEING };

struct parked_block {
    enum entry_state state;
    CUdeviceptr pointer;
    uint64_t bytes;
    CUstream stream;      /* the stream that freed it */
    int stream_destroyed; /* since: the handle may name another stream */
    CUevent freed;        /* recorded on that stream at the free; kept for the next block */
    uint64_t parked_at;   /* for oldest first */
};

static pthread_mutex_t parking_mutex = PTHREAD_MUTEX_INITIALIZER;
static struct parked_block parked[NVSHARE_MAX_GPUS][NVSHARE_CONTEXT_SLOTS][PARKED_BLOCKS];
static uint64_t parked_bytes[NVSHARE_MAX_GPUS][NVSHARE_CONTEXT_SLOTS];
static uint64_t parking_clock;

/* The per-thread default stream is a different stream in every thread: only
 * its event tells when another thread may reuse a block. */
static int same_stream(const struct parked_block *block, CUstream stream)
{
    return block->stream == stream && stream != NVSHARE_CU_STREAM_PER_THREAD &&
           !block->stream_destroyed;
}

static int where(int *gpu, int *slot)
{
    CUcontext context;
    *gpu = nvshare_current_gpu(&context);
    *slot = nvshare_current_context_slot();
    return *gpu >= 0 && *gpu < NVSHARE_MAX_GPUS && *slot >= 0;
}

/* Takes the oldest parked block of (gpu, slot) out for freeing: its entry is
 * marked FREEING and *taken is a copy.  0 if none.  Mutex held. */
static int take_oldest(int gpu, int slot, struct parked_block *taken, struct parked_block **entry)
{
    struct parked_block *oldest = NULL;
    for (int i = 0; i < PARKED_BLOCKS; i++) {
        struct parked_block *block = &parked[gpu][slot][i];
        if (block->state == ENTRY_PARKED &&
            (oldest == NULL || block->parked_at < oldest->parked_at))
            oldest = block;
    }
    if (oldest == NULL)
        return 0;
    oldest->state = ENTRY_FREEING;
    parked_bytes[gpu][slot] -= oldest->bytes;
    *taken = *oldest;
    *entry = oldest;
    return 1;
}

/* Waits for the taken block's stream and frees it; then its entry is free
 * again.  Mutex not held: FREEING keeps others off the entry (and its event)
 * meanwhile, and the copy survives a context forgotten under it. */
static uint64_t free_taken(const struct parked_block *taken, struct parked_block *entry)
{
    nvshare_driver.event_synchronize(taken->freed);
    nvshare_memory_free_parked(taken->pointer);
    pthread_mutex_lock(&parking_mutex);
    if (entry->state == ENTRY_FREEING && entry->pointer == taken->pointer) {
        entry->state = ENTRY_FREE;
        entry->pointer = 0;
    }
    pthread_mutex_unlock(&parking_mutex);
    return taken->bytes;
}

uint64_t nvshare_parking_free(int gpu, uint64_t bytes)
{
    int current_gpu, slot;
    if (!where(&current_gpu, &slot) || current_gpu != gpu)
        return 0;
    pthread_mutex_lock(&parking_mutex);
    int enough = parked_bytes[gpu][slot] >= bytes;
    pthread_mutex_unlock(&parking_mutex);
    if (!enough)
        return 0; /* freeing all would not make the room: keep them */
    uint64_t freed = 0;
    struct parked_block taken, *entry;
    while (freed < bytes) {
        pthread_mutex_lock(&parking_mutex);
        int found = take_oldest(gpu, slot, &taken, &entry);
        pthread_mutex_unlock(&parking_mutex);
        if (!found)
            break;
        freed += free_taken(&taken, entry);
    }
    return freed;
}

int nvshare_park(CUdeviceptr pointer, CUstream stream)
{
    int gpu, slot;
    if (nvshare_driver.event_create == NULL || nvshare_driver.event_record == NULL ||
        nvshare_driver.event_query == NULL || nvshare_driver.event_synchronize == NULL ||
        !where(&gpu, &slot))
        return 0;
    if (!nvshare_stream_may_record(stream))
        return 0;

    struct parked_block *entry = NULL;
    for (;;) {
        pthread_mutex_lock(&parking_mutex);
        for (int i = 0; i < PARKED_BLOCKS && entry == NULL; i++) {
            if (parked[gpu][slot][i].state == ENTRY_FREE)
                entry = &parked[gpu][slot][i];
        }
        if (entry != NULL)
            break; /* with the mutex held */
        /* All taken: the oldest makes room for this one. */
        struct parked_block taken, *evicted;
        int found = take_oldest(gpu, slot, &taken, &evicted);
        pthread_mutex_unlock(&parking_mutex);
        if (!found)
            return 0; /* all of them being freed by other threads */
        free_taken(&taken, evicted);
    }
    uint64_t bytes = 0;
    int parked_now =
        (entry->freed != NULL ||
         nvshare_driver.event_create(&entry->freed, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS) &&
        nvshare_memory_set_kind(pointer, gpu, slot, ALLOCATION_CONVERTED, ALLOCATION_PARKED,
                                &bytes);
    if (parked_now && nvshare_driver.event_record(entry->freed, stream) != CUDA_SUCCESS) {
        nvshare_memory_set_kind(pointer, gpu, slot, ALLOCATION_PARKED, ALLOCATION_CONVERTED,
                                &bytes);
        parked_now = 0;
    }
    if (parked_now) {
        *entry = (struct parked_block){.state = ENTRY_PARKED,
                                       .pointer = pointer,
                                       .bytes = bytes,
                                       .stream = stream,
                                       .freed = entry->freed,
                                       .parked_at = ++parking_clock};
        parked_bytes[gpu][slot] += bytes;
    }
    /* A GPU of unknown size bounds only the number of blocks. */
    uint64_t limit = nvshare_gpu_total_bytes(gpu) / PARKED_SHARE_OF_GPU;
    uint64_t held = parked_bytes[gpu][slot];
    uint64_t excess = limit > 0 && held > limit ? held - limit : 0;
    pthread_mutex_unlock(&parking_mutex);
    if (excess > 0)
        nvshare_parking_free(gpu, excess);
    return parked_now;
}

int nvshare_unpark(size_t bytes, CUstream stream, CUdeviceptr *pointer)
{
    int gpu, slot;
    if (bytes == 0 || pointer == NULL || !where(&gpu, &slot))
        return 0;
    pthread_mutex_lock(&parking_mutex);
    struct parked_block *best = NULL;
    for (int i = 0; i < PARKED_BLOCKS; i++) {
        struct parked_block *block = &parked[gpu][slot][i];
        if (block->state != ENTRY_PARKED || block->bytes < bytes || block->bytes / 2 > bytes ||
            (best != NULL && block->bytes >= best->bytes))
            continue;
        if (same_stream(block, stream) || nvshare_driver.event_query(block->freed) == CUDA_SUCCESS)
            best = block;
    }
    if (best != NULL) {
        uint64_t block_bytes;
        best->state = ENTRY_FREE;
        parked_bytes[gpu][slot] -= best->bytes;
        *pointer = best->pointer;
        nvshare_memory_set_kind(best->pointer, gpu, slot, ALLOCATION_PARKED, ALLOCATION_CONVERTED,
                                &block_bytes);
    }
    pthread_mutex_unlock(&parking_mutex);
    return best != NULL;
}

/* A pool trim (PyTorch's empty_cache with its cudaMallocAsync backend, CuPy's
 * free_all_blocks) asks for memory back.  Converted blocks come from no pool:
 * what this process keeps for reuse is its parked blocks, so they go too, down
 * to minBytesToKeep. */
NVSHARE_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    NVSHARE_REAL_OR_RETURN(cuMemPoolTrimTo, real);
    CUresult result = real(pool, minBytesToKeep);
    int saved_errno = errno, gpu, slot;
    if (result == CUDA_SUCCESS && where(&gpu, &slot)) {
        pthread_mutex_lock(&parking_mutex);
        uint64_t held = parked_bytes[gpu][slot];
        uint64_t excess = held > minBytesToKeep ? held - minBytesToKeep : 0;
        pthread_mutex_unlock(&parking_mutex);
        uint64_t freed = excess > 0 ? nvshare_parking_free(gpu, excess) : 0;
        nvshare_debug("pool trim gpu=%d keep=%zu parked blocks freed=%llu bytes", gpu,
                      minBytesToKeep, (unsigned long long)freed);
    }
    errno = saved_errno;
    return result;
}

/* Before the driver destroys the stream: afterwards its handle may be a new stream's. */
static void forget_stream(CUstream stream)
{
    pthread_mutex_lock(&parking_mutex);
    for (int gpu = 0; gpu < NVSHARE_MAX_GPUS; gpu++) {
        for (int slot = 0; slot < NVSHARE_CONTEXT_SLOTS; slot++) {
            for (int i = 0; parked_bytes[gpu][slot] > 0 && i < PARKED_BLOCKS; i++) {
                if (parked[gpu][slot][i].state == ENTRY_PARKED &&
                    parked[gpu][slot][i].stream == stream)
                    parked[gpu][slot][i].stream_destroyed = 1;
            }
        }
    }
    pthread_mutex_unlock(&parking_mutex);
}

#define DEFINE_STREAM_DESTROY(name)                           \
    NVSHARE_EXPORT CUresult name(CUstream hStream)            \
    {                                                         \
        NVSHARE_REAL_OR_RETURN(name, real);                   \
        forget_stream(hStream);                               \
        return nvshare_capture_destroy_stream(hStream, real); \
    }
DEFINE_STREAM_DESTROY(cuStreamDestroy)
DEFINE_STREAM_DESTROY(cuStreamDestroy_v2)

void nvshare_parking_forget_context(int gpu, int slot)
{
    pthread_mutex_lock(&parking_mutex);
    memset(parked[gpu][slot], 0, sizeof parked[gpu][slot]);
    parked_bytes[gpu][slot] = 0;
    pthread_mutex_unlock(&parking_mutex);
}

void nvshare_parking_forget_after_fork(void)
{
    parking_mutex = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    memset(parked, 0, sizeof parked);
    memset(parked_bytes, 0, sizeof parked_bytes);
}
