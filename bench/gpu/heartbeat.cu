// A process that keeps coming back to the GPU: a small kernel and a
// synchronise every PERIOD_MS, for SECONDS.  The liveness bench runs several
// under the shim across agent restarts and stops.
//   heartbeat SECONDS PERIOD_MS
// Prints "result=ok beats=N" once done, or what failed.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <cuda_runtime.h>

__global__ void beat(int *counter) { atomicAdd(counter, 1); }

int main(int argc, char **argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: heartbeat SECONDS PERIOD_MS\n");
        return 2;
    }
    const double seconds = std::atof(argv[1]);
    const int period_ms = std::atoi(argv[2]);
    int *counter;
    if (cudaMalloc(&counter, sizeof *counter) != cudaSuccess) {
        std::printf("result=fail cudaMalloc\n");
        return 1;
    }
    cudaMemset(counter, 0, sizeof *counter);
    auto start = std::chrono::steady_clock::now();
    int beats = 0;
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
           seconds) {
        beat<<<1, 1>>>(counter);
        if (cudaDeviceSynchronize() != cudaSuccess) {
            std::printf("result=fail beat %d\n", beats);
            return 1;
        }
        beats++;
        std::this_thread::sleep_for(std::chrono::milliseconds(period_ms));
    }
    int seen = 0;
    cudaMemcpy(&seen, counter, sizeof seen, cudaMemcpyDeviceToHost);
    std::printf("result=%s beats=%d\n", seen == beats ? "ok" : "fail", beats);
    return seen == beats ? 0 : 1;
}
