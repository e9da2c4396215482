/*
 * THE table of every driver symbol libnvshare.so hooks, and everything the
 * shim knows about each row.  A row gives the exported name (the shim exports
 * a function of that name with the driver's ABI, so programs linked to libcuda
 * bind to it), its kind, which default stream a NULL stream names, and
 * either the signature of a generated hook (GATED) or the prototype of a
 * hand-written one (OWN):
 *
 *   GATED(name, signature, stream, launch)
 *           submits GPU work: waits at the per-GPU gate (gate.h), then calls
 *           the driver.  The hook itself is generated in hooks.c from the
 *           row's signature (below).  launch: LAUNCH for a kernel or graph
 *           launch, which feeds the queue-ahead bound (queue_bound.c);
 *           SUBMIT for any other work (copies, sets, prefetches, ...).
 *   OWN(name, kind, stream, prototype)
 *           written by hand in the file its kind names; prototype is the
 *           function pointer type of cuda_abi.h it has, so the compiler checks
 *           each definition against its row.
 *     ALLOC   allocates device memory: converted to managed memory or passed
 *             through and counted (memory.c, memory_passthrough.c).
 *     FREE    the matching frees (memory.c, memory_passthrough.c), a pool
 *             trim and a stream's destruction (parking.c).
 *     INFO    answers differently, starts the client (cuInit, cuMemGetInfo) or
 *             tracks stream capture (capture.c).
 *     CONTEXT frees a context (or learns the primary one): the shim forgets
 *             what it kept for it first.
 *     LOOKUP  hands out function pointers: cuGetProcAddress (interpose.c).
 *
 *   stream: PER_THREAD for the _ptsz/_ptds variants, where a NULL stream names
 *   the calling thread's own default stream; LEGACY where it names the legacy
 *   default stream (or the row takes no stream).  Known when the shim is
 *   built, so no hook looks at its own name at run time.
 *
 * interpose.c maps the driver's real address of every row to the row's hook,
 * which is how dlsym and cuGetProcAddress(_v2) hand out hooks whatever
 * cudaVersion or per-thread flag the caller asks for.
 * tests/shim/test_hook_table.py parses this list and fails when a driver
 * export that submits GPU work or allocates device memory is missing, or a
 * row's stream disagrees with its name.
 *
 * Not here on purpose: the version-1 entry points with 32-bit device pointers
 * (cuMemAlloc, cuMemcpyHtoD, ... without _v2), which no header since CUDA 3.2
 * reaches; see the exemptions in the test for the full list and reasons.
 */
#ifndef NVSHARE_HOOKS_H
#define NVSHARE_HOOKS_H

#include <stddef.h>

#include "cuda_abi.h"

/* ---- the signatures of the GATED hooks ---------------------------------------------------
 * Each is (parameters), (arguments), and the stream the call goes to.  They
 * follow cuda.h of CUDA 13; several exported names share one (the _ptsz/_ptds
 * variants only change the default stream's meaning). */
#define NO_STREAM NULL

#define SIG_LAUNCH (CUfunction f), (f), NO_STREAM
#define SIG_LAUNCH_GRID \
    (CUfunction f, int grid_width, int grid_height), (f, grid_width, grid_height), NO_STREAM
#define SIG_LAUNCH_GRID_ASYNC                                         \
    (CUfunction f, int grid_width, int grid_height, CUstream stream), \
        (f, grid_width, grid_height, stream), stream
#define SIG_LAUNCH_KERNEL                                                                       \
    (CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,         \
     unsigned block_y, unsigned block_z, unsigned shared_bytes, CUstream stream, void **params, \
     void **extra),                                                                             \
        (f, grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes, stream, params,    \
         extra),                                                                                \
        stream
#define SIG_LAUNCH_KERNEL_EX                                                   \
    (const CUlaunchConfig *config, CUfunction f, void **params, void **extra), \
        (config, f, params, extra), (config ? config->hStream : NULL)
#define SIG_LAUNCH_COOPERATIVE                                                                   \
    (CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,          \
     unsigned block_y, unsigned block_z, unsigned shared_bytes, CUstream stream, void **params), \
        (f, grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes, stream, params),    \
        stream
/* Gated on the calling thread's GPU only; see docs. */
#define SIG_LAUNCH_MULTI_DEVICE                                                                \
    (CUDA_LAUNCH_PARAMS * launches, unsigned count, unsigned flags), (launches, count, flags), \
        NO_STREAM
#define SIG_LAUNCH_HOST_FUNC (CUstream stream, CUhostFn fn, void *data), (stream, fn, data), stream
#define SIG_GRAPH_LAUNCH     (CUgraphExec graph, CUstream stream), (graph, stream), stream
#define SIG_GRAPH_UPLOAD     (CUgraphExec graph, CUstream stream), (graph, stream), stream

