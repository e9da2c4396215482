/*
 * Stand-in driver: CUDA arrays (cuArrayCreate_v2, cuArray3DCreate_v2,
 * cuMipmappedArrayCreate and their destroys).  An array holds no memory here (no
 * copy reaches one); its size, texels x channels x element bytes summed over its
 * mip levels, counts against STANDIN_TOTAL_MEM like device memory, and past it the
 * creation fails with CUDA_ERROR_OUT_OF_MEMORY.  A context's arrays go with it (its
 * destroy, a primary context's reset), as a driver's do.
 */
#define _GNU_SOURCE
#include <stdlib.h>

#include "standin.h"

#define ARRAY_MAGIC     0x41525259u
#define MIPMAPPED_MAGIC 0x4d495050u

struct fake_array {
    uint32_t magic;
    size_t bytes;
    CUdevice device;
    CUcontext ctx;
    struct fake_array *next; /* the live arrays, a list under standin_lock */
};

static struct fake_array *live_arrays;

static size_t element_bytes(CUarray_format format)
{
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        return 4;
    }
    return 0; /* the fixture makes no arrays of the other formats */
}

static size_t halved(size_t extent)
{
    return extent > 1 ? extent / 2 : 1;
}

/* The bytes of levels mip levels; 0 for a descriptor the fixture refuses.  A layered
 * (or cubemap) array's depth is its layer count: it does not halve. */
static size_t array_size(const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned levels)
{
    size_t element = element_bytes(desc->Format);
    unsigned channels = desc->NumChannels;
    if (element == 0 || (channels != 1 && channels != 2 && channels != 4) || desc->Width == 0 ||
        levels == 0)
        return 0;
    int layered = (desc->Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
    size_t width = desc->Width, height = desc->Height ? desc->Height : 1;
    size_t depth = desc->Depth ? desc->Depth : 1, bytes = 0;
    for (unsigned level = 0; level < levels; level++) {
        bytes += width * height * depth * channels * element;
        width = halved(width);
        height = halved(height);
        depth = layered ? depth : halved(depth);
    }
    return bytes;
}

/* Makes an array of bytes (0: a bad handle pointer or descriptor) on the current
 * device: CUDA_ERROR_OUT_OF_MEMORY past its total. */
static CUresult create(const char *function, void **handle, size_t bytes, uint32_t magic)
{
    CUresult result = standin_require_ctx();
    if (result == CUDA_SUCCESS)
        result = standin_capture_check_unsafe(function);
    if (result == CUDA_SUCCESS && bytes == 0)
        result = CUDA_ERROR_INVALID_VALUE;
    if (result != CUDA_SUCCESS)
        return result;
    struct fake_array *array = calloc(1, sizeof *array);
    CUdevice device = standin_current_ctx()->device;
    if (array == NULL || standin_charge_device(device, bytes) != 0) {
        free(array);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *array = (struct fake_array){magic, bytes, device, standin_current_ctx(), NULL};
    pthread_mutex_lock(&standin_lock);
    array->next = live_arrays;
    live_arrays = array;
    pthread_mutex_unlock(&standin_lock);
    *handle = array;
    return CUDA_SUCCESS;
}

/* Takes out of the live list the array `wanted` (with magic), or every array of
 * context ctx (wanted NULL); returns them as a list of their own. */
static struct fake_array *take(const struct fake_array *wanted, uint32_t magic, CUcontext ctx)
{
    struct fake_array *taken = NULL;
    pthread_mutex_lock(&standin_lock);
    for (struct fake_array **link = &live_arrays; *link != NULL;) {
        struct fake_array *array = *link;
        int match = wanted != NULL ? array == wanted && array->magic == magic : array->ctx == ctx;
        if (!match) {
            link = &array->next;
            continue;
        }
        *link = array->next;
        array->next = taken;
        taken = array;
    }
    pthread_mutex_unlock(&standin_lock);
    return taken;
}

/* Gives the device their bytes back and frees them (outside standin_lock: the
 * device's table takes it itself). */
static void release_all(struct fake_array *arrays)
{
    while (arrays != NULL) {
        struct fake_array *next = arrays->next;
        standin_refund_device(arrays->device, arrays->bytes);
        free(arrays);
        arrays = next;
    }
}

static CUresult destroy(struct fake_array *array, uint32_t magic)
{
    if (!standin_initialised())
        return CUDA_ERROR_NOT_INITIALIZED;
    struct fake_array *taken = array != NULL ? take(array, magic, NULL) : NULL;
    if (taken == NULL)
        return CUDA_ERROR_INVALID_HANDLE; /* never made, or destroyed already */
    release_all(taken);
    return CUDA_SUCCESS;
}

void standin_retire_context_arrays(CUcontext ctx)
{
    release_all(take(NULL, 0, ctx));
}

STANDIN_EXPORT CUresult cuArrayCreate_v2(CUarray *handle, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    size_t bytes = 0;
    if (handle != NULL && desc != NULL) {
        CUDA_ARRAY3D_DESCRIPTOR flat = {desc->Width,  desc->Height,      0,
                                        desc->Format, desc->NumChannels, 0};
        bytes = array_size(&flat, 1);
    }
    void *array = NULL;
    CUresult result = create("cuArrayCreate_v2", &array, bytes, ARRAY_MAGIC);
    if (result == CUDA_SUCCESS)
        *handle = array;
    standin_log("cuArrayCreate_v2", "bytes=%zu array=%p result=%d", bytes, array, result);
    return result;
}

STANDIN_EXPORT CUresult cuArray3DCreate_v2(CUarray *handle, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    size_t bytes = handle != NULL && desc != NULL ? array_size(desc, 1) : 0;
    void *array = NULL;
    CUresult result = create("cuArray3DCreate_v2", &array, bytes, ARRAY_MAGIC);
    if (result == CUDA_SUCCESS)
        *handle = array;
    standin_log("cuArray3DCreate_v2", "bytes=%zu flags=%u array=%p result=%d", bytes,
                desc != NULL ? desc->Flags : 0, array, result);
    return result;
}

STANDIN_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *handle,
                                               const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                               unsigned int levels)
{
    size_t bytes = handle != NULL && desc != NULL ? array_size(desc, levels) : 0;
    void *array = NULL;
    CUresult result = create("cuMipmappedArrayCreate", &array, bytes, MIPMAPPED_MAGIC);
    if (result == CUDA_SUCCESS)
        *handle = array;
    standin_log("cuMipmappedArrayCreate", "levels=%u bytes=%zu array=%p result=%d", levels, bytes,
                array, result);
    return result;
}

STANDIN_EXPORT CUresult cuArrayDestroy(CUarray array)
{
    CUresult result = destroy((struct fake_array *)array, ARRAY_MAGIC);
    standin_log("cuArrayDestroy", "array=%p result=%d", (void *)array, result);
    return result;
}

STANDIN_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray array)
{
    CUresult result = destroy((struct fake_array *)array, MIPMAPPED_MAGIC);
    standin_log("cuMipmappedArrayDestroy", "array=%p result=%d", (void *)array, result);
    return result;
}
