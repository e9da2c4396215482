/*
 * The few CUDA driver API declarations the shim needs, written from the
 * driver API reference (https://docs.nvidia.com/cuda/cuda-driver-api/) so that
 * libnvshare.so builds with gcc alone, without the CUDA toolkit.
 *
 * Only what crosses the ABI matters here: scalar widths, the layout of the
 * structs the shim reads (CUlaunchConfig, CUmemAllocationProp, the array
 * descriptors) or passes by
 * value (CUmemLocation, CUipcMemHandle), and the function signatures.  Structs
 * that are only forwarded by pointer stay incomplete on purpose.
 */
#ifndef NVSHARE_CUDA_ABI_H
#define NVSHARE_CUDA_ABI_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_UNKNOWN = 999
};

typedef uint32_t cuuint32_t;
typedef uint64_t cuuint64_t;
typedef unsigned long long CUdeviceptr; /* CUdeviceptr_v2: 64 bits on every 64-bit host */
typedef int CUdevice;
typedef unsigned long long CUmemGenericAllocationHandle;

typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUfunc_st *CUfunction;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;

/* Only ever forwarded by pointer. */
typedef struct CUDA_MEMCPY2D_st CUDA_MEMCPY2D;
typedef struct CUDA_MEMCPY3D_st CUDA_MEMCPY3D;
typedef struct CUDA_MEMCPY3D_PEER_st CUDA_MEMCPY3D_PEER;
typedef struct CUDA_LAUNCH_PARAMS_st CUDA_LAUNCH_PARAMS;
typedef struct CUDA_MEMCPY3D_BATCH_OP_st CUDA_MEMCPY3D_BATCH_OP;
typedef struct CUmemcpyAttributes_st CUmemcpyAttributes;
typedef struct CUmemDecompressParams_st CUmemDecompressParams;
typedef union CUstreamBatchMemOpParams_union CUstreamBatchMemOpParams;
typedef struct CUlaunchAttribute_st CUlaunchAttribute;
typedef void (*CUhostFn)(void *userData);

/* Special stream handles (cuda.h: CU_STREAM_LEGACY, CU_STREAM_PER_THREAD). */
#define NVSHARE_CU_STREAM_LEGACY     ((CUstream)0x1)
#define NVSHARE_CU_STREAM_PER_THREAD ((CUstream)0x2)

typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;

/* Passed by value to cuIpcOpenMemHandle: the whole 64 bytes go on the stack. */
typedef struct CUipcMemHandle_st {
    char reserved[64];
} CUipcMemHandle;

enum { CU_MEM_LOCATION_TYPE_INVALID = 0, CU_MEM_LOCATION_TYPE_DEVICE = 1 };
/* Passed by value to cuMemPrefetchAsync_v2 (8 bytes: one register). */
typedef struct CUmemLocation_st {
    int type; /* CUmemLocationType */
    int id;
} CUmemLocation;

