// Memory the shim passes through (VMM, IPC) and what cuMemGetInfo says of it.
//   passthrough vmm unmap_first|release_first
//       maps one granule of cuMemCreate memory, releases the handle before or after the
//       unmap (release_first is the CUDA guide's order) and a retained handle while it is
//       mapped, and prints the free memory while it is mapped and after it is gone (the
//       driver frees it only then).
//   passthrough export
//       allocates with cuMemAlloc (run it without the shim: managed memory has no IPC
//       handle), prints "handle=<hex>" and waits for a line on stdin before exiting.
//   passthrough import HEX
//       opens that handle twice (the driver gives the same mapping, counting the opens),
//       closes it as often, and prints the free memory before and after.
#include <cstdio>
#include <cstring>
#include <cuda.h>

#include "check.cuh"

static size_t free_memory() {
    size_t free_bytes = 0, total_bytes = 0;
    CHECK_DRIVER(cuMemGetInfo(&free_bytes, &total_bytes));
    return free_bytes;
}

static int vmm(bool release_first) {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t granularity = 0;
    CHECK_DRIVER(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    size_t free_before = free_memory();
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle handle = 0;
    CHECK_DRIVER(cuMemAddressReserve(&va, granularity, 0, 0, 0));
    CHECK_DRIVER(cuMemCreate(&handle, granularity, &prop, 0));
    CHECK_DRIVER(cuMemMap(va, granularity, 0, handle, 0));
    if (release_first)
        CHECK_DRIVER(cuMemRelease(handle));
    CUmemGenericAllocationHandle retained = 0;  // another reference, as NCCL takes one
    CHECK_DRIVER(cuMemRetainAllocationHandle(&retained, (void *)va));
    CHECK_DRIVER(cuMemRelease(retained));
    CUmemAccessDesc access = {};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK_DRIVER(cuMemSetAccess(va, granularity, &access, 1));
    CHECK_DRIVER(cuMemsetD32(va, 7, granularity / 4));
    unsigned seven = 0;
    CHECK_DRIVER(cuMemcpyDtoH(&seven, va + granularity - 4, 4));
    size_t free_mapped = free_memory();
    CHECK_DRIVER(cuMemUnmap(va, granularity));
    if (!release_first)
        CHECK_DRIVER(cuMemRelease(handle));
    CHECK_DRIVER(cuMemAddressFree(va, granularity));
    size_t free_after = free_memory();
    std::printf("result=ok bytes=%zu free_before=%zu free_mapped=%zu free_after=%zu value=%u\n", granularity,
                free_before, free_mapped, free_after, seven);
    return 0;
}

static int export_handle() {
    CUdeviceptr memory;
    CUipcMemHandle handle;
    CHECK_DRIVER(cuMemAlloc(&memory, 64 << 20));
    CHECK_DRIVER(cuIpcGetMemHandle(&handle, memory));
    std::printf("handle=");
    for (size_t i = 0; i < sizeof handle.reserved; i++)
        std::printf("%02x", (unsigned char)handle.reserved[i]);
    std::printf("\n");
    std::fflush(stdout);
    char line[16];
    if (std::fgets(line, sizeof line, stdin) == nullptr)
        return 1;
    std::printf("result=ok\n");
    return 0;
}

static int import_handle(const char *hex) {
    CUipcMemHandle handle = {};
    if (std::strlen(hex) != 2 * sizeof handle.reserved) {
        std::printf("result=error bad handle\n");
        return 1;
    }
    for (size_t i = 0; i < sizeof handle.reserved; i++) {
        unsigned byte;
        std::sscanf(hex + 2 * i, "%2x", &byte);
        handle.reserved[i] = (char)byte;
    }
    size_t free_before = free_memory();
    CUdeviceptr opened = 0, again = 0;
    CHECK_DRIVER(cuIpcOpenMemHandle(&opened, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    CHECK_DRIVER(cuIpcOpenMemHandle(&again, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    size_t free_open = free_memory();
    CHECK_DRIVER(cuIpcCloseMemHandle(again));
    CHECK_DRIVER(cuIpcCloseMemHandle(opened));
    size_t free_after = free_memory();
    std::printf("result=ok same_mapping=%d free_before=%zu free_open=%zu free_after=%zu\n", opened == again,
                free_before, free_open, free_after);
    return 0;
}

int main(int argc, char **argv) {
    bool is_vmm = argc == 3 && !std::strcmp(argv[1], "vmm") &&
                  (!std::strcmp(argv[2], "unmap_first") || !std::strcmp(argv[2], "release_first"));
    bool is_export = argc == 2 && !std::strcmp(argv[1], "export");
    bool is_import = argc == 3 && !std::strcmp(argv[1], "import");
    if (!is_vmm && !is_export && !is_import) {
        std::fprintf(stderr, "usage: passthrough vmm unmap_first|release_first | export | import HEX\n");
        return 2;
    }
    CUdevice device;
    CUcontext context;
    CHECK_DRIVER(cuInit(0));
    CHECK_DRIVER(cuDeviceGet(&device, 0));
    CHECK_DRIVER(cuDevicePrimaryCtxRetain(&context, device));
    CHECK_DRIVER(cuCtxSetCurrent(context));
    if (is_vmm)
        return vmm(!std::strcmp(argv[2], "release_first"));
    if (is_export)
        return export_handle();
    return import_handle(argv[2]);
}
