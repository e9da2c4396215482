/*
 * Allocations the shim cannot make managed, passed through and counted as
 * unmanaged (they stay on the GPU while other processes run); those the process
 * makes itself (VMM, arrays) are refused past its group's memory cap:
 *  - VMM: cuMemCreate, counted until the driver frees it: once its handle's
 *    references are released (cuMemRelease; cuMemRetainAllocationHandle adds
 *    one) and its mappings unmapped (cuMemMap/cuMemUnmap), in any order.  PyTorch uses it for
 *    expandable_segments, XLA (JAX 0.11) for its default allocator; mapping
 *    it at an address of the shim's choosing would break the handles an
 *    application may export to other processes (NCCL does).  Warned about once.
 *  - IPC: cuIpcOpenMemHandle(_v2) / cuIpcCloseMemHandle; the size comes from
 *    cuMemGetAddressRange.  Warned about once.
 *  - CUDA arrays (textures, surfaces): cuArrayCreate_v2, cuArray3DCreate_v2,
 *    cuMipmappedArrayCreate, counted by handle at their texels' size (below)
 *    until cuArrayDestroy / cuMipmappedArrayDestroy or their context's end.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>

#include "allocation_map.h"
#include "contexts.h"
#include "devices.h"
#include "hooks.h"
#include "driver.h"
#include "log.h"
#include "memory_accounting.h"
#include "nvshare_protocol.h"

NVSHARE_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                    const CUmemAllocationProp *prop, unsigned long long flags)
{
    NVSHARE_REAL_OR_RETURN(cuMemCreate, real);
    int saved_errno = errno;
    nvshare_devices_discover();
    CUcontext context;
    int gpu = prop != NULL && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE
                  ? prop->location.id
                  : nvshare_current_gpu(&context);
    int counted = gpu >= 0 && gpu < NVSHARE_MAX_GPUS;
    if (counted && !nvshare_memory_reserve_under_cap(gpu, size, "cuMemCreate")) {
        errno = saved_errno;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult result = real(handle, size, prop, flags);
    if (result == CUDA_SUCCESS && handle != NULL) {
        NVSHARE_WARN_ONCE(
            "cuMemCreate (CUDA virtual memory: JAX's default allocator, PyTorch's "
            "expandable_segments) cannot be made managed: that memory stays on the "
            "GPU while others run (for JAX set XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async)");
        if (counted && *handle != 0)
            /* A physical handle outlives contexts: it is released, not destroyed with one. */
            nvshare_memory_remember(&nvshare_handle_map, *handle, size, gpu, -1, ALLOCATION_VMM);
    }
    if (counted)
        nvshare_memory_unreserve(gpu, size);
    errno = saved_errno;
    return result;
}

NVSHARE_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    NVSHARE_REAL_OR_RETURN(cuMemRelease, real);
    CUresult result = real(handle);
    if (result != CUDA_SUCCESS)
        return result;
    nvshare_memory_forget(&nvshare_handle_map, handle, ALLOCATION_VMM);
    return result;
}

/* Called with the memory mutex held. */
static void reference_handle(CUmemGenericAllocationHandle handle)
{
    struct allocation *physical = allocation_map_find(&nvshare_handle_map, handle);
    if (physical != NULL && physical->kind == ALLOCATION_VMM)
        physical->opens++;
}

/* The handle's entry counts its references and mappings (opens). */
NVSHARE_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                 CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    NVSHARE_REAL_OR_RETURN(cuMemMap, real);
    CUresult result = real(ptr, size, offset, handle, flags);
    if (result != CUDA_SUCCESS)
        return result;
    int saved_errno = errno;
    pthread_mutex_lock(&nvshare_memory_mutex);
    struct allocation *physical = allocation_map_find(&nvshare_handle_map, handle);
    if (physical != NULL && physical->kind == ALLOCATION_VMM) {
        struct allocation mapping = {.key = ptr,
                                     .bytes = size,
                                     .gpu = physical->gpu,
                                     .context_slot = -1,
                                     .kind = ALLOCATION_VMM,
                                     .opens = 1,
                                     .vmm_handle = handle};
        if (allocation_map_put(&nvshare_vmm_mapping_map, &mapping) == 0)
            reference_handle(handle);
    }
    pthread_mutex_unlock(&nvshare_memory_mutex);
    errno = saved_errno;
    return result;
}

/* Another reference to the handle of a mapped address (NCCL takes one to
 * register a buffer), given back by a cuMemRelease. */
