/* What memory.c shares with memory_passthrough.c and parking.c: the
 * allocation maps and the per-GPU totals behind one mutex. */
#ifndef NVSHARE_MEMORY_INTERNAL_H
#define NVSHARE_MEMORY_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "allocation_map.h"

extern pthread_mutex_t nvshare_memory_mutex;
extern struct allocation_map nvshare_pointer_map;     /* device address -> allocation */
extern struct allocation_map nvshare_handle_map;      /* VMM handle -> allocation */
extern struct allocation_map nvshare_vmm_mapping_map; /* VMM mapped address -> its handle, bytes */

/* Record an allocation and add it to its GPU's totals (then the agent hears).
 * context_slot: the context it belongs to (nvshare_current_context_slot). */
void nvshare_memory_remember(struct allocation_map *map, uint64_t key, uint64_t bytes, int gpu,
                             int context_slot, enum allocation_kind kind);
/* Drop key if it is an allocation of that kind; returns 1 when it was. */
int nvshare_memory_forget(struct allocation_map *map, uint64_t key, enum allocation_kind kind);

/* Changes the kind of the allocation at pointer from `from` to `to` if it is one of gpu's, made
 * in context slot; returns 1 and its size in *bytes when it did. */
int nvshare_memory_set_kind(uint64_t pointer, int gpu, int slot, enum allocation_kind from,
                            enum allocation_kind to, uint64_t *bytes);
/* Forgets and frees a parked allocation (parking.c). */
void nvshare_memory_free_parked(uint64_t pointer);

#endif
