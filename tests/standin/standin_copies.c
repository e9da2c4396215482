/*
 * Stand-in driver: copies and memsets.  Each one is an operation on a stream's
 * worker, so it is ordered after the kernels queued before it; the
 * synchronous variants then wait for it (they run on the default stream, as
 * the real ones do on the legacy stream).  Host-to-device sources are staged
 * at call time, as the real driver does for pageable memory, so the caller may
 * reuse its buffer as soon as the call returns.  An asynchronous one into a
 * capturing stream is captured (logged captured=1), not run.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "standin.h"

enum { CHECK_DST = 1, CHECK_SRC = 2, STAGE_SRC = 4, SYNCHRONOUS = 8 };

static CUresult copy(const char *function, CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                     CUstream stream, int how)
{
    CUresult result = standin_require_ctx();
    struct CUstream_st *s = standin_stream(stream);
    if (result == CUDA_SUCCESS && s == NULL)
        result = CUDA_ERROR_INVALID_HANDLE;
    if (result == CUDA_SUCCESS && (dst == 0 || src == 0))
        result = CUDA_ERROR_INVALID_VALUE;
    if (result == CUDA_SUCCESS && (how & CHECK_DST) && standin_device_range(dst, bytes) == NULL)
        result = CUDA_ERROR_INVALID_VALUE;
    if (result == CUDA_SUCCESS && (how & CHECK_SRC) && standin_device_range(src, bytes) == NULL)
        result = CUDA_ERROR_INVALID_VALUE;
    if (result == CUDA_SUCCESS && !(how & SYNCHRONOUS) && standin_capture_take(stream, &result)) {
        standin_log(function, "dst=0x%llx stream=%p captured=1 result=%d", dst, (void *)stream,
                    result);
        return result;
    }
    struct standin_op *op = result == CUDA_SUCCESS && bytes > 0 ? calloc(1, sizeof *op) : NULL;
    if (result == CUDA_SUCCESS && bytes > 0 && op == NULL)
        result = CUDA_ERROR_OUT_OF_MEMORY;
    if (op != NULL) {
        op->kind = OP_COPY;
        op->u.copy.dst = (void *)(uintptr_t)dst;
        op->u.copy.src = (const void *)(uintptr_t)src;
        op->u.copy.bytes = bytes;
        if (how & STAGE_SRC) {
            if ((op->u.copy.staging = malloc(bytes)) != NULL) {
                memcpy(op->u.copy.staging, op->u.copy.src, bytes);
                op->u.copy.src = op->u.copy.staging;
            } else {
                free(op);
                op = NULL;
                result = CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
    }
    if (op != NULL) {
        uint64_t seq = standin_enqueue(s, op);
        if (how & SYNCHRONOUS)
            standin_stream_wait(s, seq);
    }
    standin_log(function, "dst=0x%llx src=0x%llx bytes=%zu stream=%p result=%d", dst, src, bytes,
                (void *)stream, result);
    return result;
}

#define HOST(p) ((CUdeviceptr)(uintptr_t)(p))

STANDIN_EXPORT CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n)
{
    return copy("cuMemcpy", d, s, n, NULL, SYNCHRONOUS);
}
STANDIN_EXPORT CUresult cuMemcpy_ptds(CUdeviceptr d, CUdeviceptr s, size_t n)
{
    return copy("cuMemcpy_ptds", d, s, n, NULL, SYNCHRONOUS);
}
STANDIN_EXPORT CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st)
{
    return copy("cuMemcpyAsync", d, s, n, st, 0);
}
STANDIN_EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st)
{
    return copy("cuMemcpyAsync_ptsz", d, s, n, st, 0);
}

STANDIN_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n)
{
    return copy("cuMemcpyHtoD_v2", d, HOST(s), n, NULL, CHECK_DST | STAGE_SRC | SYNCHRONOUS);
}
STANDIN_EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr d, const void *s, size_t n)
{
    return copy("cuMemcpyHtoD_v2_ptds", d, HOST(s), n, NULL, CHECK_DST | STAGE_SRC | SYNCHRONOUS);
}
STANDIN_EXPORT CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n)
{
    return copy("cuMemcpyDtoH_v2", HOST(d), s, n, NULL, CHECK_SRC | SYNCHRONOUS);
}
STANDIN_EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *d, CUdeviceptr s, size_t n)
{
    return copy("cuMemcpyDtoH_v2_ptds", HOST(d), s, n, NULL, CHECK_SRC | SYNCHRONOUS);
}
STANDIN_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n)
{
    return copy("cuMemcpyDtoD_v2", d, s, n, NULL, CHECK_DST | CHECK_SRC | SYNCHRONOUS);
}
STANDIN_EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr d, CUdeviceptr s, size_t n)
{
    return copy("cuMemcpyDtoD_v2_ptds", d, s, n, NULL, CHECK_DST | CHECK_SRC | SYNCHRONOUS);
}
STANDIN_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, CUstream st)
{
    return copy("cuMemcpyHtoDAsync_v2", d, HOST(s), n, st, CHECK_DST | STAGE_SRC);
}
STANDIN_EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr d, const void *s, size_t n,
                                                  CUstream st)
{
    return copy("cuMemcpyHtoDAsync_v2_ptsz", d, HOST(s), n, st, CHECK_DST | STAGE_SRC);
}
STANDIN_EXPORT CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, CUstream st)
{
    return copy("cuMemcpyDtoHAsync_v2", HOST(d), s, n, st, CHECK_SRC);
}
STANDIN_EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *d, CUdeviceptr s, size_t n, CUstream st)
{
    return copy("cuMemcpyDtoHAsync_v2_ptsz", HOST(d), s, n, st, CHECK_SRC);
}
STANDIN_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st)
{
    return copy("cuMemcpyDtoDAsync_v2", d, s, n, st, CHECK_DST | CHECK_SRC);
}
STANDIN_EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr d, CUdeviceptr s, size_t n,
                                                  CUstream st)
{
    return copy("cuMemcpyDtoDAsync_v2_ptsz", d, s, n, st, CHECK_DST | CHECK_SRC);
}

static CUresult fill(const char *function, CUdeviceptr dst, unsigned value, unsigned width,
                     size_t count, CUstream stream, int synchronous)
{
    CUresult result = standin_require_ctx();
    struct CUstream_st *s = standin_stream(stream);
    if (result == CUDA_SUCCESS && s == NULL)
        result = CUDA_ERROR_INVALID_HANDLE;
    if (result == CUDA_SUCCESS &&
        (standin_device_range(dst, count * width) == NULL || dst % width != 0))
        result = CUDA_ERROR_INVALID_VALUE;
    if (result == CUDA_SUCCESS && !synchronous && standin_capture_take(stream, &result)) {
        standin_log(function, "dst=0x%llx stream=%p captured=1 result=%d", dst, (void *)stream,
                    result);
        return result;
    }
    struct standin_op *op = result == CUDA_SUCCESS ? calloc(1, sizeof *op) : NULL;
    if (result == CUDA_SUCCESS && op == NULL)
        result = CUDA_ERROR_OUT_OF_MEMORY;
    if (op != NULL) {
        op->kind = OP_MEMSET;
        op->u.memset.dst = (void *)(uintptr_t)dst;
        op->u.memset.value = value;
        op->u.memset.width = width;
        op->u.memset.count = count;
        uint64_t seq = standin_enqueue(s, op);
        if (synchronous)
            standin_stream_wait(s, seq);
    }
    standin_log(function, "dst=0x%llx value=%u count=%zu stream=%p result=%d", dst, value, count,
                (void *)stream, result);
    return result;
}

STANDIN_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n)
{
    return fill("cuMemsetD8_v2", d, v, 1, n, NULL, 1);
}
STANDIN_EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr d, unsigned char v, size_t n)
{
    return fill("cuMemsetD8_v2_ptds", d, v, 1, n, NULL, 1);
}
STANDIN_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n)
{
    return fill("cuMemsetD32_v2", d, v, 4, n, NULL, 1);
}
STANDIN_EXPORT CUresult cuMemsetD32_v2_ptds(CUdeviceptr d, unsigned int v, size_t n)
{
    return fill("cuMemsetD32_v2_ptds", d, v, 4, n, NULL, 1);
}
STANDIN_EXPORT CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s)
{
    return fill("cuMemsetD8Async", d, v, 1, n, s, 0);
}
STANDIN_EXPORT CUresult cuMemsetD8Async_ptsz(CUdeviceptr d, unsigned char v, size_t n, CUstream s)
{
    return fill("cuMemsetD8Async_ptsz", d, v, 1, n, s, 0);
}
STANDIN_EXPORT CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s)
{
    return fill("cuMemsetD32Async", d, v, 4, n, s, 0);
}
STANDIN_EXPORT CUresult cuMemsetD32Async_ptsz(CUdeviceptr d, unsigned int v, size_t n, CUstream s)
{
    return fill("cuMemsetD32Async_ptsz", d, v, 4, n, s, 0);
}
