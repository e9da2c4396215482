// The kernel old_glibc_client.c loads from a cubin (nvcc -cubin on the GPU machine).
extern "C" __global__ void add_one(unsigned *data, unsigned count)
{
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count)
        data[i] += 1;
}
