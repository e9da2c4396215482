/* What the shim's launch path costs on the CPU, inside one process: a spin()
 * launch through the shim's cuLaunchKernel hook (the linked symbol, which the
 * preloaded shim takes) against the stand-in's own (glibc's dlsym, which the
 * shim does not interpose), alternating block by block.  Run under the shim
 * with STANDIN_LAUNCH_NOOP=1, so the stand-in's launch is only its argument
 * check and the difference is the hook, the gate and the queue bound's count
 * (bench/shim_launch_cost.py; bench/gpu/hook_cost.cu does the same on a GPU).
 *   client_launch_cost [BLOCKS] [LAUNCHES_PER_BLOCK]
 * Prints one JSON line: ns per launch of every block, each path. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "client_check.h"

typedef void *(*dlsym_fn)(void *, const char *);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void print_list(const char *key, const double *values, int count)
{
    printf("\"%s\": [", key);
    for (int i = 0; i < count; i++)
        printf("%s%.2f", i ? ", " : "", values[i]);
    printf("]");
}

int main(int argc, char **argv)
{
    int blocks = argc > 1 ? atoi(argv[1]) : 20000;
    int per_block = argc > 2 ? atoi(argv[2]) : 64;
    if (blocks < 1 || per_block < 1) {
        fprintf(stderr,
                "client_launch_cost: BLOCKS and LAUNCHES_PER_BLOCK must be positive numbers\n");
        return 2;
    }
    CUcontext context;
    CUmodule module;
    CUfunction spin;
    CLIENT_OPEN_PRIMARY_CONTEXT("launch_cost", &context);
    CLIENT_CHECK("launch_cost", cuModuleLoadData(&module, "standin fake image"));
    CLIENT_CHECK("launch_cost", cuModuleGetFunction(&spin, module, "spin"));

    /* glibc's own dlsym, taken from libc by version so the shim's dlsym is not asked. */
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    dlsym_fn glibc_dlsym = libc ? (dlsym_fn)dlvsym(libc, "dlsym", "GLIBC_2.34") : NULL;
    if (glibc_dlsym == NULL && libc != NULL)
        glibc_dlsym = (dlsym_fn)dlvsym(libc, "dlsym", "GLIBC_2.2.5");
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (glibc_dlsym == NULL || cuda == NULL) {
        fprintf(stderr, "client_launch_cost: cannot find glibc's dlsym or libcuda.so.1\n");
        return 1;
    }
    launch_fn paths[2] = {(launch_fn)glibc_dlsym(cuda, "cuLaunchKernel"), cuLaunchKernel};
    if (paths[0] == NULL || paths[0] == paths[1]) {
        fprintf(stderr,
                "client_launch_cost: the hooked and the driver's cuLaunchKernel are one function: "
                "is the shim preloaded?\n");
        return 1;
    }

    double *ns[2] = {malloc(sizeof(double) * blocks), malloc(sizeof(double) * blocks)};
    if (ns[0] == NULL || ns[1] == NULL)
        return 1;
    const int warm_up = 200;
    for (int block = -warm_up; block < blocks; block++) {
        for (int turn = 0; turn < 2; turn++) {
            int path = block < 0 ? turn : (block + turn) % 2; /* the order flips every block */
            double start = now_ns();
            for (int i = 0; i < per_block; i++)
                if (paths[path](spin, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS) {
                    fprintf(stderr, "client_launch_cost: cuLaunchKernel failed\n");
                    return 1;
                }
            double elapsed = now_ns() - start;
            if (block >= 0)
                ns[path][block] = elapsed / per_block;
        }
    }
    printf("{\"blocks\": %d, \"launches_per_block\": %d, ", blocks, per_block);
    print_list("driver_ns", ns[0], blocks);
    printf(", ");
    print_list("hook_ns", ns[1], blocks);
    printf("}\n");
    return 0;
}
