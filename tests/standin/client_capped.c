/* Test client: a process under its share group's memory cap (docs/scheduling.md,
 * "Shares").
 *
 *   client_capped WAIT BIG_BYTES SMALL_BYTES [PATH]
 *       cuInit and a context on GPU 0; waits WAIT: a number of milliseconds (0: none,
 *       the allocation right after the context, before the agent's answer could
 *       have come unless the shim waits for it), or the path of a file to wait for
 *       (the test creates it when the cap has changed); cuMemGetInfo; an allocation
 *       of BIG_BYTES by PATH (past the cap: must fail); cuMemAlloc of SMALL_BYTES
 *       and a memset on it (under the cap: the process goes on); cuMemGetInfo again.
 *       PATH, how the big one is allocated: alloc (cuMemAlloc_v2, the default),
 *       pitch (cuMemAllocPitch_v2, rows of 1 MiB), managed (cuMemAllocManaged),
 *       async (cuMemAllocAsync), pool (cuMemAllocFromPoolAsync), vmm (cuMemCreate).
 *
 * Prints "client=capped result=ok total=... free=... big=ERROR_NAME small=... free_after=...". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client_check.h"
#include "cuda_fixture.h"

#define CHECK(call) CLIENT_CHECK("capped", call)
#define MIB         ((size_t)1 << 20)

static const char *name_of(CUresult result)
{
    const char *name = "?";
    cuGetErrorName(result, &name);
    return name;
}

static void pause_ms(long ms)
{
    struct timespec pause = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&pause, NULL);
}

/* A number: that many milliseconds; else a file to wait for (at most a minute). */
static void wait_for(const char *what)
{
    char *end;
    long ms = strtol(what, &end, 10);
    if (*end == '\0') {
        pause_ms(ms);
        return;
    }
    for (int tries = 0; access(what, F_OK) != 0 && tries < 60000; tries++)
        pause_ms(1);
}

/* Allocates bytes by path and frees it again if that worked. */
static CUresult allocate_big(const char *path, size_t bytes)
{
    CUdeviceptr pointer = 0;
    CUresult result;
    if (strcmp(path, "alloc") == 0) {
        result = cuMemAlloc_v2(&pointer, bytes);
    } else if (strcmp(path, "pitch") == 0) {
        size_t pitch = 0;
        result = cuMemAllocPitch_v2(&pointer, &pitch, MIB, (bytes + MIB - 1) / MIB, 4);
    } else if (strcmp(path, "managed") == 0) {
        result = cuMemAllocManaged(&pointer, bytes, CU_MEM_ATTACH_GLOBAL);
    } else if (strcmp(path, "async") == 0 || strcmp(path, "pool") == 0) {
        CUstream stream;
        CHECK(cuStreamCreate(&stream, 0));
        static int pool_stand_in; /* the stand-in takes any pool */
        result =
            strcmp(path, "async") == 0
                ? cuMemAllocAsync(&pointer, bytes, stream)
                : cuMemAllocFromPoolAsync(&pointer, bytes, (CUmemoryPool)&pool_stand_in, stream);
        if (result == CUDA_SUCCESS)
            CHECK(cuMemFreeAsync(pointer, stream));
        CHECK(cuStreamSynchronize(stream));
        CHECK(cuStreamDestroy_v2(stream));
        return result;
    } else if (strcmp(path, "vmm") == 0) {
        CUmemAllocationProp prop = {0};
        prop.type = 1; /* CU_MEM_ALLOCATION_TYPE_PINNED */
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        CUmemGenericAllocationHandle handle = 0;
        result = cuMemCreate(&handle, bytes, &prop, 0);
        if (result == CUDA_SUCCESS)
            CHECK(cuMemRelease(handle));
        return result;
    } else {
        fprintf(stderr, "client_capped: no allocation path %s\n", path);
        exit(2);
    }
    if (result == CUDA_SUCCESS)
        CHECK(cuMemFree_v2(pointer));
    return result;
}

int main(int argc, char **argv)
{
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: %s WAIT_MS|FILE BIG_BYTES SMALL_BYTES [PATH]\n", argv[0]);
        return 2;
    }
    size_t big = strtoull(argv[2], NULL, 0), small = strtoull(argv[3], NULL, 0);
    const char *path = argc == 5 ? argv[4] : "alloc";
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    wait_for(argv[1]);

    size_t free_bytes = 0, total_bytes = 0;
    CHECK(cuMemGetInfo_v2(&free_bytes, &total_bytes));
    CUresult big_result = allocate_big(path, big);
    CUdeviceptr small_pointer = 0;
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
