/*
 * The GATED hooks, generated from the table in hooks.h, and the table itself.
 *
 * Each signature below is (parameters), (arguments), whether the call is a
 * kernel or graph launch (those feed the queue-ahead bound), and the stream it
 * goes to.  Signatures follow cuda.h of CUDA 13; several exported names share
 * one (the _ptsz/_ptds variants only change the default stream's meaning).
 */
#include "hooks.h"

#include <stddef.h>
#include <string.h>

#include "gate.h"
#include "interpose.h"
#include "queue_bound.h"

#define NO_LAUNCH         0, NULL
#define ON_STREAM(stream) 0, stream

#define SIG_LAUNCH (CUfunction f), (f), 1, NULL
#define SIG_LAUNCH_GRID \
    (CUfunction f, int grid_width, int grid_height), (f, grid_width, grid_height), 1, NULL
#define SIG_LAUNCH_GRID_ASYNC                                         \
    (CUfunction f, int grid_width, int grid_height, CUstream stream), \
        (f, grid_width, grid_height, stream), 1, stream
#define SIG_LAUNCH_KERNEL                                                                       \
    (CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,         \
     unsigned block_y, unsigned block_z, unsigned shared_bytes, CUstream stream, void **params, \
     void **extra),                                                                             \
        (f, grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes, stream, params,    \
         extra),                                                                                \
        1, stream
#define SIG_LAUNCH_KERNEL_EX                                                   \
    (const CUlaunchConfig *config, CUfunction f, void **params, void **extra), \
        (config, f, params, extra), 1, (config ? config->hStream : NULL)
#define SIG_LAUNCH_COOPERATIVE                                                                   \
    (CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,          \
     unsigned block_y, unsigned block_z, unsigned shared_bytes, CUstream stream, void **params), \
        (f, grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes, stream, params), 1, \
        stream
/* Gated on the calling thread's GPU only; see docs. */
#define SIG_LAUNCH_MULTI_DEVICE                                                                \
    (CUDA_LAUNCH_PARAMS * launches, unsigned count, unsigned flags), (launches, count, flags), \
        NO_LAUNCH
#define SIG_LAUNCH_HOST_FUNC \
    (CUstream stream, CUhostFn fn, void *data), (stream, fn, data), ON_STREAM(stream)
#define SIG_GRAPH_LAUNCH (CUgraphExec graph, CUstream stream), (graph, stream), 1, stream
#define SIG_GRAPH_UPLOAD (CUgraphExec graph, CUstream stream), (graph, stream), ON_STREAM(stream)

#define SIG_COPY_PTR (CUdeviceptr dst, CUdeviceptr src, size_t bytes), (dst, src, bytes), NO_LAUNCH
#define SIG_COPY_PTR_ASYNC                                                                        \
    (CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream), (dst, src, bytes, stream), \
        ON_STREAM(stream)
#define SIG_COPY_PEER                                                                \
    (CUdeviceptr dst, CUcontext dst_context, CUdeviceptr src, CUcontext src_context, \
     size_t bytes),                                                                  \
        (dst, dst_context, src, src_context, bytes), NO_LAUNCH
#define SIG_COPY_PEER_ASYNC                                                                        \
    (CUdeviceptr dst, CUcontext dst_context, CUdeviceptr src, CUcontext src_context, size_t bytes, \
     CUstream stream),                                                                             \
        (dst, dst_context, src, src_context, bytes, stream), ON_STREAM(stream)
#define SIG_COPY_HTOD (CUdeviceptr dst, const void *src, size_t bytes), (dst, src, bytes), NO_LAUNCH
#define SIG_COPY_HTOD_ASYNC                                                                       \
    (CUdeviceptr dst, const void *src, size_t bytes, CUstream stream), (dst, src, bytes, stream), \
        ON_STREAM(stream)
#define SIG_COPY_DTOH (void *dst, CUdeviceptr src, size_t bytes), (dst, src, bytes), NO_LAUNCH
#define SIG_COPY_DTOH_ASYNC                                                                 \
    (void *dst, CUdeviceptr src, size_t bytes, CUstream stream), (dst, src, bytes, stream), \
        ON_STREAM(stream)
#define SIG_COPY_DTOA                                                \
    (CUarray dst, size_t dst_offset, CUdeviceptr src, size_t bytes), \
        (dst, dst_offset, src, bytes), NO_LAUNCH
#define SIG_COPY_ATOD                                                \
    (CUdeviceptr dst, CUarray src, size_t src_offset, size_t bytes), \
        (dst, src, src_offset, bytes), NO_LAUNCH
#define SIG_COPY_HTOA                                                \
    (CUarray dst, size_t dst_offset, const void *src, size_t bytes), \
        (dst, dst_offset, src, bytes), NO_LAUNCH