NVSHARE_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle,
                                                    void *addr)
{
    NVSHARE_REAL_OR_RETURN(cuMemRetainAllocationHandle, real);
    CUresult result = real(handle, addr);
    if (result != CUDA_SUCCESS || handle == NULL)
        return result;
    pthread_mutex_lock(&nvshare_memory_mutex);
    reference_handle(*handle);
    pthread_mutex_unlock(&nvshare_memory_mutex);
    return result;
}

/* VMM mappings start and end on the allocation granularity, 2 MiB at the
 * least on NVIDIA GPUs: where an unmapped range holds a mapping the shim does
 * not know (an imported handle's), the walk goes on from the next granule. */
#define VMM_MIN_GRANULARITY ((CUdeviceptr)2 << 20)

/* One call may unmap several neighbouring mappings. */
NVSHARE_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    NVSHARE_REAL_OR_RETURN(cuMemUnmap, real);
    CUresult result = real(ptr, size);
    if (result != CUDA_SUCCESS)
        return result;
    int saved_errno = errno;
    for (CUdeviceptr at = ptr; at < ptr + size;) {
        struct allocation mapping;
        pthread_mutex_lock(&nvshare_memory_mutex);
        int none_left = nvshare_vmm_mapping_map.used == 0;
        int mapped = !none_left && allocation_map_take(&nvshare_vmm_mapping_map, at, &mapping);
        pthread_mutex_unlock(&nvshare_memory_mutex);
        if (none_left)
            break;
        if (!mapped || mapping.bytes == 0) {
            at += VMM_MIN_GRANULARITY;
            continue;
        }
        nvshare_memory_forget(&nvshare_handle_map, mapping.vmm_handle, ALLOCATION_VMM);
        at += mapping.bytes;
    }
    errno = saved_errno;
    return result;
}

static CUresult open_ipc(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags,
                         cuIpcOpenMemHandle_fn real)
{
    CUresult result = real(pdptr, handle, flags);
    if (result != CUDA_SUCCESS || pdptr == NULL)
        return result;
    int saved_errno = errno;
    NVSHARE_WARN_ONCE("cuIpcOpenMemHandle: memory shared by another process cannot be made "
                      "managed; it is counted but stays on the GPU");
    nvshare_devices_discover();
    CUcontext context;
    int gpu = nvshare_current_gpu(&context);
    CUdeviceptr base = 0;
    size_t bytes = 0;
    if (nvshare_driver.mem_get_address_range != NULL)
        nvshare_driver.mem_get_address_range(&base, &bytes, *pdptr);
    if (gpu >= 0)
        nvshare_memory_remember(&nvshare_pointer_map, *pdptr, bytes, gpu,
                                nvshare_current_context_slot(), ALLOCATION_IPC);
    errno = saved_errno;
    return result;
}

NVSHARE_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                           unsigned int Flags)
{
    NVSHARE_REAL_OR_RETURN(cuIpcOpenMemHandle, real);
    return open_ipc(pdptr, handle, Flags, real);
}

NVSHARE_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                              unsigned int Flags)
{
    NVSHARE_REAL_OR_RETURN(cuIpcOpenMemHandle_v2, real);
    return open_ipc(pdptr, handle, Flags, real);
}

NVSHARE_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    NVSHARE_REAL_OR_RETURN(cuIpcCloseMemHandle, real);
    CUresult result = real(dptr);
    if (result != CUDA_SUCCESS)
        return result;
    nvshare_memory_forget(&nvshare_pointer_map, dptr, ALLOCATION_IPC);
    return result;
}

/* ---- CUDA arrays ---------------------------------------------------------------------------
 * An array's size is counted from its descriptor as a lower bound of what the driver
 * takes (its padding, alignment and block rounding only add): the cap must never refuse
 * an array the driver would give under it for a size the shim made up.  So a format this
 * file does not know (one newer than cuda_abi.h's, or channels the driver refuses) counts
 * 0 bytes, as do sparse and deferred-mapping arrays, whose memory comes from cuMemCreate. */

