// The GPU test programs' checks: a failing call prints one "result=error" line naming it
// and ends the program with status 1.
#ifndef NVSHARE_TESTS_GPU_CHECK_CUH
#define NVSHARE_TESTS_GPU_CHECK_CUH

#include <cstdio>
#include <cstdlib>
#include <cuda.h>
#include <cuda_runtime.h>

#define CHECK_DRIVER(call)                                                                 \
    do {                                                                                   \
        CUresult r_ = (call);                                                              \
        if (r_ != CUDA_SUCCESS) {                                                          \
            std::printf("result=error call=%s code=%d\n", #call, (int)r_);                 \
            std::exit(1);                                                                  \
        }                                                                                  \
    } while (0)
#define CHECK_RUNTIME(call)                                                                \
    do {                                                                                   \
        cudaError_t r_ = (call);                                                           \
        if (r_ != cudaSuccess) {                                                           \
            std::printf("result=error call=%s error=%s\n", #call, cudaGetErrorString(r_)); \
            std::exit(1);                                                                  \
        }                                                                                  \
    } while (0)

#endif