#define SIG_COPY_PTR (CUdeviceptr dst, CUdeviceptr src, size_t bytes), (dst, src, bytes), NO_STREAM
#define SIG_COPY_PTR_ASYNC                                                                        \
    (CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream), (dst, src, bytes, stream), \
        stream
#define SIG_COPY_PEER                                                                \
    (CUdeviceptr dst, CUcontext dst_context, CUdeviceptr src, CUcontext src_context, \
     size_t bytes),                                                                  \
        (dst, dst_context, src, src_context, bytes), NO_STREAM
#define SIG_COPY_PEER_ASYNC                                                                        \
    (CUdeviceptr dst, CUcontext dst_context, CUdeviceptr src, CUcontext src_context, size_t bytes, \
     CUstream stream),                                                                             \
        (dst, dst_context, src, src_context, bytes, stream), stream
#define SIG_COPY_HTOD (CUdeviceptr dst, const void *src, size_t bytes), (dst, src, bytes), NO_STREAM
#define SIG_COPY_HTOD_ASYNC                                                                       \
    (CUdeviceptr dst, const void *src, size_t bytes, CUstream stream), (dst, src, bytes, stream), \
        stream
#define SIG_COPY_DTOH (void *dst, CUdeviceptr src, size_t bytes), (dst, src, bytes), NO_STREAM
#define SIG_COPY_DTOH_ASYNC \
    (void *dst, CUdeviceptr src, size_t bytes, CUstream stream), (dst, src, bytes, stream), stream
#define SIG_COPY_DTOA                                                \
    (CUarray dst, size_t dst_offset, CUdeviceptr src, size_t bytes), \
        (dst, dst_offset, src, bytes), NO_STREAM
#define SIG_COPY_ATOD                                                \
    (CUdeviceptr dst, CUarray src, size_t src_offset, size_t bytes), \
        (dst, src, src_offset, bytes), NO_STREAM
#define SIG_COPY_HTOA                                                \
    (CUarray dst, size_t dst_offset, const void *src, size_t bytes), \
        (dst, dst_offset, src, bytes), NO_STREAM
#define SIG_COPY_HTOA_ASYNC                                                           \
    (CUarray dst, size_t dst_offset, const void *src, size_t bytes, CUstream stream), \
        (dst, dst_offset, src, bytes, stream), stream
#define SIG_COPY_ATOH                                                                         \
    (void *dst, CUarray src, size_t src_offset, size_t bytes), (dst, src, src_offset, bytes), \
        NO_STREAM
#define SIG_COPY_ATOH_ASYNC                                                     \
    (void *dst, CUarray src, size_t src_offset, size_t bytes, CUstream stream), \
        (dst, src, src_offset, bytes, stream), stream
#define SIG_COPY_ATOA                                                               \
    (CUarray dst, size_t dst_offset, CUarray src, size_t src_offset, size_t bytes), \
        (dst, dst_offset, src, src_offset, bytes), NO_STREAM
#define SIG_COPY_2D       (const CUDA_MEMCPY2D *copy), (copy), NO_STREAM
#define SIG_COPY_2D_ASYNC (const CUDA_MEMCPY2D *copy, CUstream stream), (copy, stream), stream
#define SIG_COPY_3D       (const CUDA_MEMCPY3D *copy), (copy), NO_STREAM
#define SIG_COPY_3D_ASYNC (const CUDA_MEMCPY3D *copy, CUstream stream), (copy, stream), stream
#define SIG_COPY_3D_PEER  (const CUDA_MEMCPY3D_PEER *copy), (copy), NO_STREAM
#define SIG_COPY_3D_PEER_ASYNC \
    (const CUDA_MEMCPY3D_PEER *copy, CUstream stream), (copy, stream), stream
/* CUDA 12.8 batch copies report a failing index; CUDA 13's _v2 dropped it. */
#define SIG_COPY_BATCH_V1                                                                       \
    (CUdeviceptr * dsts, CUdeviceptr * srcs, size_t * sizes, size_t count,                      \
     CUmemcpyAttributes * attrs, size_t * attr_indices, size_t attr_count, size_t * fail_index, \
     CUstream stream),                                                                          \
        (dsts, srcs, sizes, count, attrs, attr_indices, attr_count, fail_index, stream), stream
#define SIG_COPY_BATCH_V2                                                                    \
    (CUdeviceptr * dsts, CUdeviceptr * srcs, size_t * sizes, size_t count,                   \
     CUmemcpyAttributes * attrs, size_t * attr_indices, size_t attr_count, CUstream stream), \
        (dsts, srcs, sizes, count, attrs, attr_indices, attr_count, stream), stream
#define SIG_COPY_3D_BATCH_V1                                                                    \
    (size_t count, CUDA_MEMCPY3D_BATCH_OP * ops, size_t * fail_index, unsigned long long flags, \
     CUstream stream),                                                                          \
        (count, ops, fail_index, flags, stream), stream
