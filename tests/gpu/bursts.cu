// Bursts of GPU work over a large working set that is pushed back to host memory after
// each burst, so that every grant's prefetch (the shim's) moves all of it again.
//   bursts GIB BURSTS SLEEP_MS
// Prints "result=ok bursts=N" or what failed.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "check.cuh"

__global__ void touch(char *memory, size_t stride, int count) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) memory[i * stride] += 1;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        std::fprintf(stderr, "usage: bursts GIB BURSTS SLEEP_MS\n");
        return 2;
    }
    size_t bytes = std::strtoull(argv[1], nullptr, 10) << 30;
    int bursts = std::atoi(argv[2]), sleep_ms = std::atoi(argv[3]);
    char *memory;
    CHECK_RUNTIME(cudaMalloc(&memory, bytes));
    cudaMemLocation host = {};
    host.type = cudaMemLocationTypeHost;
    for (int burst = 0; burst < bursts; burst++) {
        touch<<<64, 256>>>(memory, bytes / (64 * 256), 64 * 256);
        CHECK_RUNTIME(cudaGetLastError());
        // Back to host memory, as if another process had needed the GPU's.
        CHECK_RUNTIME(cudaMemPrefetchAsync(memory, bytes, host, 0, 0));
        CHECK_RUNTIME(cudaDeviceSynchronize());
        std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    }
    std::printf("result=ok bursts=%d\n", bursts);
    return 0;
}
