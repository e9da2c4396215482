/* An older driver (test fixture): a libcuda.so.1 with only cuInit and
 * cuDriverGetVersion, standing for a driver from before the functions a
 * program was built against.  Built into build/old/. */
#include "cuda_fixture.h"

#define OLD_EXPORT __attribute__((visibility("default")))

OLD_EXPORT CUresult cuInit(unsigned int flags)
{
    return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

OLD_EXPORT CUresult cuDriverGetVersion(int *version)
{
    if (version == 0)
        return CUDA_ERROR_INVALID_VALUE;
    *version = 10000;
    return CUDA_SUCCESS;
}