#define SIG_COPY_3D_BATCH_V2                                                                 \
    (size_t count, CUDA_MEMCPY3D_BATCH_OP * ops, unsigned long long flags, CUstream stream), \
        (count, ops, flags, stream), stream

#define SIG_SET_D8 \
    (CUdeviceptr dst, unsigned char value, size_t count), (dst, value, count), NO_STREAM
#define SIG_SET_D16 \
    (CUdeviceptr dst, unsigned short value, size_t count), (dst, value, count), NO_STREAM
#define SIG_SET_D32 \
    (CUdeviceptr dst, unsigned int value, size_t count), (dst, value, count), NO_STREAM
#define SIG_SET_D8_ASYNC                                                   \
    (CUdeviceptr dst, unsigned char value, size_t count, CUstream stream), \
        (dst, value, count, stream), stream
#define SIG_SET_D16_ASYNC                                                   \
    (CUdeviceptr dst, unsigned short value, size_t count, CUstream stream), \
        (dst, value, count, stream), stream
#define SIG_SET_D32_ASYNC                                                 \
    (CUdeviceptr dst, unsigned int value, size_t count, CUstream stream), \
        (dst, value, count, stream), stream
#define SIG_SET_2D(type)                                                      \
    (CUdeviceptr dst, size_t pitch, type value, size_t width, size_t height), \
        (dst, pitch, value, width, height), NO_STREAM
#define SIG_SET_2D_ASYNC(type)                                                                 \
    (CUdeviceptr dst, size_t pitch, type value, size_t width, size_t height, CUstream stream), \
        (dst, pitch, value, width, height, stream), stream
#define SIG_SET_2D8        SIG_SET_2D(unsigned char)
#define SIG_SET_2D16       SIG_SET_2D(unsigned short)
#define SIG_SET_2D32       SIG_SET_2D(unsigned int)
#define SIG_SET_2D8_ASYNC  SIG_SET_2D_ASYNC(unsigned char)
#define SIG_SET_2D16_ASYNC SIG_SET_2D_ASYNC(unsigned short)
#define SIG_SET_2D32_ASYNC SIG_SET_2D_ASYNC(unsigned int)

#define SIG_PREFETCH_V1                                                \
    (CUdeviceptr ptr, size_t bytes, CUdevice device, CUstream stream), \
        (ptr, bytes, device, stream), stream
#define SIG_PREFETCH_V2                                                                       \
    (CUdeviceptr ptr, size_t bytes, CUmemLocation location, unsigned flags, CUstream stream), \
        (ptr, bytes, location, flags, stream), stream
#define SIG_PREFETCH_BATCH                                                                         \
    (CUdeviceptr * ptrs, size_t * sizes, size_t count, CUmemLocation * locations,                  \
     size_t * location_indices, size_t location_count, unsigned long long flags, CUstream stream), \
        (ptrs, sizes, count, locations, location_indices, location_count, flags, stream), stream
#define SIG_DISCARD_BATCH                                                                          \
    (CUdeviceptr * ptrs, size_t * sizes, size_t count, unsigned long long flags, CUstream stream), \
        (ptrs, sizes, count, flags, stream), stream
#define SIG_DISCARD_PREFETCH_BATCH SIG_PREFETCH_BATCH
#define SIG_DECOMPRESS_BATCH                                                            \
    (CUmemDecompressParams * params, size_t count, unsigned flags, size_t *error_index, \
     CUstream stream),                                                                  \
        (params, count, flags, error_index, stream), stream
#define SIG_STREAM_MEM_OPS                                                            \
    (CUstream stream, unsigned count, CUstreamBatchMemOpParams *ops, unsigned flags), \
        (stream, count, ops, flags), stream
#define SIG_WRITE_VALUE32                                                     \
    (CUstream stream, CUdeviceptr address, cuuint32_t value, unsigned flags), \
        (stream, address, value, flags), stream
#define SIG_WRITE_VALUE64                                                     \
    (CUstream stream, CUdeviceptr address, cuuint64_t value, unsigned flags), \
        (stream, address, value, flags), stream

