// A launch-bound loop: many empty kernels, timed on the host.  Built with
// nvcc's default static cudart, so it reaches the driver through
// cuGetProcAddress, as most CUDA programs do.
//   launch_loop [LAUNCHES_PER_ROUND] [ROUNDS]
// Prints the fastest round: noise from the rest of the machine only ever adds
// time, so the minimum is the steadiest estimate of the launch cost itself.
// Every round is printed too, with the time it took to enqueue its launches
// (before the synchronise): when that is all of the round, the host is the
// bottleneck, not the GPU.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <cuda_runtime.h>

__global__ void empty_kernel() {}

int main(int argc, char **argv) {
    const int launches = argc > 1 ? std::atoi(argv[1]) : 100000;
    const int rounds = argc > 2 ? std::atoi(argv[2]) : 10;
    empty_kernel<<<1, 1>>>();
    cudaDeviceSynchronize();
    double best = 1e30, total = 0;
    std::string rounds_us, enqueue_us;
    for (int round = 0; round < rounds; round++) {
        auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < launches; i++) empty_kernel<<<1, 1>>>();
        auto enqueued = std::chrono::steady_clock::now();
        cudaDeviceSynchronize();
        double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        double enqueue_seconds = std::chrono::duration<double>(enqueued - start).count();
        best = std::min(best, seconds);
        total += seconds;
        const char *comma = round ? ", " : "";
        rounds_us += comma + std::to_string(seconds * 1e6 / launches);
        enqueue_us += comma + std::to_string(enqueue_seconds * 1e6 / launches);
    }
    std::printf("{\"launches\": %d, \"rounds\": %d, \"us_per_launch\": %.4f, \"us_per_launch_mean\": %.4f, "
                "\"rounds_us\": [%s], \"enqueue_us\": [%s], \"error\": \"%s\"}\n", launches, rounds,
                best * 1e6 / launches, total * 1e6 / launches / rounds, rounds_us.c_str(), enqueue_us.c_str(),
                cudaGetErrorString(cudaGetLastError()));
    return 0;
}
