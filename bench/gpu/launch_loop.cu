// A launch-bound loop: many empty kernels, timed on the host.  Built with
// nvcc's default static cudart, so it reaches the driver through
// cuGetProcAddress, as most CUDA programs do.
//   launch_loop [LAUNCHES_PER_ROUND] [ROUNDS]
// Prints the fastest round: noise from the rest of the machine only ever adds
// time, so the minimum is the steadiest estimate of the launch cost itself.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void empty_kernel() {}

int main(int argc, char **argv) {
    const int launches = argc > 1 ? std::atoi(argv[1]) : 100000;
    const int rounds = argc > 2 ? std::atoi(argv[2]) : 10;
    empty_kernel<<<1, 1>>>();
    cudaDeviceSynchronize();
    double best = 1e30, total = 0;
    for (int round = 0; round < rounds; round++) {
        auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < launches; i++) empty_kernel<<<1, 1>>>();
        cudaDeviceSynchronize();
        double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        best = std::min(best, seconds);
        total += seconds;
    }
    std::printf("{\"launches\": %d, \"rounds\": %d, \"us_per_launch\": %.4f, \"us_per_launch_mean\": %.4f, "
                "\"error\": \"%s\"}\n", launches, rounds, best * 1e6 / launches,
                total * 1e6 / launches / rounds, cudaGetErrorString(cudaGetLastError()));
    return 0;
}