#define NVSHARE_HOOK_TABLE(GATED, OWN)                                                            \
    OWN(cuInit, INFO, LEGACY, cuInit_fn)                                                          \
    OWN(cuGetProcAddress, LOOKUP, LEGACY, cuGetProcAddress_fn)                                    \
    OWN(cuGetProcAddress_v2, LOOKUP, LEGACY, cuGetProcAddress_v2_fn)                              \
    OWN(cuMemGetInfo_v2, INFO, LEGACY, cuMemGetInfo_v2_fn)                                        \
    OWN(cuMemAlloc_v2, ALLOC, LEGACY, cuMemAlloc_v2_fn)                                           \
    OWN(cuMemAllocPitch_v2, ALLOC, LEGACY, cuMemAllocPitch_v2_fn)                                 \
    OWN(cuMemAllocManaged, ALLOC, LEGACY, cuMemAllocManaged_fn)                                   \
    OWN(cuMemAllocAsync, ALLOC, LEGACY, cuMemAllocAsync_fn)                                       \
    OWN(cuMemAllocAsync_ptsz, ALLOC, PER_THREAD, cuMemAllocAsync_fn)                              \
    OWN(cuMemAllocFromPoolAsync, ALLOC, LEGACY, cuMemAllocFromPoolAsync_fn)                       \
    OWN(cuMemAllocFromPoolAsync_ptsz, ALLOC, PER_THREAD, cuMemAllocFromPoolAsync_fn)              \
    OWN(cuMemCreate, ALLOC, LEGACY, cuMemCreate_fn)                                               \
    OWN(cuMemMap, ALLOC, LEGACY, cuMemMap_fn)                                                     \
    OWN(cuMemRetainAllocationHandle, ALLOC, LEGACY, cuMemRetainAllocationHandle_fn)               \
    OWN(cuIpcOpenMemHandle, ALLOC, LEGACY, cuIpcOpenMemHandle_fn)                                 \
    OWN(cuIpcOpenMemHandle_v2, ALLOC, LEGACY, cuIpcOpenMemHandle_fn)                              \
    OWN(cuArrayCreate_v2, ALLOC, LEGACY, cuArrayCreate_v2_fn)                                     \
    OWN(cuArray3DCreate_v2, ALLOC, LEGACY, cuArray3DCreate_v2_fn)                                 \
    OWN(cuMipmappedArrayCreate, ALLOC, LEGACY, cuMipmappedArrayCreate_fn)                         \
    OWN(cuMemFree_v2, FREE, LEGACY, cuMemFree_v2_fn)                                              \
    OWN(cuMemFreeAsync, FREE, LEGACY, cuMemFreeAsync_fn)                                          \
    OWN(cuMemFreeAsync_ptsz, FREE, PER_THREAD, cuMemFreeAsync_fn)                                 \
    OWN(cuMemPoolTrimTo, FREE, LEGACY, cuMemPoolTrimTo_fn)                                        \
    OWN(cuStreamDestroy, FREE, LEGACY, cuStreamDestroy_v2_fn)                                     \
    OWN(cuStreamDestroy_v2, FREE, LEGACY, cuStreamDestroy_v2_fn)                                  \
    OWN(cuMemRelease, FREE, LEGACY, cuMemRelease_fn)                                              \
    OWN(cuMemUnmap, FREE, LEGACY, cuMemUnmap_fn)                                                  \
    OWN(cuIpcCloseMemHandle, FREE, LEGACY, cuIpcCloseMemHandle_fn)                                \
    OWN(cuArrayDestroy, FREE, LEGACY, cuArrayDestroy_fn)                                          \
    OWN(cuMipmappedArrayDestroy, FREE, LEGACY, cuMipmappedArrayDestroy_fn)                        \
    OWN(cuStreamBeginCapture, INFO, LEGACY, cuStreamBeginCapture_fn)                              \
    OWN(cuStreamBeginCapture_ptsz, INFO, PER_THREAD, cuStreamBeginCapture_fn)                     \
    OWN(cuStreamBeginCapture_v2, INFO, LEGACY, cuStreamBeginCapture_v2_fn)                        \
    OWN(cuStreamBeginCapture_v2_ptsz, INFO, PER_THREAD, cuStreamBeginCapture_v2_fn)               \
    OWN(cuStreamBeginCaptureToGraph, INFO, LEGACY, cuStreamBeginCaptureToGraph_fn)                \
    OWN(cuStreamBeginCaptureToGraph_ptsz, INFO, PER_THREAD, cuStreamBeginCaptureToGraph_fn)       \
    OWN(cuStreamEndCapture, INFO, LEGACY, cuStreamEndCapture_fn)                                  \
    OWN(cuStreamEndCapture_ptsz, INFO, PER_THREAD, cuStreamEndCapture_fn)                         \
    OWN(cuCtxDestroy_v2, CONTEXT, LEGACY, cuCtxDestroy_v2_fn)                                     \
    OWN(cuDevicePrimaryCtxRetain, CONTEXT, LEGACY, cuDevicePrimaryCtxRetain_fn)                   \
    OWN(cuDevicePrimaryCtxRelease, CONTEXT, LEGACY, cuDevicePrimaryCtxReset_v2_fn)                \
    OWN(cuDevicePrimaryCtxRelease_v2, CONTEXT, LEGACY, cuDevicePrimaryCtxReset_v2_fn)             \
    OWN(cuDevicePrimaryCtxReset, CONTEXT, LEGACY, cuDevicePrimaryCtxReset_v2_fn)                  \
    OWN(cuDevicePrimaryCtxReset_v2, CONTEXT, LEGACY, cuDevicePrimaryCtxReset_v2_fn)               \
    GATED(cuLaunch, SIG_LAUNCH, LEGACY, LAUNCH)                                                   \
    GATED(cuLaunchGrid, SIG_LAUNCH_GRID, LEGACY, LAUNCH)                                          \
    GATED(cuLaunchGridAsync, SIG_LAUNCH_GRID_ASYNC, LEGACY, LAUNCH)                               \
    GATED(cuLaunchKernel, SIG_LAUNCH_KERNEL, LEGACY, LAUNCH)                                      \
    GATED(cuLaunchKernel_ptsz, SIG_LAUNCH_KERNEL, PER_THREAD, LAUNCH)                             \
    GATED(cuLaunchKernelEx, SIG_LAUNCH_KERNEL_EX, LEGACY, LAUNCH)                                 \
    GATED(cuLaunchKernelEx_ptsz, SIG_LAUNCH_KERNEL_EX, PER_THREAD, LAUNCH)                        \
    GATED(cuLaunchCooperativeKernel, SIG_LAUNCH_COOPERATIVE, LEGACY, LAUNCH)                      \
    GATED(cuLaunchCooperativeKernel_ptsz, SIG_LAUNCH_COOPERATIVE, PER_THREAD, LAUNCH)             \
    GATED(cuLaunchCooperativeKernelMultiDevice, SIG_LAUNCH_MULTI_DEVICE, LEGACY, SUBMIT)          \
    GATED(cuLaunchHostFunc, SIG_LAUNCH_HOST_FUNC, LEGACY, SUBMIT)                                 \
    GATED(cuLaunchHostFunc_ptsz, SIG_LAUNCH_HOST_FUNC, PER_THREAD, SUBMIT)                        \
    GATED(cuGraphLaunch, SIG_GRAPH_LAUNCH, LEGACY, LAUNCH)                                        \
    GATED(cuGraphLaunch_ptsz, SIG_GRAPH_LAUNCH, PER_THREAD, LAUNCH)                               \
    GATED(cuGraphUpload, SIG_GRAPH_UPLOAD, LEGACY, SUBMIT)                                        \
    GATED(cuGraphUpload_ptsz, SIG_GRAPH_UPLOAD, PER_THREAD, SUBMIT)                               \
    GATED(cuMemcpy, SIG_COPY_PTR, LEGACY, SUBMIT)                                                 \
    GATED(cuMemcpy_ptds, SIG_COPY_PTR, PER_THREAD, SUBMIT)                                        \
    GATED(cuMemcpyAsync, SIG_COPY_PTR_ASYNC, LEGACY, SUBMIT)                                      \
    GATED(cuMemcpyAsync_ptsz, SIG_COPY_PTR_ASYNC, PER_THREAD, SUBMIT)                             \
    GATED(cuMemcpyPeer, SIG_COPY_PEER, LEGACY, SUBMIT)                                            \
    GATED(cuMemcpyPeer_ptds, SIG_COPY_PEER, PER_THREAD, SUBMIT)                                   \
    GATED(cuMemcpyPeerAsync, SIG_COPY_PEER_ASYNC, LEGACY, SUBMIT)                                 \
    GATED(cuMemcpyPeerAsync_ptsz, SIG_COPY_PEER_ASYNC, PER_THREAD, SUBMIT)                        \
    GATED(cuMemcpyHtoD_v2, SIG_COPY_HTOD, LEGACY, SUBMIT)                                         \
    GATED(cuMemcpyHtoD_v2_ptds, SIG_COPY_HTOD, PER_THREAD, SUBMIT)                                \
    GATED(cuMemcpyHtoDAsync_v2, SIG_COPY_HTOD_ASYNC, LEGACY, SUBMIT)                              \
    GATED(cuMemcpyHtoDAsync_v2_ptsz, SIG_COPY_HTOD_ASYNC, PER_THREAD, SUBMIT)                     \
    GATED(cuMemcpyDtoH_v2, SIG_COPY_DTOH, LEGACY, SUBMIT)                                         \
    GATED(cuMemcpyDtoH_v2_ptds, SIG_COPY_DTOH, PER_THREAD, SUBMIT)                                \
    GATED(cuMemcpyDtoHAsync_v2, SIG_COPY_DTOH_ASYNC, LEGACY, SUBMIT)                              \
    GATED(cuMemcpyDtoHAsync_v2_ptsz, SIG_COPY_DTOH_ASYNC, PER_THREAD, SUBMIT)                     \
    GATED(cuMemcpyDtoD_v2, SIG_COPY_PTR, LEGACY, SUBMIT)                                          \
    GATED(cuMemcpyDtoD_v2_ptds, SIG_COPY_PTR, PER_THREAD, SUBMIT)                                 \
    GATED(cuMemcpyDtoDAsync_v2, SIG_COPY_PTR_ASYNC, LEGACY, SUBMIT)                               \
    GATED(cuMemcpyDtoDAsync_v2_ptsz, SIG_COPY_PTR_ASYNC, PER_THREAD, SUBMIT)                      \
    GATED(cuMemcpyDtoA_v2, SIG_COPY_DTOA, LEGACY, SUBMIT)                                         \
    GATED(cuMemcpyDtoA_v2_ptds, SIG_COPY_DTOA, PER_THREAD, SUBMIT)                                \
    GATED(cuMemcpyAtoD_v2, SIG_COPY_ATOD, LEGACY, SUBMIT)                                         \
    GATED(cuMemcpyAtoD_v2_ptds, SIG_COPY_ATOD, PER_THREAD, SUBMIT)                                \
    GATED(cuMemcpyHtoA_v2, SIG_COPY_HTOA, LEGACY, SUBMIT)                                         \
    GATED(cuMemcpyHtoA_v2_ptds, SIG_COPY_HTOA, PER_THREAD, SUBMIT)                                \
    GATED(cuMemcpyHtoAAsync_v2, SIG_COPY_HTOA_ASYNC, LEGACY, SUBMIT)                              \
    GATED(cuMemcpyHtoAAsync_v2_ptsz, SIG_COPY_HTOA_ASYNC, PER_THREAD, SUBMIT)                     \
    GATED(cuMemcpyAtoH_v2, SIG_COPY_ATOH, LEGACY, SUBMIT)                                         \
    GATED(cuMemcpyAtoH_v2_ptds, SIG_COPY_ATOH, PER_THREAD, SUBMIT)                                \
    GATED(cuMemcpyAtoHAsync_v2, SIG_COPY_ATOH_ASYNC, LEGACY, SUBMIT)                              \
    GATED(cuMemcpyAtoHAsync_v2_ptsz, SIG_COPY_ATOH_ASYNC, PER_THREAD, SUBMIT)                     \
    GATED(cuMemcpyAtoA_v2, SIG_COPY_ATOA, LEGACY, SUBMIT)                                         \
    GATED(cuMemcpyAtoA_v2_ptds, SIG_COPY_ATOA, PER_THREAD, SUBMIT)                                \
    GATED(cuMemcpy2D_v2, SIG_COPY_2D, LEGACY, SUBMIT)                                             \
    GATED(cuMemcpy2D_v2_ptds, SIG_COPY_2D, PER_THREAD, SUBMIT)                                    \
    GATED(cuMemcpy2DUnaligned_v2, SIG_COPY_2D, LEGACY, SUBMIT)                                    \
    GATED(cuMemcpy2DUnaligned_v2_ptds, SIG_COPY_2D, PER_THREAD, SUBMIT)                           \
    GATED(cuMemcpy2DAsync_v2, SIG_COPY_2D_ASYNC, LEGACY, SUBMIT)                                  \
    GATED(cuMemcpy2DAsync_v2_ptsz, SIG_COPY_2D_ASYNC, PER_THREAD, SUBMIT)                         \
    GATED(cuMemcpy3D_v2, SIG_COPY_3D, LEGACY, SUBMIT)                                             \
    GATED(cuMemcpy3D_v2_ptds, SIG_COPY_3D, PER_THREAD, SUBMIT)                                    \
    GATED(cuMemcpy3DAsync_v2, SIG_COPY_3D_ASYNC, LEGACY, SUBMIT)                                  \
    GATED(cuMemcpy3DAsync_v2_ptsz, SIG_COPY_3D_ASYNC, PER_THREAD, SUBMIT)                         \
    GATED(cuMemcpy3DPeer, SIG_COPY_3D_PEER, LEGACY, SUBMIT)                                       \
    GATED(cuMemcpy3DPeer_ptds, SIG_COPY_3D_PEER, PER_THREAD, SUBMIT)                              \
    GATED(cuMemcpy3DPeerAsync, SIG_COPY_3D_PEER_ASYNC, LEGACY, SUBMIT)                            \
    GATED(cuMemcpy3DPeerAsync_ptsz, SIG_COPY_3D_PEER_ASYNC, PER_THREAD, SUBMIT)                   \
    GATED(cuMemcpyBatchAsync, SIG_COPY_BATCH_V1, LEGACY, SUBMIT)                                  \
    GATED(cuMemcpyBatchAsync_ptsz, SIG_COPY_BATCH_V1, PER_THREAD, SUBMIT)                         \
    GATED(cuMemcpyBatchAsync_v2, SIG_COPY_BATCH_V2, LEGACY, SUBMIT)                               \
    GATED(cuMemcpyBatchAsync_v2_ptsz, SIG_COPY_BATCH_V2, PER_THREAD, SUBMIT)                      \
    GATED(cuMemcpy3DBatchAsync, SIG_COPY_3D_BATCH_V1, LEGACY, SUBMIT)                             \
    GATED(cuMemcpy3DBatchAsync_ptsz, SIG_COPY_3D_BATCH_V1, PER_THREAD, SUBMIT)                    \
    GATED(cuMemcpy3DBatchAsync_v2, SIG_COPY_3D_BATCH_V2, LEGACY, SUBMIT)                          \
    GATED(cuMemcpy3DBatchAsync_v2_ptsz, SIG_COPY_3D_BATCH_V2, PER_THREAD, SUBMIT)                 \
    GATED(cuMemsetD8_v2, SIG_SET_D8, LEGACY, SUBMIT)                                              \
    GATED(cuMemsetD8_v2_ptds, SIG_SET_D8, PER_THREAD, SUBMIT)                                     \
    GATED(cuMemsetD16_v2, SIG_SET_D16, LEGACY, SUBMIT)                                            \
    GATED(cuMemsetD16_v2_ptds, SIG_SET_D16, PER_THREAD, SUBMIT)                                   \
    GATED(cuMemsetD32_v2, SIG_SET_D32, LEGACY, SUBMIT)                                            \
    GATED(cuMemsetD32_v2_ptds, SIG_SET_D32, PER_THREAD, SUBMIT)                                   \
    GATED(cuMemsetD8Async, SIG_SET_D8_ASYNC, LEGACY, SUBMIT)                                      \
    GATED(cuMemsetD8Async_ptsz, SIG_SET_D8_ASYNC, PER_THREAD, SUBMIT)                             \
    GATED(cuMemsetD16Async, SIG_SET_D16_ASYNC, LEGACY, SUBMIT)                                    \
    GATED(cuMemsetD16Async_ptsz, SIG_SET_D16_ASYNC, PER_THREAD, SUBMIT)                           \
    GATED(cuMemsetD32Async, SIG_SET_D32_ASYNC, LEGACY, SUBMIT)                                    \
    GATED(cuMemsetD32Async_ptsz, SIG_SET_D32_ASYNC, PER_THREAD, SUBMIT)                           \
    GATED(cuMemsetD2D8_v2, SIG_SET_2D8, LEGACY, SUBMIT)                                           \
    GATED(cuMemsetD2D8_v2_ptds, SIG_SET_2D8, PER_THREAD, SUBMIT)                                  \
    GATED(cuMemsetD2D16_v2, SIG_SET_2D16, LEGACY, SUBMIT)                                         \
    GATED(cuMemsetD2D16_v2_ptds, SIG_SET_2D16, PER_THREAD, SUBMIT)                                \
    GATED(cuMemsetD2D32_v2, SIG_SET_2D32, LEGACY, SUBMIT)                                         \
    GATED(cuMemsetD2D32_v2_ptds, SIG_SET_2D32, PER_THREAD, SUBMIT)                                \
    GATED(cuMemsetD2D8Async, SIG_SET_2D8_ASYNC, LEGACY, SUBMIT)                                   \
    GATED(cuMemsetD2D8Async_ptsz, SIG_SET_2D8_ASYNC, PER_THREAD, SUBMIT)                          \
    GATED(cuMemsetD2D16Async, SIG_SET_2D16_ASYNC, LEGACY, SUBMIT)                                 \
    GATED(cuMemsetD2D16Async_ptsz, SIG_SET_2D16_ASYNC, PER_THREAD, SUBMIT)                        \
    GATED(cuMemsetD2D32Async, SIG_SET_2D32_ASYNC, LEGACY, SUBMIT)                                 \
    GATED(cuMemsetD2D32Async_ptsz, SIG_SET_2D32_ASYNC, PER_THREAD, SUBMIT)                        \
    GATED(cuMemPrefetchAsync, SIG_PREFETCH_V1, LEGACY, SUBMIT)                                    \
    GATED(cuMemPrefetchAsync_ptsz, SIG_PREFETCH_V1, PER_THREAD, SUBMIT)                           \
    GATED(cuMemPrefetchAsync_v2, SIG_PREFETCH_V2, LEGACY, SUBMIT)                                 \
    GATED(cuMemPrefetchAsync_v2_ptsz, SIG_PREFETCH_V2, PER_THREAD, SUBMIT)                        \
    GATED(cuMemPrefetchBatchAsync, SIG_PREFETCH_BATCH, LEGACY, SUBMIT)                            \
    GATED(cuMemPrefetchBatchAsync_ptsz, SIG_PREFETCH_BATCH, PER_THREAD, SUBMIT)                   \
    GATED(cuMemDiscardBatchAsync, SIG_DISCARD_BATCH, LEGACY, SUBMIT)                              \
    GATED(cuMemDiscardBatchAsync_ptsz, SIG_DISCARD_BATCH, PER_THREAD, SUBMIT)                     \
    GATED(cuMemDiscardAndPrefetchBatchAsync, SIG_DISCARD_PREFETCH_BATCH, LEGACY, SUBMIT)          \
    GATED(cuMemDiscardAndPrefetchBatchAsync_ptsz, SIG_DISCARD_PREFETCH_BATCH, PER_THREAD, SUBMIT) \
    GATED(cuMemBatchDecompressAsync, SIG_DECOMPRESS_BATCH, LEGACY, SUBMIT)                        \
    GATED(cuMemBatchDecompressAsync_ptsz, SIG_DECOMPRESS_BATCH, PER_THREAD, SUBMIT)               \
    GATED(cuStreamBatchMemOp, SIG_STREAM_MEM_OPS, LEGACY, SUBMIT)                                 \
    GATED(cuStreamBatchMemOp_ptsz, SIG_STREAM_MEM_OPS, PER_THREAD, SUBMIT)                        \
    GATED(cuStreamBatchMemOp_v2, SIG_STREAM_MEM_OPS, LEGACY, SUBMIT)                              \
    GATED(cuStreamBatchMemOp_v2_ptsz, SIG_STREAM_MEM_OPS, PER_THREAD, SUBMIT)                     \
    GATED(cuStreamWriteValue32, SIG_WRITE_VALUE32, LEGACY, SUBMIT)                                \
    GATED(cuStreamWriteValue32_ptsz, SIG_WRITE_VALUE32, PER_THREAD, SUBMIT)                       \
    GATED(cuStreamWriteValue32_v2, SIG_WRITE_VALUE32, LEGACY, SUBMIT)                             \
    GATED(cuStreamWriteValue32_v2_ptsz, SIG_WRITE_VALUE32, PER_THREAD, SUBMIT)                    \
    GATED(cuStreamWriteValue64, SIG_WRITE_VALUE64, LEGACY, SUBMIT)                                \
    GATED(cuStreamWriteValue64_ptsz, SIG_WRITE_VALUE64, PER_THREAD, SUBMIT)                       \
    GATED(cuStreamWriteValue64_v2, SIG_WRITE_VALUE64, LEGACY, SUBMIT)                             \
    GATED(cuStreamWriteValue64_v2_ptsz, SIG_WRITE_VALUE64, PER_THREAD, SUBMIT)

