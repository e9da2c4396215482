/*
 * A grant's prefetch: the process's managed memory on a GPU brought back to
 * it in one batch (one cuMemPrefetchAsync per allocation, on a stream of the
 * shim's own), before the gate opens, rather than page by page as the
 * application touches it.  NVSHARE_PREFETCH=0 turns it off.
 */
#define _GNU_SOURCE
#include "memory_prefetch.h"

#include <stdlib.h>
#include <string.h>

#include "contexts.h"
#include "driver.h"
#include "hooks.h"
#include "log.h"
#include "memory_accounting.h"
#include "nvshare_protocol.h"

/* A grant's prefetch may be split into chunks spread over several streams
 * (an experiment: bench/gpu/prefetch_split.py builds the shim with other values). */
#ifndef NVSHARE_PREFETCH_STREAMS
#define NVSHARE_PREFETCH_STREAMS 1
#elif NVSHARE_PREFETCH_STREAMS < 1
#error "NVSHARE_PREFETCH_STREAMS must be at least 1"
#endif
#ifndef NVSHARE_PREFETCH_CHUNK_BYTES
#define NVSHARE_PREFETCH_CHUNK_BYTES (256ULL << 20)
#endif

/* The prefetch streams of each GPU and context, created on the GPU's worker. */
static CUstream prefetch_streams[NVSHARE_MAX_GPUS][NVSHARE_CONTEXT_SLOTS][NVSHARE_PREFETCH_STREAMS];

void nvshare_memory_prefetch(int gpu, int slot, void *unused)
{
    (void)unused;
    cuMemPrefetchAsync_v2_fn prefetch_v2 = NVSHARE_REAL(cuMemPrefetchAsync_v2);
    cuMemPrefetchAsync_v1_fn prefetch_v1 = NVSHARE_REAL(cuMemPrefetchAsync);
    if (prefetch_v2 == NULL && prefetch_v1 == NULL)
        return;

    size_t count = 0;
    struct nvshare_memory_range *ranges = nvshare_memory_managed_ranges(gpu, &count);
    if (count == 0) {
        free(ranges);
        return;
    }
    double started = nvshare_now_ms();
    CUstream *streams = prefetch_streams[gpu][slot];
    int stream_count = 0;
    for (; stream_count < NVSHARE_PREFETCH_STREAMS; stream_count++) {
        CUstream *stream = &streams[stream_count];
        if (*stream == NULL &&
            nvshare_driver.stream_create(stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
            *stream = NULL; /* whatever a failed call left there is no stream */
            break;
        }
    }
    uint64_t bytes = 0;
    int next_stream = 0;
    for (size_t i = 0; stream_count > 0 && i < count; i++) {
        CUmemLocation location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = gpu};
        uint64_t chunk = stream_count > 1 ? NVSHARE_PREFETCH_CHUNK_BYTES : ranges[i].bytes;
        for (uint64_t offset = 0; offset < ranges[i].bytes; offset += chunk) {
            CUdeviceptr start = ranges[i].start + offset;
            uint64_t length = ranges[i].bytes - offset < chunk ? ranges[i].bytes - offset : chunk;
            CUstream stream = streams[next_stream];
            next_stream = (next_stream + 1) % stream_count;
            /* A range freed since the snapshot only makes this call fail. */
            CUresult result = prefetch_v2 != NULL ? prefetch_v2(start, length, location, 0, stream)
                                                  : prefetch_v1(start, length, gpu, stream);
            if (result == CUDA_SUCCESS)
                bytes += length;
        }
    }
    for (int i = 0; i < stream_count; i++)
        nvshare_driver.stream_synchronize(streams[i]);
    double elapsed_ms = nvshare_now_ms() - started;
    nvshare_debug("prefetch gpu=%d allocations=%zu bytes=%llu ms=%.2f GB/s=%.1f", gpu, count,
                  (unsigned long long)bytes, elapsed_ms,
                  elapsed_ms > 0 ? (double)bytes / 1e6 / elapsed_ms : 0.0);
    free(ranges);
}

void nvshare_prefetch_forget_context(int gpu, int slot)
{
    /* Freed with their context. */
    memset(prefetch_streams[gpu][slot], 0, sizeof prefetch_streams[gpu][slot]);
}

void nvshare_prefetch_forget_after_fork(void)
{
    memset(prefetch_streams, 0, sizeof prefetch_streams);
}
