/* Test client with several contexts on one GPU, linked to libcuda (-lcuda).
 *
 *   client_contexts two SLEEP_MS
 *       context A queues one spin kernel on its stream; context B then makes
 *       a small memset (so B is the context used last); then the process idles
 *       for SLEEP_MS, during which the shim releases the lock: that release
 *       must wait for A's kernel too.
 *   client_contexts lifecycle LAUNCHES
 *       LAUNCHES kernels in a created context, which is then destroyed with
 *       1 MiB and a 1 MiB array still allocated in it; the
 *       same in the primary context, which is then reset and used again, and
 *       finally released.  The shim must not use anything of a context the
 *       driver has freed (the stand-in logs such uses as "stale").
 *
 * Prints "client=contexts result=ok ..." or the failing call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_fixture.h"
#include "client_check.h"

#define CHECK(call) CLIENT_CHECK("contexts", call)

static void sleep_ms(long ms)
{
    struct timespec pause = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&pause, NULL);
}

static int launch_many(const char *kernel, int launches)
{
    CUmodule module;
    CUfunction function;
    CUstream stream;
    CUdeviceptr counter;
    CHECK(cuModuleLoadData(&module, "standin fake image"));
    CHECK(cuModuleGetFunction(&function, module, kernel));
    CHECK(cuStreamCreate(&stream, 0));
    CHECK(cuMemAlloc_v2(&counter, sizeof(int)));
    CHECK(cuMemsetD32_v2(counter, 0, 1));
    int n = 1;
    void *params[] = {&counter, &n};
    for (int i = 0; i < launches; i++)
        CHECK(cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL));
    CHECK(cuStreamSynchronize(stream));
    int value = 0;
    CHECK(cuMemcpyDtoH_v2(&value, counter, sizeof value));
    if (strcmp(kernel, "add_one") == 0 && value != launches) {
        printf("client=contexts result=wrong counter=%d launches=%d\n", value, launches);
        return 1;
    }
    CHECK(cuMemFree_v2(counter));
    CHECK(cuStreamDestroy_v2(stream));
    CHECK(cuModuleUnload(module));
    return 0;
}

static int two_contexts(long idle_ms)
{
    CUdevice device;
    CUcontext a, b;
    CUmodule module;
    CUfunction spin;
    CUstream stream_a;
    CUdeviceptr small;
    CHECK(cuDeviceGet(&device, 0));
    CHECK(cuCtxCreate_v2(&a, 0, device));
    CHECK(cuModuleLoadData(&module, "standin fake image"));
    CHECK(cuModuleGetFunction(&spin, module, "spin"));
    CHECK(cuStreamCreate(&stream_a, 0));
    CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream_a, NULL, NULL));
    CHECK(cuCtxCreate_v2(&b, 0, device));
    CHECK(cuMemAlloc_v2(&small, 64));
    CHECK(cuMemsetD32_v2(small, 7, 16));
    sleep_ms(idle_ms);
    CHECK(cuMemFree_v2(small));
    CHECK(cuCtxDestroy_v2(b));
    CHECK(cuCtxDestroy_v2(a));
    printf("client=contexts result=ok mode=two\n");
    return 0;
}

static int lifecycle(int launches)
{
    CUdevice device;
    CUcontext created, primary;
    CHECK(cuDeviceGet(&device, 0));
    CUdeviceptr left_behind;
    CHECK(cuCtxCreate_v2(&created, 0, device));
    if (launch_many("add_one", launches) != 0)
        return 1;
    CHECK(cuMemAlloc_v2(&left_behind, 1 << 20)); /* freed by the driver with its context */
    CUarray array_left_behind;
    CUDA_ARRAY_DESCRIPTOR float4_rows = {1 << 16, 1, CU_AD_FORMAT_FLOAT, 4}; /* 1 MiB */
    CHECK(cuArrayCreate_v2(&array_left_behind, &float4_rows));
    CHECK(cuCtxDestroy_v2(created));

    CHECK(cuDevicePrimaryCtxRetain(&primary, device));
    CHECK(cuCtxSetCurrent(primary));
    if (launch_many("add_one", launches) != 0)
        return 1;
    CHECK(cuDevicePrimaryCtxReset(device)); /* the name cudaDeviceReset reaches (CUDA 13) */
    CHECK(cuCtxSetCurrent(primary));
    if (launch_many("add_one", launches) != 0)
        return 1;
    CHECK(cuCtxSetCurrent(NULL));
    CHECK(cuDevicePrimaryCtxRelease_v2(device));
    sleep_ms(300); /* an idle release comes and goes */
    printf("client=contexts result=ok mode=lifecycle launches=%d\n", launches);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[1], "two") != 0 && strcmp(argv[1], "lifecycle") != 0)) {
        fprintf(stderr, "usage: client_contexts two IDLE_MS | lifecycle LAUNCHES\n");
        return 2;
    }
    if (cuInit(0) != CUDA_SUCCESS) {
        printf("client=contexts result=error call=cuInit\n");
        return 1;
    }
    return strcmp(argv[1], "two") == 0 ? two_contexts(atol(argv[2])) : lifecycle(atoi(argv[2]));
}