#define SIG_COPY_HTOA_ASYNC                                                           \
    (CUarray dst, size_t dst_offset, const void *src, size_t bytes, CUstream stream), \
        (dst, dst_offset, src, bytes, stream), ON_STREAM(stream)
#define SIG_COPY_ATOH                                                                         \
    (void *dst, CUarray src, size_t src_offset, size_t bytes), (dst, src, src_offset, bytes), \
        NO_LAUNCH
#define SIG_COPY_ATOH_ASYNC                                                     \
    (void *dst, CUarray src, size_t src_offset, size_t bytes, CUstream stream), \
        (dst, src, src_offset, bytes, stream), ON_STREAM(stream)
#define SIG_COPY_ATOA                                                               \
    (CUarray dst, size_t dst_offset, CUarray src, size_t src_offset, size_t bytes), \
        (dst, dst_offset, src, src_offset, bytes), NO_LAUNCH
#define SIG_COPY_2D (const CUDA_MEMCPY2D *copy), (copy), NO_LAUNCH
#define SIG_COPY_2D_ASYNC \
    (const CUDA_MEMCPY2D *copy, CUstream stream), (copy, stream), ON_STREAM(stream)
#define SIG_COPY_3D (const CUDA_MEMCPY3D *copy), (copy), NO_LAUNCH
#define SIG_COPY_3D_ASYNC \
    (const CUDA_MEMCPY3D *copy, CUstream stream), (copy, stream), ON_STREAM(stream)
#define SIG_COPY_3D_PEER (const CUDA_MEMCPY3D_PEER *copy), (copy), NO_LAUNCH
#define SIG_COPY_3D_PEER_ASYNC \
    (const CUDA_MEMCPY3D_PEER *copy, CUstream stream), (copy, stream), ON_STREAM(stream)
/* CUDA 12.8 batch copies report a failing index; CUDA 13's _v2 dropped it. */
#define SIG_COPY_BATCH_V1                                                                       \
    (CUdeviceptr * dsts, CUdeviceptr * srcs, size_t * sizes, size_t count,                      \
     CUmemcpyAttributes * attrs, size_t * attr_indices, size_t attr_count, size_t * fail_index, \
     CUstream stream),                                                                          \
        (dsts, srcs, sizes, count, attrs, attr_indices, attr_count, fail_index, stream),        \
        ON_STREAM(stream)
#define SIG_COPY_BATCH_V2                                                                    \
    (CUdeviceptr * dsts, CUdeviceptr * srcs, size_t * sizes, size_t count,                   \
     CUmemcpyAttributes * attrs, size_t * attr_indices, size_t attr_count, CUstream stream), \
        (dsts, srcs, sizes, count, attrs, attr_indices, attr_count, stream), ON_STREAM(stream)
#define SIG_COPY_3D_BATCH_V1                                                                    \
    (size_t count, CUDA_MEMCPY3D_BATCH_OP * ops, size_t * fail_index, unsigned long long flags, \
     CUstream stream),                                                                          \
        (count, ops, fail_index, flags, stream), ON_STREAM(stream)
#define SIG_COPY_3D_BATCH_V2                                                                 \
    (size_t count, CUDA_MEMCPY3D_BATCH_OP * ops, unsigned long long flags, CUstream stream), \
        (count, ops, flags, stream), ON_STREAM(stream)

#define SIG_SET_D8 \
    (CUdeviceptr dst, unsigned char value, size_t count), (dst, value, count), NO_LAUNCH
#define SIG_SET_D16 \
    (CUdeviceptr dst, unsigned short value, size_t count), (dst, value, count), NO_LAUNCH
#define SIG_SET_D32 \
    (CUdeviceptr dst, unsigned int value, size_t count), (dst, value, count), NO_LAUNCH
#define SIG_SET_D8_ASYNC                                                   \
    (CUdeviceptr dst, unsigned char value, size_t count, CUstream stream), \
        (dst, value, count, stream), ON_STREAM(stream)
#define SIG_SET_D16_ASYNC                                                   \
    (CUdeviceptr dst, unsigned short value, size_t count, CUstream stream), \
        (dst, value, count, stream), ON_STREAM(stream)
#define SIG_SET_D32_ASYNC                                                 \
    (CUdeviceptr dst, unsigned int value, size_t count, CUstream stream), \
        (dst, value, count, stream), ON_STREAM(stream)
#define SIG_SET_2D(type)                                                      \
    (CUdeviceptr dst, size_t pitch, type value, size_t width, size_t height), \
        (dst, pitch, value, width, height), NO_LAUNCH
#define SIG_SET_2D_ASYNC(type)                                                                 \
    (CUdeviceptr dst, size_t pitch, type value, size_t width, size_t height, CUstream stream), \
        (dst, pitch, value, width, height, stream), ON_STREAM(stream)
