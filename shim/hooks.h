/*
 * THE table of every driver symbol libnvshare.so hooks.  Each row gives the
 * exported name (the shim exports a function of that name with the driver's
 * ABI, so programs linked to libcuda bind to it) and its kind:
 *
 *   GATED   submits GPU work: waits at the per-GPU gate (lock_client.c), then
 *           calls the driver.  The hook itself is generated in hooks.c from
 *           the row's signature.
 *   ALLOC   allocates device memory: converted to managed memory or passed
 *           through and counted (memory.c).
 *   FREE    the matching frees (memory.c), a pool trim and a stream's
 *           destruction (parking.c).
 *   INFO    answers differently, starts the client (cuInit, cuMemGetInfo) or
 *           tracks stream capture (capture.c).
 *   CONTEXT frees a context (or learns the primary one): the shim forgets
 *           what it kept for it first (contexts.c).
 *   LOOKUP  hands out function pointers: cuGetProcAddress (interpose.c).
 *
 * interpose.c maps the driver's real address of every row to the row's hook,
 * which is how dlsym and cuGetProcAddress(_v2) hand out hooks whatever
 * cudaVersion or per-thread flag the caller asks for.
 * tests/shim/test_hook_table.py parses this list and fails when a driver
 * export that submits GPU work or allocates device memory is missing.
 *
 * Not here on purpose: the version-1 entry points with 32-bit device pointers
 * (cuMemAlloc, cuMemcpyHtoD, ... without _v2), which no header since CUDA 3.2
 * reaches; see the exemptions in the test for the full list and reasons.
 */
#ifndef NVSHARE_HOOKS_H
#define NVSHARE_HOOKS_H

#include "cuda_abi.h"

