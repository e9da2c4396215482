// Built with `nvcc -cudart=static`: static cudart reaches the driver only
// through cuGetProcAddress, the path the shim must intercept.
#include <cstdio>
#include <cuda_runtime.h>

__global__ void add(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

int main() {
    const int n = 1 << 24;
    float *a, *b, *c;
    if (cudaMalloc(&a, n * sizeof(float)) || cudaMalloc(&b, n * sizeof(float)) ||
        cudaMalloc(&c, n * sizeof(float))) {
        std::printf("cudaMalloc failed\n");
        return 1;
    }
    cudaPointerAttributes attributes;
    cudaPointerGetAttributes(&attributes, c);
    float *host = new float[n];
    for (int i = 0; i < n; i++) host[i] = float(i);
    cudaMemcpy(a, host, n * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(b, host, n * sizeof(float), cudaMemcpyHostToDevice);
    for (int round = 0; round < 10; round++) add<<<(n + 255) / 256, 256>>>(a, b, c, n);
    cudaMemcpy(host, c, n * sizeof(float), cudaMemcpyDeviceToHost);
    int wrong = 0;
    for (int i = 0; i < n; i++) wrong += host[i] != 2.0f * float(i);
    std::printf("vector_add wrong=%d managed=%d error=%s\n", wrong,
                attributes.type == cudaMemoryTypeManaged, cudaGetErrorString(cudaGetLastError()));
    return wrong != 0;
}