#define SIG_SET_2D8        SIG_SET_2D(unsigned char)
#define SIG_SET_2D16       SIG_SET_2D(unsigned short)
#define SIG_SET_2D32       SIG_SET_2D(unsigned int)
#define SIG_SET_2D8_ASYNC  SIG_SET_2D_ASYNC(unsigned char)
#define SIG_SET_2D16_ASYNC SIG_SET_2D_ASYNC(unsigned short)
#define SIG_SET_2D32_ASYNC SIG_SET_2D_ASYNC(unsigned int)

#define SIG_PREFETCH_V1                                                \
    (CUdeviceptr ptr, size_t bytes, CUdevice device, CUstream stream), \
        (ptr, bytes, device, stream), ON_STREAM(stream)
#define SIG_PREFETCH_V2                                                                       \
    (CUdeviceptr ptr, size_t bytes, CUmemLocation location, unsigned flags, CUstream stream), \
        (ptr, bytes, location, flags, stream), ON_STREAM(stream)
#define SIG_PREFETCH_BATCH                                                                         \
    (CUdeviceptr * ptrs, size_t * sizes, size_t count, CUmemLocation * locations,                  \
     size_t * location_indices, size_t location_count, unsigned long long flags, CUstream stream), \
        (ptrs, sizes, count, locations, location_indices, location_count, flags, stream),          \
        ON_STREAM(stream)
#define SIG_DISCARD_BATCH                                                                          \
    (CUdeviceptr * ptrs, size_t * sizes, size_t count, unsigned long long flags, CUstream stream), \
        (ptrs, sizes, count, flags, stream), ON_STREAM(stream)
#define SIG_DISCARD_PREFETCH_BATCH SIG_PREFETCH_BATCH
#define SIG_DECOMPRESS_BATCH                                                            \
    (CUmemDecompressParams * params, size_t count, unsigned flags, size_t *error_index, \
     CUstream stream),                                                                  \
        (params, count, flags, error_index, stream), ON_STREAM(stream)
#define SIG_STREAM_MEM_OPS                                                            \
    (CUstream stream, unsigned count, CUstreamBatchMemOpParams *ops, unsigned flags), \
        (stream, count, ops, flags), ON_STREAM(stream)
#define SIG_WRITE_VALUE32                                                     \
    (CUstream stream, CUdeviceptr address, cuuint32_t value, unsigned flags), \
        (stream, address, value, flags), ON_STREAM(stream)
#define SIG_WRITE_VALUE64                                                     \
    (CUstream stream, CUdeviceptr address, cuuint64_t value, unsigned flags), \
        (stream, address, value, flags), ON_STREAM(stream)

void *nvshare_real[NVSHARE_HOOK_COUNT];

/* errno: the gate's slow path saves and restores it itself; the driver's own
 * errno changes reach the caller untouched. */
#define DEFINE_GATED_HOOK(name, params, args, is_launch, stream)                          \
    NVSHARE_EXPORT CUresult name params                                                   \
    {                                                                                     \
        CUresult error;                                                                   \
        CUresult(*real) params =                                                          \
            (CUresult(*) params)nvshare_real_or_error(NVSHARE_HOOK_ID_##name, &error);    \
        if (real == NULL)                                                                 \
            return error;                                                                 \
        struct nvshare_gate *gate = nvshare_gate_enter((stream), NVSHARE_HOOK_ID_##name); \
        CUresult result = real args;                                                      \
        nvshare_gate_leave(gate);                                                         \
        if ((is_launch) && gate && result == CUDA_SUCCESS)                                \
            nvshare_queue_note_launch((int)(gate - nvshare_gates), (stream),              \
                                      NVSHARE_HOOK_ID_##name);                            \
        return result;                                                                    \
    }
#define GATED_HOOK(name, signature) DEFINE_GATED_HOOK(name, signature)
#define NOT_GATED(name, kind)
NVSHARE_HOOK_TABLE(GATED_HOOK, NOT_GATED)
#undef NOT_GATED

#define GATED_ROW(name, signature) {#name, (void *)name, NVSHARE_HOOK_GATED},
#define OWN_ROW(name, kind)        {#name, (void *)name, NVSHARE_HOOK_##kind},
/* Declarations of the hand-written hooks (memory.c, interpose.c, contexts.c, ...)
 * come from their rows, so a row without a function fails to link. */
#define DECLARE_OWN(name, kind) CUresult name();
#define NO_DECLARATION(name, signature)
NVSHARE_HOOK_TABLE(NO_DECLARATION, DECLARE_OWN)

const struct nvshare_hook nvshare_hooks[NVSHARE_HOOK_COUNT] = {
    NVSHARE_HOOK_TABLE(GATED_ROW, OWN_ROW)};

int nvshare_hook_per_thread(int hook_id)
{
    const char *name = nvshare_hooks[hook_id].name;
    size_t length = strlen(name);
    const char *suffix = length > 5 ? name + length - 5 : "";
    return strcmp(suffix, "_ptsz") == 0 || strcmp(suffix, "_ptds") == 0;
}
