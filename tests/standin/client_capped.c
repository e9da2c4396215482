/* Test client: a process under its share group's memory cap (docs/scheduling.md,
 * "Shares").
 *
 *   client_capped WAIT BIG_BYTES SMALL_BYTES [PATH]
 *       cuInit and a context on GPU 0; waits WAIT: a number of milliseconds (0: none,
 *       the allocation right after the context, before the agent's answer could
 *       have come unless the shim waits for it), or the path of a file to wait for
 *       (the test creates it when the cap has changed); cuMemGetInfo; an allocation
 *       of BIG_BYTES by PATH (past the cap: must fail); cuMemAlloc of SMALL_BYTES
 *       and a memset on it (under the cap: the process goes on); cuMemGetInfo again
 *       (free_after, the big one still held if it was made); both freed, cuMemGetInfo
 *       (free_end).
 *       PATH, how the big one is allocated: alloc (cuMemAlloc_v2, the default),
 *       pitch (cuMemAllocPitch_v2, rows of 1 MiB), managed (cuMemAllocManaged),
 *       async (cuMemAllocAsync), pool (cuMemAllocFromPoolAsync), vmm (cuMemCreate),
 *       array (cuArrayCreate_v2: float4 rows of 1 MiB), array3d (cuArray3DCreate_v2:
 *       float4 slices of 256 x 256, 1 MiB each), mipmapped (cuMipmappedArrayCreate:
 *       as many 1 MiB float4 layers of 256 x 256, layered, MIPMAP_LEVELS levels:
 *       21/16 of the layers' MiB).
 *
 * Prints "client=capped result=ok total=... free=... big=ERROR_NAME small=... free_after=...
 * free_end=...". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client_check.h"
#include "cuda_fixture.h"

#define CHECK(call)   CLIENT_CHECK("capped", call)
#define MIB           ((size_t)1 << 20)
#define MIPMAP_LEVELS 3

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

/* The big allocation, held until after the second cuMemGetInfo. */
struct big {
    const char *path;
    CUresult result;
    CUdeviceptr pointer;
    CUstream stream;
    CUmemGenericAllocationHandle handle;
    CUarray array;
    CUmipmappedArray mipmapped;
};

/* Float4 texels: rows of 1 MiB (65536 texels), or slices and layers of 256 x 256. */
#define TEXEL_BYTES 16

/* Allocates big->path's way; big->result says how that went. */
static int allocate_big(struct big *big, size_t bytes)
{
    const char *path = big->path;
    size_t mibs = (bytes + MIB - 1) / MIB;
    if (strcmp(path, "alloc") == 0) {
        big->result = cuMemAlloc_v2(&big->pointer, bytes);
    } else if (strcmp(path, "pitch") == 0) {
        size_t pitch = 0;
        big->result = cuMemAllocPitch_v2(&big->pointer, &pitch, MIB, mibs, 4);
    } else if (strcmp(path, "managed") == 0) {
        big->result = cuMemAllocManaged(&big->pointer, bytes, CU_MEM_ATTACH_GLOBAL);
    } else if (strcmp(path, "async") == 0 || strcmp(path, "pool") == 0) {
        CHECK(cuStreamCreate(&big->stream, 0));
        static int pool_stand_in; /* the stand-in takes any pool */
        big->result = strcmp(path, "async") == 0
                          ? cuMemAllocAsync(&big->pointer, bytes, big->stream)
                          : cuMemAllocFromPoolAsync(&big->pointer, bytes,
                                                    (CUmemoryPool)&pool_stand_in, big->stream);
    } else if (strcmp(path, "vmm") == 0) {
        CUmemAllocationProp prop = {0};
        prop.type = 1; /* CU_MEM_ALLOCATION_TYPE_PINNED */
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        big->result = cuMemCreate(&big->handle, bytes, &prop, 0);
    } else if (strcmp(path, "array") == 0) {
        CUDA_ARRAY_DESCRIPTOR desc = {MIB / TEXEL_BYTES, mibs, CU_AD_FORMAT_FLOAT, 4};
        big->result = cuArrayCreate_v2(&big->array, &desc);
    } else if (strcmp(path, "array3d") == 0) {
        CUDA_ARRAY3D_DESCRIPTOR desc = {256, 256, mibs, CU_AD_FORMAT_FLOAT, 4, 0};
        big->result = cuArray3DCreate_v2(&big->array, &desc);
    } else if (strcmp(path, "mipmapped") == 0) {
        CUDA_ARRAY3D_DESCRIPTOR desc = {
            256, 256, mibs, CU_AD_FORMAT_FLOAT, 4, CUDA_ARRAY3D_LAYERED};
        big->result = cuMipmappedArrayCreate(&big->mipmapped, &desc, MIPMAP_LEVELS);
    } else {
        fprintf(stderr, "client_capped: no allocation path %s\n", path);
        exit(2);
    }
    return 0;
}

/* Frees the big allocation if it was made (and the stream it was made on). */
static int free_big(struct big *big)
{
    int made = big->result == CUDA_SUCCESS;
    if (made && big->stream != NULL)
        CHECK(cuMemFreeAsync(big->pointer, big->stream));
    else if (made && big->handle != 0)
        CHECK(cuMemRelease(big->handle));
    else if (made && big->array != NULL)
        CHECK(cuArrayDestroy(big->array));
    else if (made && big->mipmapped != NULL)
        CHECK(cuMipmappedArrayDestroy(big->mipmapped));
    else if (made)
        CHECK(cuMemFree_v2(big->pointer));
    if (big->stream != NULL) {
        CHECK(cuStreamSynchronize(big->stream));
        CHECK(cuStreamDestroy_v2(big->stream));
    }
    return 0;
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
    struct big held = {.path = path};
    if (allocate_big(&held, big) != 0)
        return 1;
    CUdeviceptr small_pointer = 0;
    CUresult small_result = cuMemAlloc_v2(&small_pointer, small);
    size_t free_after = 0, free_end = 0;
    CHECK(cuMemGetInfo_v2(&free_after, &total_bytes));
    if (small_result == CUDA_SUCCESS) {
        CHECK(cuMemsetD32_v2(small_pointer, 7, small / 4));
        CHECK(cuCtxSynchronize());
        CHECK(cuMemFree_v2(small_pointer));
    }
    if (free_big(&held) != 0)
        return 1;
    CHECK(cuMemGetInfo_v2(&free_end, &total_bytes));
    CHECK(cuDevicePrimaryCtxRelease_v2(dev));
    printf("client=capped result=ok total=%zu free=%zu big=%s small=%s free_after=%zu "
           "free_end=%zu\n",
           total_bytes, free_bytes, name_of(held.result), name_of(small_result), free_after,
           free_end);
    return 0;
}
