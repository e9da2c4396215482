/*
 * A driver-API program for tests/gpu/test_old_glibc_container.py, built with
 * gcc alone inside an older distribution's root (tests/gpu/make_old_glibc_root.sh)
 * so that it needs nothing newer than that root's glibc.  It allocates with
 * cuMemAlloc, runs add_one from a cubin LAUNCHES times, checks every element and
 * prints one line: result, whether the allocation came back managed, its pid.
 *
 *     old_glibc_client CUBIN ELEMENTS LAUNCHES
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../standin/cuda_fixture.h"

#define CHECK(call)                                                                     \
    do {                                                                                \
        CUresult check_result_ = (call);                                                \
        if (check_result_ != CUDA_SUCCESS) {                                            \
            printf("result=error call=%s error=%d pid=%d\n", #call, (int)check_result_, \
                   (int)getpid());                                                      \
            return 1;                                                                   \
        }                                                                               \
    } while (0)

static void *read_file(const char *path)
{
    FILE *file = fopen(path, "rb");
    if (file == NULL)
        return NULL;
    fseek(file, 0, SEEK_END);
    long size = ftell(file);
    rewind(file);
    char *bytes = malloc((size_t)size);
    if (bytes != NULL && fread(bytes, 1, (size_t)size, file) != (size_t)size) {
        free(bytes);
        bytes = NULL;
    }
    fclose(file);
    return bytes;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s CUBIN ELEMENTS LAUNCHES\n", argv[0]);
        return 2;
    }
    void *image = read_file(argv[1]);
    unsigned elements = (unsigned)strtoul(argv[2], NULL, 10);
    int launches = atoi(argv[3]);
    if (image == NULL || elements == 0) {
        fprintf(stderr, "cannot read %s, or no elements\n", argv[1]);
        return 2;
    }
    CUdevice device;
    CUcontext context;
    CUmodule module;
    CUfunction add_one;
    CUdeviceptr data;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&device, 0));
    CHECK(cuDevicePrimaryCtxRetain(&context, device));
    CHECK(cuCtxSetCurrent(context));
    CHECK(cuModuleLoadData(&module, image));
    CHECK(cuModuleGetFunction(&add_one, module, "add_one"));
    CHECK(cuMemAlloc_v2(&data, (size_t)elements * 4));
    CHECK(cuMemsetD32_v2(data, 0, elements));
    void *arguments[] = {&data, &elements};
    for (int i = 0; i < launches; i++)
        CHECK(cuLaunchKernel(add_one, (elements + 255) / 256, 1, 1, 256, 1, 1, 0, NULL, arguments,
                             NULL));
    unsigned *host = malloc((size_t)elements * 4);
    CHECK(cuMemcpyDtoH_v2(host, data, (size_t)elements * 4));
    unsigned wrong = 0;
    for (unsigned i = 0; i < elements; i++)
        wrong += host[i] != (unsigned)launches;
    unsigned managed = 0;
    CHECK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, data));
    CHECK(cuMemFree_v2(data));
    printf("result=%s wrong=%u managed=%u pid=%d\n", wrong == 0 ? "ok" : "wrong", wrong, managed,
           (int)getpid());
    return wrong == 0 ? 0 : 1;
}
