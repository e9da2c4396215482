/* Test client for stream-ordered allocations (cuMemAllocAsync / cuMemFreeAsync),
 * linked to libcuda (-lcuda).  Run with a long $STANDIN_KERNEL_US (the spin kernel
 * keeps a stream busy meanwhile).
 *
 *   client_stream_ordered reuse
 *       frees and allocates 1 MiB blocks on two streams and prints which
 *       allocations got the freed block back: on the freeing stream at once
 *       (same_stream), on another stream while the freeing stream still runs
 *       the work queued before the free (other_pending) and after it finished
 *       (other_done), for sizes 4x larger, 4x smaller and a little smaller
 *       (bigger, quarter, smaller); whether a kernel counts right in a block
 *       that came back (counted); and what freeing a freed block again gives.
 *   client_stream_ordered cap BLOCKS
 *       frees BLOCKS blocks of 1 MiB on one stream, then allocates 80 MiB
 *       (huge_alloc: refused on a GPU of 64 MiB, parked blocks or not) and
 *       60 MiB with cuMemAlloc: big_alloc=ok or refused.
 *   client_stream_ordered trim BLOCKS
 *       the same, with cuMemPoolTrimTo(pool, 2 MiB) after the frees.
 *
 * Prints "client=stream_ordered result=ok key=value..." or the failing call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_fixture.h"
#include "client_check.h"

#define MIB (1u << 20)

#define CHECK(call) CLIENT_CHECK("stream_ordered", call)

static int reuse(void)
{
    CUmodule module;
    CUfunction spin, add_one;
    CUstream first, second;
    CUdeviceptr a, b, c, d, e, f, g;
    CHECK(cuModuleLoadData(&module, "standin fake image"));
    CHECK(cuModuleGetFunction(&spin, module, "spin"));
    CHECK(cuModuleGetFunction(&add_one, module, "add_one"));
    CHECK(cuStreamCreate(&first, 0));
    CHECK(cuStreamCreate(&second, 0));

    CHECK(cuMemAllocAsync(&a, MIB, first));
    CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, first, NULL, NULL));
    CHECK(cuMemFreeAsync(a, first));
    CHECK(cuMemAllocAsync(&b, MIB, first)); /* behind the free on the same stream */
    CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, first, NULL, NULL));
    CHECK(cuMemFreeAsync(b, first));
    CHECK(cuMemAllocAsync(&c, MIB, second)); /* first still spins: b is not free yet */
    CHECK(cuStreamSynchronize(first));
    CHECK(cuMemAllocAsync(&d, MIB, second)); /* now it is */

    CHECK(cuMemFreeAsync(d, second));
    CHECK(cuStreamSynchronize(second));
    CHECK(cuMemAllocAsync(&e, 4 * MIB, second));
    CHECK(cuMemAllocAsync(&f, MIB / 4, second));
    CHECK(cuMemAllocAsync(&g, MIB - 4096, second));

    int counted = -1, n = 1;
    void *params[] = {&g, &n};
    CHECK(cuMemsetD32_v2(g, 41, 1));
    CHECK(cuLaunchKernel(add_one, 1, 1, 1, 1, 1, 1, 0, second, params, NULL));
    CHECK(cuStreamSynchronize(second));
    CHECK(cuMemcpyDtoH_v2(&counted, g, sizeof counted));

    CHECK(cuMemFreeAsync(g, second));
    CUresult twice = cuMemFree_v2(g), twice_async = cuMemFreeAsync(g, second);
    CHECK(cuMemFreeAsync(c, second));
    CHECK(cuMemFreeAsync(e, second));
    CHECK(cuMemFreeAsync(f, second));
    CHECK(cuStreamSynchronize(second));
    CHECK(cuStreamDestroy_v2(first));
    CHECK(cuStreamDestroy_v2(second));
    CHECK(cuModuleUnload(module));
    printf(
        "client=stream_ordered result=ok same_stream=%d other_pending=%d other_done=%d bigger=%d "
        "quarter=%d smaller=%d counted=%d freed_twice=%d freed_twice_async=%d\n",
        b == a, c == b, d == b, e == d, f == d, g == d, counted, (int)twice, (int)twice_async);
    return 0;
}

static int cap(int blocks, int trim)
{
    CUstream stream;
    CUdeviceptr pointers[256], big;
    if (blocks < 1 || blocks > 256)
        return 2;
    CHECK(cuStreamCreate(&stream, 0));
    for (int i = 0; i < blocks; i++)
        CHECK(cuMemAllocAsync(&pointers[i], MIB, stream));
    for (int i = 0; i < blocks; i++)
        CHECK(cuMemFreeAsync(pointers[i], stream));
    if (trim) /* the stand-in's pools are only handles: any non-NULL one will do */
        CHECK(cuMemPoolTrimTo((CUmemoryPool)&stream, 2 * MIB));
    CUresult huge = cuMemAlloc_v2(&big, 80 * MIB);
    if (huge == CUDA_SUCCESS)
        CHECK(cuMemFree_v2(big));
    CUresult result = cuMemAlloc_v2(&big, 60 * MIB);
    if (result == CUDA_SUCCESS)
        CHECK(cuMemFree_v2(big));
    CHECK(cuStreamDestroy_v2(stream));
    printf("client=stream_ordered result=ok huge_alloc=%s big_alloc=%s\n",
           huge == CUDA_SUCCESS ? "ok" : "refused", result == CUDA_SUCCESS ? "ok" : "refused");
    return 0;
}

int main(int argc, char **argv)
{
    int is_reuse = argc == 2 && strcmp(argv[1], "reuse") == 0;
    int is_trim = argc == 3 && strcmp(argv[1], "trim") == 0;
    if (!is_reuse && !is_trim && !(argc == 3 && strcmp(argv[1], "cap") == 0)) {
        fprintf(stderr, "usage: client_stream_ordered reuse | cap BLOCKS | trim BLOCKS\n");
        return 2;
    }
    CUcontext context;
    CLIENT_OPEN_PRIMARY_CONTEXT("stream_ordered", &context);
    return is_reuse ? reuse() : cap(atoi(argv[2]), is_trim);
}