#define NVSHARE_HOOK_TABLE(GATED, OWN)                                        \
    OWN(cuInit, INFO)                                                         \
    OWN(cuGetProcAddress, LOOKUP)                                             \
    OWN(cuGetProcAddress_v2, LOOKUP)                                          \
    OWN(cuMemGetInfo_v2, INFO)                                                \
    OWN(cuMemAlloc_v2, ALLOC)                                                 \
    OWN(cuMemAllocPitch_v2, ALLOC)                                            \
    OWN(cuMemAllocManaged, ALLOC)                                             \
    OWN(cuMemAllocAsync, ALLOC)                                               \
    OWN(cuMemAllocAsync_ptsz, ALLOC)                                          \
    OWN(cuMemAllocFromPoolAsync, ALLOC)                                       \
    OWN(cuMemAllocFromPoolAsync_ptsz, ALLOC)                                  \
    OWN(cuMemCreate, ALLOC)                                                   \
    OWN(cuMemMap, ALLOC)                                                      \
    OWN(cuMemRetainAllocationHandle, ALLOC)                                   \
    OWN(cuIpcOpenMemHandle, ALLOC)                                            \
    OWN(cuIpcOpenMemHandle_v2, ALLOC)                                         \
    OWN(cuMemFree_v2, FREE)                                                   \
    OWN(cuMemFreeAsync, FREE)                                                 \
    OWN(cuMemFreeAsync_ptsz, FREE)                                            \
    OWN(cuMemPoolTrimTo, FREE)                                                \
    OWN(cuStreamDestroy, FREE)                                                \
    OWN(cuStreamDestroy_v2, FREE)                                             \
    OWN(cuMemRelease, FREE)                                                   \
    OWN(cuMemUnmap, FREE)                                                     \
    OWN(cuIpcCloseMemHandle, FREE)                                            \
    OWN(cuStreamBeginCapture, INFO)                                           \
    OWN(cuStreamBeginCapture_ptsz, INFO)                                      \
    OWN(cuStreamBeginCapture_v2, INFO)                                        \
    OWN(cuStreamBeginCapture_v2_ptsz, INFO)                                   \
    OWN(cuStreamBeginCaptureToGraph, INFO)                                    \
    OWN(cuStreamBeginCaptureToGraph_ptsz, INFO)                               \
    OWN(cuStreamEndCapture, INFO)                                             \
    OWN(cuStreamEndCapture_ptsz, INFO)                                        \
    OWN(cuCtxDestroy_v2, CONTEXT)                                             \
    OWN(cuDevicePrimaryCtxRetain, CONTEXT)                                    \
    OWN(cuDevicePrimaryCtxRelease, CONTEXT)                                   \
    OWN(cuDevicePrimaryCtxRelease_v2, CONTEXT)                                \
    OWN(cuDevicePrimaryCtxReset, CONTEXT)                                     \
    OWN(cuDevicePrimaryCtxReset_v2, CONTEXT)                                  \
    GATED(cuLaunch, SIG_LAUNCH)                                               \
    GATED(cuLaunchGrid, SIG_LAUNCH_GRID)                                      \
    GATED(cuLaunchGridAsync, SIG_LAUNCH_GRID_ASYNC)                           \
    GATED(cuLaunchKernel, SIG_LAUNCH_KERNEL)                                  \
    GATED(cuLaunchKernel_ptsz, SIG_LAUNCH_KERNEL)                             \
    GATED(cuLaunchKernelEx, SIG_LAUNCH_KERNEL_EX)                             \
    GATED(cuLaunchKernelEx_ptsz, SIG_LAUNCH_KERNEL_EX)                        \
    GATED(cuLaunchCooperativeKernel, SIG_LAUNCH_COOPERATIVE)                  \
    GATED(cuLaunchCooperativeKernel_ptsz, SIG_LAUNCH_COOPERATIVE)             \
    GATED(cuLaunchCooperativeKernelMultiDevice, SIG_LAUNCH_MULTI_DEVICE)      \
    GATED(cuLaunchHostFunc, SIG_LAUNCH_HOST_FUNC)                             \
    GATED(cuLaunchHostFunc_ptsz, SIG_LAUNCH_HOST_FUNC)                        \
    GATED(cuGraphLaunch, SIG_GRAPH_LAUNCH)                                    \
    GATED(cuGraphLaunch_ptsz, SIG_GRAPH_LAUNCH)                               \
    GATED(cuGraphUpload, SIG_GRAPH_UPLOAD)                                    \
    GATED(cuGraphUpload_ptsz, SIG_GRAPH_UPLOAD)                               \
    GATED(cuMemcpy, SIG_COPY_PTR)                                             \
    GATED(cuMemcpy_ptds, SIG_COPY_PTR)                                        \
    GATED(cuMemcpyAsync, SIG_COPY_PTR_ASYNC)                                  \
    GATED(cuMemcpyAsync_ptsz, SIG_COPY_PTR_ASYNC)                             \
    GATED(cuMemcpyPeer, SIG_COPY_PEER)                                        \
    GATED(cuMemcpyPeer_ptds, SIG_COPY_PEER)                                   \
    GATED(cuMemcpyPeerAsync, SIG_COPY_PEER_ASYNC)                             \
    GATED(cuMemcpyPeerAsync_ptsz, SIG_COPY_PEER_ASYNC)                        \
    GATED(cuMemcpyHtoD_v2, SIG_COPY_HTOD)                                     \
    GATED(cuMemcpyHtoD_v2_ptds, SIG_COPY_HTOD)                                \
    GATED(cuMemcpyHtoDAsync_v2, SIG_COPY_HTOD_ASYNC)                          \
    GATED(cuMemcpyHtoDAsync_v2_ptsz, SIG_COPY_HTOD_ASYNC)                     \
    GATED(cuMemcpyDtoH_v2, SIG_COPY_DTOH)                                     \
    GATED(cuMemcpyDtoH_v2_ptds, SIG_COPY_DTOH)                                \
    GATED(cuMemcpyDtoHAsync_v2, SIG_COPY_DTOH_ASYNC)                          \
    GATED(cuMemcpyDtoHAsync_v2_ptsz, SIG_COPY_DTOH_ASYNC)                     \
    GATED(cuMemcpyDtoD_v2, SIG_COPY_PTR)                                      \
    GATED(cuMemcpyDtoD_v2_ptds, SIG_COPY_PTR)                                 \
    GATED(cuMemcpyDtoDAsync_v2, SIG_COPY_PTR_ASYNC)                           \
    GATED(cuMemcpyDtoDAsync_v2_ptsz, SIG_COPY_PTR_ASYNC)                      \
    GATED(cuMemcpyDtoA_v2, SIG_COPY_DTOA)                                     \
    GATED(cuMemcpyDtoA_v2_ptds, SIG_COPY_DTOA)                                \
    GATED(cuMemcpyAtoD_v2, SIG_COPY_ATOD)                                     \
    GATED(cuMemcpyAtoD_v2_ptds, SIG_COPY_ATOD)                                \
    GATED(cuMemcpyHtoA_v2, SIG_COPY_HTOA)                                     \
    GATED(cuMemcpyHtoA_v2_ptds, SIG_COPY_HTOA)                                \
    GATED(cuMemcpyHtoAAsync_v2, SIG_COPY_HTOA_ASYNC)                          \
    GATED(cuMemcpyHtoAAsync_v2_ptsz, SIG_COPY_HTOA_ASYNC)                     \
    GATED(cuMemcpyAtoH_v2, SIG_COPY_ATOH)                                     \
    GATED(cuMemcpyAtoH_v2_ptds, SIG_COPY_ATOH)                                \
    GATED(cuMemcpyAtoHAsync_v2, SIG_COPY_ATOH_ASYNC)                          \
    GATED(cuMemcpyAtoHAsync_v2_ptsz, SIG_COPY_ATOH_ASYNC)                     \
    GATED(cuMemcpyAtoA_v2, SIG_COPY_ATOA)                                     \
    GATED(cuMemcpyAtoA_v2_ptds, SIG_COPY_ATOA)                                \
    GATED(cuMemcpy2D_v2, SIG_COPY_2D)                                         \
    GATED(cuMemcpy2D_v2_ptds, SIG_COPY_2D)                                    \
    GATED(cuMemcpy2DUnaligned_v2, SIG_COPY_2D)                                \
    GATED(cuMemcpy2DUnaligned_v2_ptds, SIG_COPY_2D)                           \
    GATED(cuMemcpy2DAsync_v2, SIG_COPY_2D_ASYNC)                              \
    GATED(cuMemcpy2DAsync_v2_ptsz, SIG_COPY_2D_ASYNC)                         \
    GATED(cuMemcpy3D_v2, SIG_COPY_3D)                                         \
    GATED(cuMemcpy3D_v2_ptds, SIG_COPY_3D)                                    \
    GATED(cuMemcpy3DAsync_v2, SIG_COPY_3D_ASYNC)                              \
    GATED(cuMemcpy3DAsync_v2_ptsz, SIG_COPY_3D_ASYNC)                         \
    GATED(cuMemcpy3DPeer, SIG_COPY_3D_PEER)                                   \
    GATED(cuMemcpy3DPeer_ptds, SIG_COPY_3D_PEER)                              \
    GATED(cuMemcpy3DPeerAsync, SIG_COPY_3D_PEER_ASYNC)                        \
    GATED(cuMemcpy3DPeerAsync_ptsz, SIG_COPY_3D_PEER_ASYNC)                   \
    GATED(cuMemcpyBatchAsync, SIG_COPY_BATCH_V1)                              \
    GATED(cuMemcpyBatchAsync_ptsz, SIG_COPY_BATCH_V1)                         \
    GATED(cuMemcpyBatchAsync_v2, SIG_COPY_BATCH_V2)                           \
    GATED(cuMemcpyBatchAsync_v2_ptsz, SIG_COPY_BATCH_V2)                      \
    GATED(cuMemcpy3DBatchAsync, SIG_COPY_3D_BATCH_V1)                         \
    GATED(cuMemcpy3DBatchAsync_ptsz, SIG_COPY_3D_BATCH_V1)                    \
    GATED(cuMemcpy3DBatchAsync_v2, SIG_COPY_3D_BATCH_V2)                      \
    GATED(cuMemcpy3DBatchAsync_v2_ptsz, SIG_COPY_3D_BATCH_V2)                 \
    GATED(cuMemsetD8_v2, SIG_SET_D8)                                          \
    GATED(cuMemsetD8_v2_ptds, SIG_SET_D8)                                     \
    GATED(cuMemsetD16_v2, SIG_SET_D16)                                        \
    GATED(cuMemsetD16_v2_ptds, SIG_SET_D16)                                   \
    GATED(cuMemsetD32_v2, SIG_SET_D32)                                        \
    GATED(cuMemsetD32_v2_ptds, SIG_SET_D32)                                   \
    GATED(cuMemsetD8Async, SIG_SET_D8_ASYNC)                                  \
    GATED(cuMemsetD8Async_ptsz, SIG_SET_D8_ASYNC)                             \
    GATED(cuMemsetD16Async, SIG_SET_D16_ASYNC)                                \
    GATED(cuMemsetD16Async_ptsz, SIG_SET_D16_ASYNC)                           \
    GATED(cuMemsetD32Async, SIG_SET_D32_ASYNC)                                \
    GATED(cuMemsetD32Async_ptsz, SIG_SET_D32_ASYNC)                           \
    GATED(cuMemsetD2D8_v2, SIG_SET_2D8)                                       \
    GATED(cuMemsetD2D8_v2_ptds, SIG_SET_2D8)                                  \
    GATED(cuMemsetD2D16_v2, SIG_SET_2D16)                                     \
    GATED(cuMemsetD2D16_v2_ptds, SIG_SET_2D16)                                \
    GATED(cuMemsetD2D32_v2, SIG_SET_2D32)                                     \
    GATED(cuMemsetD2D32_v2_ptds, SIG_SET_2D32)                                \
    GATED(cuMemsetD2D8Async, SIG_SET_2D8_ASYNC)                               \
    GATED(cuMemsetD2D8Async_ptsz, SIG_SET_2D8_ASYNC)                          \
    GATED(cuMemsetD2D16Async, SIG_SET_2D16_ASYNC)                             \
    GATED(cuMemsetD2D16Async_ptsz, SIG_SET_2D16_ASYNC)                        \
    GATED(cuMemsetD2D32Async, SIG_SET_2D32_ASYNC)                             \
    GATED(cuMemsetD2D32Async_ptsz, SIG_SET_2D32_ASYNC)                        \
    GATED(cuMemPrefetchAsync, SIG_PREFETCH_V1)                                \
    GATED(cuMemPrefetchAsync_ptsz, SIG_PREFETCH_V1)                           \
    GATED(cuMemPrefetchAsync_v2, SIG_PREFETCH_V2)                             \
    GATED(cuMemPrefetchAsync_v2_ptsz, SIG_PREFETCH_V2)                        \
    GATED(cuMemPrefetchBatchAsync, SIG_PREFETCH_BATCH)                        \
    GATED(cuMemPrefetchBatchAsync_ptsz, SIG_PREFETCH_BATCH)                   \
    GATED(cuMemDiscardBatchAsync, SIG_DISCARD_BATCH)                          \
    GATED(cuMemDiscardBatchAsync_ptsz, SIG_DISCARD_BATCH)                     \
    GATED(cuMemDiscardAndPrefetchBatchAsync, SIG_DISCARD_PREFETCH_BATCH)      \
    GATED(cuMemDiscardAndPrefetchBatchAsync_ptsz, SIG_DISCARD_PREFETCH_BATCH) \
    GATED(cuMemBatchDecompressAsync, SIG_DECOMPRESS_BATCH)                    \
    GATED(cuMemBatchDecompressAsync_ptsz, SIG_DECOMPRESS_BATCH)               \
    GATED(cuStreamBatchMemOp, SIG_STREAM_MEM_OPS)                             \
    GATED(cuStreamBatchMemOp_ptsz, SIG_STREAM_MEM_OPS)                        \
    GATED(cuStreamBatchMemOp_v2, SIG_STREAM_MEM_OPS)                          \
    GATED(cuStreamBatchMemOp_v2_ptsz, SIG_STREAM_MEM_OPS)                     \
    GATED(cuStreamWriteValue32, SIG_WRITE_VALUE32)                            \
    GATED(cuStreamWriteValue32_ptsz, SIG_WRITE_VALUE32)                       \
    GATED(cuStreamWriteValue32_v2, SIG_WRITE_VALUE32)                         \
    GATED(cuStreamWriteValue32_v2_ptsz, SIG_WRITE_VALUE32)                    \
    GATED(cuStreamWriteValue64, SIG_WRITE_VALUE64)                            \
    GATED(cuStreamWriteValue64_ptsz, SIG_WRITE_VALUE64)                       \
    GATED(cuStreamWriteValue64_v2, SIG_WRITE_VALUE64)                         \
    GATED(cuStreamWriteValue64_v2_ptsz, SIG_WRITE_VALUE64)