/* cuMemCreate's description of a VMM allocation; the shim reads location. */
typedef struct CUmemAllocationProp_st {
    int type;                 /* CUmemAllocationType */
    int requestedHandleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

/* cuLaunchKernelEx's configuration; the shim reads hStream. */
typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

/* CUarray_format (an enum: int), with what one texel takes.  A 0 in a
 * descriptor's Height or Depth is one texel. */
typedef int CUarray_format;
enum {
    /* One element per channel (NumChannels 1, 2 or 4): 1, 2 or 4 bytes each. */
    CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
    CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
    CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
    CU_AD_FORMAT_SIGNED_INT8 = 0x08,
    CU_AD_FORMAT_SIGNED_INT16 = 0x09,
    CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
    CU_AD_FORMAT_HALF = 0x10,
    CU_AD_FORMAT_FLOAT = 0x20,
    CU_AD_FORMAT_UNORM_INT_101010_2 = 0x50, /* 4 bytes */
    /* Block compressed: 4x4 texels in 8 bytes (BC1, BC4) or 16 (the others). */
    CU_AD_FORMAT_BC1_UNORM = 0x91,
    CU_AD_FORMAT_BC1_UNORM_SRGB = 0x92,
    CU_AD_FORMAT_BC2_UNORM = 0x93,
    CU_AD_FORMAT_BC2_UNORM_SRGB = 0x94,
    CU_AD_FORMAT_BC3_UNORM = 0x95,
    CU_AD_FORMAT_BC3_UNORM_SRGB = 0x96,
    CU_AD_FORMAT_BC4_UNORM = 0x97,
    CU_AD_FORMAT_BC4_SNORM = 0x98,
    CU_AD_FORMAT_BC5_UNORM = 0x99,
    CU_AD_FORMAT_BC5_SNORM = 0x9a,
    CU_AD_FORMAT_BC6H_UF16 = 0x9b,
    CU_AD_FORMAT_BC6H_SF16 = 0x9c,
    CU_AD_FORMAT_BC7_UNORM = 0x9d,
    CU_AD_FORMAT_BC7_UNORM_SRGB = 0x9e,
    /* Video (YUV) formats: at least a byte of luma per texel, the chroma planes' beside. */
    CU_AD_FORMAT_P010 = 0x9f,
    CU_AD_FORMAT_P016 = 0xa1,
    CU_AD_FORMAT_NV16 = 0xa2,
    CU_AD_FORMAT_P210 = 0xa3,
    CU_AD_FORMAT_P216 = 0xa4,
    CU_AD_FORMAT_YUY2 = 0xa5,
    CU_AD_FORMAT_Y210 = 0xa6,
    CU_AD_FORMAT_Y216 = 0xa7,
    CU_AD_FORMAT_AYUV = 0xa8,
    CU_AD_FORMAT_Y410 = 0xa9,
    CU_AD_FORMAT_NV12 = 0xb0,
    CU_AD_FORMAT_Y416 = 0xb1,
    CU_AD_FORMAT_Y444_PLANAR8 = 0xb2,
    CU_AD_FORMAT_Y444_PLANAR10 = 0xb3,
    CU_AD_FORMAT_YUV444_8bit_SemiPlanar = 0xb4,
    CU_AD_FORMAT_YUV444_16bit_SemiPlanar = 0xb5,
    /* Normalized, the channels in the name: 1, 2 or 4 of 1 or 2 bytes. */
    CU_AD_FORMAT_UNORM_INT8X1 = 0xc0,
    CU_AD_FORMAT_UNORM_INT8X2 = 0xc1,
    CU_AD_FORMAT_UNORM_INT8X4 = 0xc2,
    CU_AD_FORMAT_UNORM_INT16X1 = 0xc3,
    CU_AD_FORMAT_UNORM_INT16X2 = 0xc4,
    CU_AD_FORMAT_UNORM_INT16X4 = 0xc5,
    CU_AD_FORMAT_SNORM_INT8X1 = 0xc6,
    CU_AD_FORMAT_SNORM_INT8X2 = 0xc7,
    CU_AD_FORMAT_SNORM_INT8X4 = 0xc8,
    CU_AD_FORMAT_SNORM_INT16X1 = 0xc9,
    CU_AD_FORMAT_SNORM_INT16X2 = 0xca,
    CU_AD_FORMAT_SNORM_INT16X4 = 0xcb
};

/* cuArrayCreate_v2's description of a 1D or 2D array (Height 0: 1D). */
typedef struct CUDA_ARRAY_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

/* cuArray3DCreate_v2's and cuMipmappedArrayCreate's: a layered or cubemap
 * array's Depth counts its layers. */
typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    size_t Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

enum {
    CUDA_ARRAY3D_LAYERED = 0x01,
    CUDA_ARRAY3D_CUBEMAP = 0x04,
    CUDA_ARRAY3D_SPARSE = 0x40,          /* memory mapped later (cuMemMapArrayAsync) */
    CUDA_ARRAY3D_DEFERRED_MAPPING = 0x80 /* likewise */
};

enum { CU_MEM_ATTACH_GLOBAL = 0x1 };
enum { CU_STREAM_NON_BLOCKING = 0x1 };
enum { CU_EVENT_DEFAULT = 0x0, CU_EVENT_DISABLE_TIMING = 0x2 };

typedef int
    CUdriverProcAddressQueryResult; /* 0 success, 1 symbol not found, 2 version not sufficient */

/* Signatures of the driver functions the shim itself calls (beyond the gated
 * ones, whose signatures live with their hooks in hooks.c). */
typedef CUresult (*cuInit_fn)(unsigned int flags);
typedef CUresult (*cuGetProcAddress_fn)(const char *symbol, void **pfn, int cudaVersion,
                                        cuuint64_t flags);
typedef CUresult (*cuGetProcAddress_v2_fn)(const char *symbol, void **pfn, int cudaVersion,
                                           cuuint64_t flags,
                                           CUdriverProcAddressQueryResult *symbolStatus);
typedef CUresult (*cuDeviceGetCount_fn)(int *count);
typedef CUresult (*cuDeviceGetUuid_fn)(CUuuid *uuid, CUdevice dev);
typedef CUresult (*cuDeviceTotalMem_v2_fn)(size_t *bytes, CUdevice dev);
typedef CUresult (*cuCtxGetCurrent_fn)(CUcontext *pctx);
typedef CUresult (*cuCtxGetDevice_fn)(CUdevice *device);
typedef CUresult (*cuCtxSynchronize_fn)(void);
typedef CUresult (*cuCtxPushCurrent_v2_fn)(CUcontext ctx);
typedef CUresult (*cuCtxPopCurrent_v2_fn)(CUcontext *pctx);
typedef CUresult (*cuCtxDestroy_v2_fn)(CUcontext ctx);
typedef CUresult (*cuDevicePrimaryCtxRetain_fn)(CUcontext *pctx, CUdevice dev);
/* Release and reset, either version, have this signature too. */
typedef CUresult (*cuDevicePrimaryCtxReset_v2_fn)(CUdevice dev);
typedef CUresult (*cuDevicePrimaryCtxGetState_fn)(CUdevice dev, unsigned int *flags, int *active);
typedef CUresult (*cuStreamCreate_fn)(CUstream *phStream, unsigned int flags);
typedef CUresult (*cuStreamSynchronize_fn)(CUstream hStream);
typedef CUresult (*cuStreamIsCapturing_fn)(CUstream hStream, int *captureStatus);
typedef CUresult (*cuStreamGetCtx_fn)(CUstream hStream, CUcontext *pctx);
typedef CUresult (*cuEventCreate_fn)(CUevent *phEvent, unsigned int flags);
typedef CUresult (*cuEventRecord_fn)(CUevent hEvent, CUstream hStream);
typedef CUresult (*cuEventQuery_fn)(CUevent hEvent);
typedef CUresult (*cuEventSynchronize_fn)(CUevent hEvent);
typedef CUresult (*cuEventElapsedTime_fn)(float *pMilliseconds, CUevent hStart, CUevent hEnd);
typedef CUresult (*cuMemGetAddressRange_v2_fn)(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr);
typedef CUresult (*cuMemPrefetchAsync_v1_fn)(CUdeviceptr devPtr, size_t count, CUdevice dstDevice,
                                             CUstream hStream);
typedef CUresult (*cuMemPrefetchAsync_v2_fn)(CUdeviceptr devPtr, size_t count,
                                             CUmemLocation location, unsigned int flags,
                                             CUstream hStream);

/* Allocation family (hooked in memory.c). */
typedef CUresult (*cuMemAlloc_v2_fn)(CUdeviceptr *dptr, size_t bytesize);
typedef CUresult (*cuMemAllocPitch_v2_fn)(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                          size_t Height, unsigned int ElementSizeBytes);
typedef CUresult (*cuMemAllocManaged_fn)(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
typedef CUresult (*cuMemAllocAsync_fn)(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
typedef CUresult (*cuStreamDestroy_v2_fn)(CUstream hStream);
typedef CUresult (*cuMemPoolTrimTo_fn)(CUmemoryPool pool, size_t minBytesToKeep);
typedef CUresult (*cuMemAllocFromPoolAsync_fn)(CUdeviceptr *dptr, size_t bytesize,
                                               CUmemoryPool pool, CUstream hStream);
typedef CUresult (*cuMemFree_v2_fn)(CUdeviceptr dptr);
typedef CUresult (*cuMemFreeAsync_fn)(CUdeviceptr dptr, CUstream hStream);
typedef CUresult (*cuMemGetInfo_v2_fn)(size_t *free, size_t *total);
typedef CUresult (*cuMemCreate_fn)(CUmemGenericAllocationHandle *handle, size_t size,
                                   const CUmemAllocationProp *prop, unsigned long long flags);
typedef CUresult (*cuMemRelease_fn)(CUmemGenericAllocationHandle handle);
typedef CUresult (*cuMemMap_fn)(CUdeviceptr ptr, size_t size, size_t offset,
                                CUmemGenericAllocationHandle handle, unsigned long long flags);
typedef CUresult (*cuMemUnmap_fn)(CUdeviceptr ptr, size_t size);
typedef CUresult (*cuMemRetainAllocationHandle_fn)(CUmemGenericAllocationHandle *handle,
                                                   void *addr);
typedef CUresult (*cuIpcOpenMemHandle_fn)(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                          unsigned int Flags);
typedef CUresult (*cuIpcCloseMemHandle_fn)(CUdeviceptr dptr);
typedef CUresult (*cuArrayCreate_v2_fn)(CUarray *pHandle,
                                        const CUDA_ARRAY_DESCRIPTOR *pAllocateArray);
typedef CUresult (*cuArray3DCreate_v2_fn)(CUarray *pHandle,
                                          const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray);
typedef CUresult (*cuMipmappedArrayCreate_fn)(CUmipmappedArray *pHandle,
                                              const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                              unsigned int numMipmapLevels);
typedef CUresult (*cuArrayDestroy_fn)(CUarray hArray);
typedef CUresult (*cuMipmappedArrayDestroy_fn)(CUmipmappedArray hMipmappedArray);

/* Stream capture (capture.c).  mode is CUstreamCaptureMode (an enum: int);
 * dependencyData is const CUgraphEdgeData *, only forwarded. */
typedef CUresult (*cuStreamBeginCapture_fn)(CUstream hStream);
typedef CUresult (*cuStreamBeginCapture_v2_fn)(CUstream hStream, int mode);
typedef CUresult (*cuStreamBeginCaptureToGraph_fn)(CUstream hStream, CUgraph hGraph,
                                                   const CUgraphNode *dependencies,
                                                   const void *dependencyData,
                                                   size_t numDependencies, int mode);
typedef CUresult (*cuStreamEndCapture_fn)(CUstream hStream, CUgraph *phGraph);
typedef CUresult (*cuThreadExchangeStreamCaptureMode_fn)(int *mode);

#endif /* NVSHARE_CUDA_ABI_H */
