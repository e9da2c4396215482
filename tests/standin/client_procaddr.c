/* Test client that reaches the driver as statically linked cudart does:
 * dlsym only cuGetProcAddress_v2, ask it for "cuGetProcAddress" (which
 * returns cuGetProcAddress_v2 again, possibly interposed), and resolve every
 * other function by its base name through that, with cudaVersion 13000.
 * --per-thread asks with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, as
 * code built with --default-stream per-thread does (_ptsz/_ptds variants). */
#include <dlfcn.h>
#include <stdio.h>

#include "workload.h"

#define CUDA_VERSION_ASKED 13000

static int load_procaddr(struct driver *driver, int per_thread)
{
    void *handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        fprintf(stderr, "client_procaddr: %s\n", dlerror());
        return -1;
    }
    __typeof__(&cuGetProcAddress_v2) bootstrap;
    *(void **)&bootstrap = dlsym(handle, "cuGetProcAddress_v2");
    if (bootstrap == NULL) {
        fprintf(stderr, "client_procaddr: no symbol cuGetProcAddress_v2\n");
        return -1;
    }
    __typeof__(&cuGetProcAddress_v2) get_proc = NULL;
    CUdriverProcAddressQueryResult status;
    if (bootstrap("cuGetProcAddress", (void **)&get_proc, CUDA_VERSION_ASKED,
                  CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS ||
        get_proc == NULL) {
        fprintf(stderr, "client_procaddr: cuGetProcAddress did not resolve itself (status %d)\n",
                (int)status);
        return -1;
    }
    cuuint64_t flags =
        per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT;
#define STANDIN_PROCADDR(base, symbol)                                                       \
    if (get_proc(#base, (void **)&driver->base, CUDA_VERSION_ASKED, flags, &status) !=       \
            CUDA_SUCCESS ||                                                                  \
        driver->base == NULL) {                                                              \
        fprintf(stderr, "client_procaddr: cuGetProcAddress(%s) failed (status %d)\n", #base, \
                (int)status);                                                                \
        return -1;                                                                           \
    }
    DRIVER_API(STANDIN_PROCADDR)
#undef STANDIN_PROCADDR
    return 0;
}

int main(int argc, char **argv)
{
    return client_main("procaddr", load_procaddr, argc, argv);
}