/* Bits one texel of format with channels takes at the least; 0: not known. */
static uint64_t texel_bits(CUarray_format format, unsigned channels)
{
    uint64_t per_channel = 0;
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        per_channel = 8;
        break;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        per_channel = 16;
        break;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        per_channel = 32;
        break;
    case CU_AD_FORMAT_UNORM_INT_101010_2:
        return 32;
    case CU_AD_FORMAT_BC1_UNORM:
    case CU_AD_FORMAT_BC1_UNORM_SRGB:
    case CU_AD_FORMAT_BC4_UNORM:
    case CU_AD_FORMAT_BC4_SNORM:
        return 4; /* 8 bytes per 4x4 block */
    case CU_AD_FORMAT_BC2_UNORM:
    case CU_AD_FORMAT_BC2_UNORM_SRGB:
    case CU_AD_FORMAT_BC3_UNORM:
    case CU_AD_FORMAT_BC3_UNORM_SRGB:
    case CU_AD_FORMAT_BC5_UNORM:
    case CU_AD_FORMAT_BC5_SNORM:
    case CU_AD_FORMAT_BC6H_UF16:
    case CU_AD_FORMAT_BC6H_SF16:
    case CU_AD_FORMAT_BC7_UNORM:
    case CU_AD_FORMAT_BC7_UNORM_SRGB: /* 16 bytes per 4x4 block */
    case CU_AD_FORMAT_P010:           /* the video formats: at least their luma byte */
    case CU_AD_FORMAT_P016:
    case CU_AD_FORMAT_NV16:
    case CU_AD_FORMAT_P210:
    case CU_AD_FORMAT_P216:
    case CU_AD_FORMAT_YUY2:
    case CU_AD_FORMAT_Y210:
    case CU_AD_FORMAT_Y216:
    case CU_AD_FORMAT_AYUV:
    case CU_AD_FORMAT_Y410:
    case CU_AD_FORMAT_NV12:
    case CU_AD_FORMAT_Y416:
    case CU_AD_FORMAT_Y444_PLANAR8:
    case CU_AD_FORMAT_Y444_PLANAR10:
    case CU_AD_FORMAT_YUV444_8bit_SemiPlanar:
    case CU_AD_FORMAT_YUV444_16bit_SemiPlanar:
        return 8;
    default:
        if (format >= CU_AD_FORMAT_UNORM_INT8X1 && format <= CU_AD_FORMAT_SNORM_INT16X4) {
            /* UNORM8, UNORM16, SNORM8, SNORM16, each x1, x2, x4 */
            int index = format - CU_AD_FORMAT_UNORM_INT8X1;
            return (uint64_t)(index % 6 < 3 ? 8 : 16) << (index % 3);
        }
        return 0;
    }
    return channels == 1 || channels == 2 || channels == 4 ? per_channel * channels : 0;
}

static uint64_t at_least_one(size_t extent)
{
    return extent > 0 ? extent : 1;
}

/* The bytes of levels mip levels (1: a plain array): each level halves the extents, to
 * 1 at the least, but a layered or cubemap array's Depth, its layer count, stays.
 * 0 when not counted, or past 64 bits (the driver refuses those). */
static uint64_t array_bytes(const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned levels)
{
    uint64_t bits = texel_bits(desc->Format, desc->NumChannels);
    if (bits == 0 || (desc->Flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)))
        return 0;
    int layered = (desc->Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
    uint64_t width = at_least_one(desc->Width), height = at_least_one(desc->Height);
    uint64_t depth = at_least_one(desc->Depth), texels = 0;
    for (unsigned level = 0; level < levels; level++) {
        uint64_t level_texels;
        if (__builtin_mul_overflow(width, height, &level_texels) ||
            __builtin_mul_overflow(level_texels, depth, &level_texels) ||
            __builtin_add_overflow(texels, level_texels, &texels))
            return 0;
        if (width == 1 && height == 1 && (layered || depth == 1))
            break; /* the smallest level: the driver refuses more */
        width = width > 1 ? width / 2 : 1;
        height = height > 1 ? height / 2 : 1;
        depth = layered || depth == 1 ? depth : depth / 2;
    }
    uint64_t total_bits;
    return __builtin_mul_overflow(texels, bits, &total_bits) ? 0 : total_bits / 8;
}

/* Reserves an array's bytes under the cap of the calling thread's GPU: CUDA_SUCCESS
 * with that GPU in *gpu (-1: not counted: no context, or 0 bytes), or
 * CUDA_ERROR_OUT_OF_MEMORY past the cap (warned once). */
static CUresult reserve_array(uint64_t bytes, const char *what, int *gpu)
{
    *gpu = -1;
    if (bytes == 0)
        return CUDA_SUCCESS;
    nvshare_devices_discover();
    CUcontext context;
    int current = nvshare_current_gpu(&context);
    if (current < 0)
        return CUDA_SUCCESS; /* the driver answers without a context */
    if (!nvshare_memory_reserve_under_cap(current, bytes, what))
        return CUDA_ERROR_OUT_OF_MEMORY;
    *gpu = current;
    return CUDA_SUCCESS;
}