enum nvshare_hook_kind {
    NVSHARE_HOOK_GATED,
    NVSHARE_HOOK_ALLOC,
    NVSHARE_HOOK_FREE,
    NVSHARE_HOOK_INFO,
    NVSHARE_HOOK_CONTEXT,
    NVSHARE_HOOK_LOOKUP
};

#define NVSHARE_HOOK_ID_GATED(name, sig) NVSHARE_HOOK_ID_##name,
#define NVSHARE_HOOK_ID_OWN(name, kind)  NVSHARE_HOOK_ID_##name,
enum nvshare_hook_id {
    NVSHARE_HOOK_TABLE(NVSHARE_HOOK_ID_GATED, NVSHARE_HOOK_ID_OWN) NVSHARE_HOOK_COUNT
};
#undef NVSHARE_HOOK_ID_GATED
#undef NVSHARE_HOOK_ID_OWN

struct nvshare_hook {
    const char *name; /* exported symbol, as libcuda names it */
    void *hook;       /* the shim's function of that name */
    enum nvshare_hook_kind kind;
};

extern const struct nvshare_hook nvshare_hooks[NVSHARE_HOOK_COUNT];

/* The driver's function for each row, filled by nvshare_resolve_driver()
 * (NULL when this driver lacks it). */
extern void *nvshare_real[NVSHARE_HOOK_COUNT];

/* 1 when the row is a per-thread-default-stream variant (_ptsz, _ptds): NULL
 * names the calling thread's own default stream.  Not for the fast path. */
int nvshare_hook_per_thread(int hook_id);

/* Typed access to a row's real function, for the shim's own calls (hooks start with
 * NVSHARE_REAL_OR_ERROR, interpose.h): REAL(cuMemAlloc_v2, cuMemAlloc_v2_fn). */
#define NVSHARE_REAL(name, type) ((type)nvshare_real[NVSHARE_HOOK_ID_##name])

#define NVSHARE_EXPORT __attribute__((visibility("default")))

#endif /* NVSHARE_HOOKS_H */
