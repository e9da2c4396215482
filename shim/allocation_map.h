/* An open-addressing hash map from an address (or VMM or array handle) to what the
 * shim knows of that allocation: O(1) insert, find and remove.  Not
 * thread-safe: memory.c guards it with its mutex. */
#ifndef NVSHARE_ALLOCATION_MAP_H
#define NVSHARE_ALLOCATION_MAP_H

#include <stddef.h>
#include <stdint.h>

enum allocation_kind {
    ALLOCATION_CONVERTED = 1, /* a device allocation the shim made managed */
    ALLOCATION_APP_MANAGED,   /* the application's own cuMemAllocManaged */
    ALLOCATION_VMM,           /* cuMemCreate: passed through, stays on the GPU */
    ALLOCATION_IPC,           /* cuIpcOpenMemHandle: passed through */
    ALLOCATION_PARKED,        /* converted, freed by cuMemFreeAsync, kept for reuse (parking.c) */
    ALLOCATION_ARRAY          /* a CUDA array (mipmapped too): passed through, stays on the GPU */
};

struct allocation {
    uint64_t key; /* 0 marks an empty slot */
    uint64_t bytes;
    int gpu;
    int context_slot; /* the context it was made in (contexts.c); -1: unknown */
    enum allocation_kind kind;
    /* IPC: opens not yet closed (the driver maps a handle once); VMM: the
     * handle's references (its own, each cuMemRetainAllocationHandle's) plus its
     * mappings: the driver frees it when all are gone. */
    unsigned opens;
    uint64_t vmm_handle; /* a VMM mapping's handle */
};

struct allocation_map {
    struct allocation *slots;
    size_t capacity; /* a power of two, or 0 */
    size_t used;
};

/* 0 on success, -1 when memory for growing is lacking. */
int allocation_map_put(struct allocation_map *map, const struct allocation *entry);
struct allocation *allocation_map_find(struct allocation_map *map, uint64_t key);
/* Removes key; returns 1 and copies the entry out when it was there. */
int allocation_map_take(struct allocation_map *map, uint64_t key, struct allocation *out);

#endif