/* After the driver's answer: the array it made (handle; 0: none) is remembered with its
 * context (it dies with it), and the reservation given back. */
static void settle_array(uint64_t handle, uint64_t bytes, int gpu)
{
    if (gpu < 0)
        return;
    if (handle != 0)
        nvshare_memory_remember(&nvshare_array_map, handle, bytes, gpu,
                                nvshare_current_context_slot(), ALLOCATION_ARRAY);
    nvshare_memory_unreserve(gpu, bytes);
}

NVSHARE_EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle,
                                         const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)
{
    NVSHARE_REAL_OR_RETURN(cuArrayCreate_v2, real);
    int saved_errno = errno;
    uint64_t bytes = 0;
    if (pHandle != NULL && pAllocateArray != NULL) {
        CUDA_ARRAY3D_DESCRIPTOR flat = {.Width = pAllocateArray->Width,
                                        .Height = pAllocateArray->Height,
                                        .Format = pAllocateArray->Format,
                                        .NumChannels = pAllocateArray->NumChannels};
        bytes = array_bytes(&flat, 1);
    }
    int gpu;
    CUresult result = reserve_array(bytes, "cuArrayCreate", &gpu);
    if (result == CUDA_SUCCESS) {
        result = real(pHandle, pAllocateArray);
        settle_array(result == CUDA_SUCCESS && pHandle != NULL ? (uintptr_t)*pHandle : 0, bytes,
                     gpu);
    }
    errno = saved_errno;
    return result;
}

NVSHARE_EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle,
                                           const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
    NVSHARE_REAL_OR_RETURN(cuArray3DCreate_v2, real);
    int saved_errno = errno;
    uint64_t bytes = pHandle != NULL && pAllocateArray != NULL ? array_bytes(pAllocateArray, 1) : 0;
    int gpu;
    CUresult result = reserve_array(bytes, "cuArray3DCreate", &gpu);
    if (result == CUDA_SUCCESS) {
        result = real(pHandle, pAllocateArray);
        settle_array(result == CUDA_SUCCESS && pHandle != NULL ? (uintptr_t)*pHandle : 0, bytes,
                     gpu);
    }
    errno = saved_errno;
    return result;
}

NVSHARE_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                               const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                               unsigned int numMipmapLevels)
{
    NVSHARE_REAL_OR_RETURN(cuMipmappedArrayCreate, real);
    int saved_errno = errno;
    uint64_t bytes = pHandle != NULL && pMipmappedArrayDesc != NULL
                         ? array_bytes(pMipmappedArrayDesc, numMipmapLevels)
                         : 0;
    int gpu;
    CUresult result = reserve_array(bytes, "cuMipmappedArrayCreate", &gpu);
    if (result == CUDA_SUCCESS) {
        result = real(pHandle, pMipmappedArrayDesc, numMipmapLevels);
        settle_array(result == CUDA_SUCCESS && pHandle != NULL ? (uintptr_t)*pHandle : 0, bytes,
                     gpu);
    }
    errno = saved_errno;
    return result;
}

/* Forgotten before the driver destroys it: from then on it may give the handle to
 * another thread's new array.  Put back if the driver refuses. */
static void put_back_array(const struct allocation *taken)
{
    nvshare_memory_remember(&nvshare_array_map, taken->key, taken->bytes, taken->gpu,
                            taken->context_slot, ALLOCATION_ARRAY);
}

NVSHARE_EXPORT CUresult cuArrayDestroy(CUarray hArray)
{
    NVSHARE_REAL_OR_RETURN(cuArrayDestroy, real);
    int saved_errno = errno;
    struct allocation taken;
    int known =
        nvshare_memory_take(&nvshare_array_map, (uintptr_t)hArray, ALLOCATION_ARRAY, &taken);
    CUresult result = real(hArray);
    if (known && result != CUDA_SUCCESS)
        put_back_array(&taken);
    errno = saved_errno;
    return result;
}

NVSHARE_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    NVSHARE_REAL_OR_RETURN(cuMipmappedArrayDestroy, real);
    int saved_errno = errno;
    struct allocation taken;
    int known = nvshare_memory_take(&nvshare_array_map, (uintptr_t)hMipmappedArray,
                                    ALLOCATION_ARRAY, &taken);
    CUresult result = real(hMipmappedArray);
    if (known && result != CUDA_SUCCESS)
        put_back_array(&taken);
    errno = saved_errno;
    return result;
}
