// Several CUDA contexts on one GPU, destroyed contexts and cudaDeviceReset, under the shim.
//   contexts two SPIN_MS IDLE_MS
//       context A runs a kernel that spins SPIN_MS; context B, used last, runs a tiny
//       kernel and waits for it; then the process idles IDLE_MS (the shim releases the
//       lock meanwhile, and that release must wait for A's kernel).
//   contexts lifecycle LAUNCHES
//       LAUNCHES kernels in the runtime's primary context, cudaDeviceReset, again; then in a
//       created context that is destroyed with memory still allocated in it; then in the
//       primary context retained and released by the application.
// Built with nvcc and -lcuda; prints "result=ok ..." or what went wrong.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include "check.cuh"

// CUDA 13's cuCtxCreate (cuCtxCreate_v4) takes creation parameters; older headers do not.
static CUresult create_context(CUcontext *context, CUdevice device) {
#if CUDA_VERSION >= 13000
    return cuCtxCreate(context, nullptr, 0, device);
#else
    return cuCtxCreate(context, 0, device);
#endif
}

__device__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void spin(unsigned long long ns) {
    unsigned long long start = global_ns();
    while (global_ns() - start < ns) {
    }
}

__global__ void add_one(int *counter) { *counter += 1; }

static void count_launches(int launches) {
    int *counter = nullptr;
    CHECK_RUNTIME(cudaMalloc(&counter, sizeof(int)));
    CHECK_RUNTIME(cudaMemset(counter, 0, sizeof(int)));
    for (int i = 0; i < launches; i++) add_one<<<1, 1>>>(counter);
    CHECK_RUNTIME(cudaGetLastError());
    int value = 0;
    CHECK_RUNTIME(cudaMemcpy(&value, counter, sizeof value, cudaMemcpyDeviceToHost));
    if (value != launches) {
        std::printf("result=wrong counter=%d launches=%d\n", value, launches);
        std::exit(1);
    }
    CHECK_RUNTIME(cudaFree(counter));
}

static int two(long spin_ms, long idle_ms) {
    CUdevice device;
    CUcontext a, b;
    CHECK_DRIVER(cuInit(0));
    CHECK_DRIVER(cuDeviceGet(&device, 0));
    CHECK_DRIVER(create_context(&a, device));
    spin<<<1, 1>>>((unsigned long long)spin_ms * 1000000ull);
    CHECK_RUNTIME(cudaGetLastError());
    CHECK_DRIVER(create_context(&b, device));
    int *small = nullptr;
    CHECK_RUNTIME(cudaMalloc(&small, sizeof(int)));
    add_one<<<1, 1>>>(small);
    CHECK_RUNTIME(cudaStreamSynchronize(0));    // B's work only
    usleep((useconds_t)idle_ms * 1000);
    CHECK_RUNTIME(cudaFree(small));
    CHECK_DRIVER(cuCtxDestroy(b));
    CHECK_DRIVER(cuCtxDestroy(a));
    std::printf("result=ok mode=two\n");
    return 0;
}

static int lifecycle(int launches) {
    CUdevice device;
    CUcontext created, primary;
    CHECK_DRIVER(cuInit(0));
    CHECK_DRIVER(cuDeviceGet(&device, 0));
    // The runtime's own primary context, reset: cudaDeviceReset resets it only while the
    // runtime holds it alone (with the application's retain left, it does nothing).
    count_launches(launches);
    CHECK_RUNTIME(cudaDeviceReset());
    count_launches(launches);                    // the runtime makes the primary context anew
    usleep(1500 * 1000);                         // an idle release comes and goes
    count_launches(launches);

    CHECK_DRIVER(create_context(&created, device));
    count_launches(launches);
    void *left_behind = nullptr;
    CHECK_RUNTIME(cudaMalloc(&left_behind, 1 << 20));   // freed with the context
    CHECK_DRIVER(cuCtxDestroy(created));

    // A release that leaves the runtime's reference: the context lives on.
    CHECK_DRIVER(cuDevicePrimaryCtxRetain(&primary, device));
    CHECK_DRIVER(cuCtxSetCurrent(primary));
    count_launches(launches);
    CHECK_DRIVER(cuDevicePrimaryCtxRelease(device));
    count_launches(launches);
    std::printf("result=ok mode=lifecycle launches=%d\n", launches);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 4 && std::strcmp(argv[1], "two") == 0) return two(std::atol(argv[2]), std::atol(argv[3]));
    if (argc >= 3 && std::strcmp(argv[1], "lifecycle") == 0) return lifecycle(std::atoi(argv[2]));
    std::fprintf(stderr, "usage: contexts two SPIN_MS IDLE_MS | contexts lifecycle LAUNCHES\n");
    return 2;
}