enum nvshare_hook_kind {
    NVSHARE_HOOK_GATED,
    NVSHARE_HOOK_ALLOC,
    NVSHARE_HOOK_FREE,
    NVSHARE_HOOK_INFO,
    NVSHARE_HOOK_CONTEXT,
    NVSHARE_HOOK_LOOKUP
};

/* The stream and launch columns' values. */
enum { NVSHARE_STREAM_LEGACY = 0, NVSHARE_STREAM_PER_THREAD = 1 };
enum { NVSHARE_GATED_SUBMIT = 0, NVSHARE_GATED_LAUNCH = 1 };

#define NVSHARE_HOOK_ID_GATED(name, signature, stream, launch) NVSHARE_HOOK_ID_##name,
#define NVSHARE_HOOK_ID_OWN(name, kind, stream, prototype)     NVSHARE_HOOK_ID_##name,
enum nvshare_hook_id {
    NVSHARE_HOOK_TABLE(NVSHARE_HOOK_ID_GATED, NVSHARE_HOOK_ID_OWN) NVSHARE_HOOK_COUNT
};
#undef NVSHARE_HOOK_ID_GATED
#undef NVSHARE_HOOK_ID_OWN

/* NVSHARE_HOOK_PER_THREAD(name): 1 when row name is a per-thread-stream variant. */
#define NVSHARE_PER_THREAD_GATED(name, signature, stream, launch) \
    NVSHARE_PER_THREAD_##name = NVSHARE_STREAM_##stream,
