/* Test client: a process under its share group's memory cap (docs/scheduling.md,
 * "Shares").
 *
 *   client_capped WAIT_MS BIG_BYTES SMALL_BYTES
 *       cuInit and a context on GPU 0; waits WAIT_MS (the agent's MEMORY_CAP comes
 *       right after its answer to HELLO); cuMemGetInfo; cuMemAlloc of BIG_BYTES
 *       (past the cap: must fail); cuMemAlloc of SMALL_BYTES and a launch on it
 *       (under the cap: the process goes on); cuMemGetInfo again.
 *
 * Prints "client=capped result=ok total=... free=... big=ERROR_NAME small=... free_after=...". */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "client_check.h"
#include "cuda_fixture.h"

#define CHECK(call) CLIENT_CHECK("capped", call)

static const char *name_of(CUresult result)
{
    const char *name = "?";
    cuGetErrorName(result, &name);
    return name;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s WAIT_MS BIG_BYTES SMALL_BYTES\n", argv[0]);
        return 2;
    }
    long wait_ms = atol(argv[1]);
    size_t big = strtoull(argv[2], NULL, 0), small = strtoull(argv[3], NULL, 0);
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    struct timespec pause = {wait_ms / 1000, (wait_ms % 1000) * 1000000L};
    nanosleep(&pause, NULL);

    size_t free_bytes = 0, total_bytes = 0;
    CHECK(cuMemGetInfo_v2(&free_bytes, &total_bytes));
    CUdeviceptr big_pointer = 0, small_pointer = 0;
    CUresult big_result = cuMemAlloc_v2(&big_pointer, big);
    if (big_result == CUDA_SUCCESS)
        CHECK(cuMemFree_v2(big_pointer));
    CUresult small_result = cuMemAlloc_v2(&small_pointer, small);
    size_t free_after = 0;
    CHECK(cuMemGetInfo_v2(&free_after, &total_bytes));
    if (small_result == CUDA_SUCCESS) {
        CHECK(cuMemsetD32_v2(small_pointer, 7, small / 4));
        CHECK(cuCtxSynchronize());
        CHECK(cuMemFree_v2(small_pointer));
    }
    CHECK(cuDevicePrimaryCtxRelease_v2(dev));
    printf("client=capped result=ok total=%zu free=%zu big=%s small=%s free_after=%zu\n",
           total_bytes, free_bytes, name_of(big_result), name_of(small_result), free_after);
    return 0;
}