#define NVSHARE_PER_THREAD_OWN(name, kind, stream, prototype) \
    NVSHARE_PER_THREAD_##name = NVSHARE_STREAM_##stream,
enum { NVSHARE_HOOK_TABLE(NVSHARE_PER_THREAD_GATED, NVSHARE_PER_THREAD_OWN) };
#undef NVSHARE_PER_THREAD_GATED
#undef NVSHARE_PER_THREAD_OWN
#define NVSHARE_HOOK_PER_THREAD(name) NVSHARE_PER_THREAD_##name

#define NVSHARE_EXPORT __attribute__((visibility("default")))

/* A prototype for every hook: the generated ones from their signature, the
 * hand-written ones from their row's function pointer type, so that a
 * definition that does not match its row fails to compile. */
#define NVSHARE_DECLARE_GATED_(name, params, args, stream) NVSHARE_EXPORT CUresult name params;
#define NVSHARE_DECLARE_GATED(name, signature, stream, launch) \
    NVSHARE_DECLARE_GATED_(name, signature)
#define NVSHARE_DECLARE_OWN(name, kind, stream, prototype) \
    NVSHARE_EXPORT __typeof__(*(prototype)0) name;
NVSHARE_HOOK_TABLE(NVSHARE_DECLARE_GATED, NVSHARE_DECLARE_OWN)
#undef NVSHARE_DECLARE_GATED
#undef NVSHARE_DECLARE_OWN

#endif /* NVSHARE_HOOKS_H */
