/* What the shim knows of this process's device memory (memory_accounting.c):
 * its allocations by address, VMM handle and array handle, and the totals per GPU that go
 * to the agent.  Below the hooks that convert (memory.c), pass through
 * (memory_passthrough.c) and park (parking.c), and below the client thread
 * that reports the totals. */
#ifndef NVSHARE_MEMORY_ACCOUNTING_H
#define NVSHARE_MEMORY_ACCOUNTING_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "allocation_map.h"
#include "cuda_abi.h"

/* Guards the maps and the totals; no driver call runs under it. */
extern pthread_mutex_t nvshare_memory_mutex;
extern struct allocation_map nvshare_pointer_map;     /* device address -> allocation */
extern struct allocation_map nvshare_handle_map;      /* VMM handle -> allocation */
extern struct allocation_map nvshare_vmm_mapping_map; /* VMM mapped address -> its handle, bytes */
extern struct allocation_map nvshare_array_map;       /* CUarray, CUmipmappedArray -> allocation */

/* Record an allocation and add it to its GPU's totals (then the agent hears).
 * context_slot: the context it belongs to (nvshare_current_context_slot). */
void nvshare_memory_remember(struct allocation_map *map, uint64_t key, uint64_t bytes, int gpu,
                             int context_slot, enum allocation_kind kind);
/* Drop key if it is an allocation of that kind; returns 1 when it was. */
int nvshare_memory_forget(struct allocation_map *map, uint64_t key, enum allocation_kind kind);
/* Drop key's allocation of that kind whole, a copy in *taken; returns 1 when it was
 * there.  Before a free the driver may refuse: nvshare_memory_remember puts it back. */
int nvshare_memory_take(struct allocation_map *map, uint64_t key, enum allocation_kind kind,
                        struct allocation *taken);

/* The kind of the allocation at pointer; 0 when the shim does not know it. */
enum allocation_kind nvshare_memory_kind_of(uint64_t pointer);
/* 1 for the kinds that are managed memory (converted, or the application's own). */
int nvshare_memory_kind_is_managed(enum allocation_kind kind);

/* Counts bytes about to be allocated on gpu against limit (NVSHARE_NO_LIMIT: none):
 * 1 when they fit, 0 when not; *in_use says what the process holds already.
 * nvshare_memory_unreserve gives them back once the allocation is made (and
 * remembered) or failed. */
#define NVSHARE_NO_LIMIT UINT64_MAX
int nvshare_memory_reserve(int gpu, uint64_t bytes, uint64_t limit, uint64_t *in_use);
void nvshare_memory_unreserve(int gpu, uint64_t bytes);
/* The memory cap of this process's share group on gpu, as the agent last said
 * (MEMORY_CAP): cap_bytes 0 is none; others_bytes what the group's other
 * processes hold there.  Kept while the agent is away; a new connection's agent
 * says it again before its WELCOME. */
void nvshare_memory_set_cap(int gpu, uint64_t cap_bytes, uint64_t others_bytes);
/* The caps are being told: a connection to an agent begins (or the client starts).
 * Until nvshare_memory_caps_told or _untold, nvshare_memory_capped waits. */
void nvshare_memory_await_caps(void);
/* WELCOME came: the agent has said every cap it will say before it (a GPU it said
 * nothing of has none). */
void nvshare_memory_caps_told(void);
/* No agent will say them (none, lost, silent): the last ones known stay. */
void nvshare_memory_caps_untold(void);
/* The most this process may hold on gpu under the cap (the cap less what the
 * others hold, at least 0) in *room, and the cap in *cap; 0 when there is none.
 * While the caps are being told, waits for them first (at most
 * NVSHARE_CAPS_WAIT_MS, once per connection): an allocation right after cuInit
 * must not slip in before the agent's word. */
int nvshare_memory_capped(int gpu, uint64_t *cap, uint64_t *room);
/* Past the client thread's own bounds (an agent silent for 3 s, or that answered
 * without WELCOME for 1 s: lock_client.c): only should that thread be stuck. */
#define NVSHARE_CAPS_WAIT_MS 4000
/* Reserves bytes on gpu under its cap (nvshare_memory_reserve, with the cap's room
 * as the limit; no limit without a cap): 1 when they fit; 0, warned once, when
 * they would take the group past it.  For the allocations that are not converted
 * (the application's managed memory, VMM, arrays). */
int nvshare_memory_reserve_under_cap(int gpu, uint64_t bytes, const char *what);
/* The one warning for an allocation refused by the cap: it would make the group
 * hold would_hold of cap bytes. */
void nvshare_memory_warn_over_cap(const char *what, uint64_t bytes, int gpu, uint64_t cap,
                                  uint64_t would_hold);

/* Managed and unmanaged bytes gpu's allocations hold (cuMemGetInfo). */
uint64_t nvshare_memory_used(int gpu);

/* Frees a managed allocation of the shim's (converted or the application's
 * own) through the driver; *was_ours 0 leaves it to the caller.  A parked one
 * is already freed to the application: CUDA_ERROR_INVALID_VALUE. */
CUresult nvshare_memory_free(CUdeviceptr pointer, int *was_ours);
/* Changes the kind of the allocation at pointer from `from` to `to` if it is one of gpu's, made
 * in context slot; returns 1 and its size in *bytes when it did. */
int nvshare_memory_set_kind(uint64_t pointer, int gpu, int slot, enum allocation_kind from,
                            enum allocation_kind to, uint64_t *bytes);
/* Forgets and frees a parked allocation (parking.c). */
void nvshare_memory_free_parked(uint64_t pointer);

/* The managed allocations of gpu, for a grant's prefetch: a malloc'd array
 * (the caller frees it) of *count ranges. */
struct nvshare_memory_range {
    CUdeviceptr start;
    uint64_t bytes;
};
struct nvshare_memory_range *nvshare_memory_managed_ranges(int gpu, size_t *count);

/* Totals of gpu for a MEMORY_REPORT; returns 1 when they changed since the
 * last call (reports are coalesced: many allocations, one frame). */
int nvshare_memory_take_report(int gpu, uint64_t *managed_bytes, uint64_t *unmanaged_bytes);

/* After (re)connecting: report every GPU again. */
void nvshare_memory_mark_all_changed(void);

/* The driver freed the context of (gpu, slot): drop the allocations made in
 * it, without touching them (lifecycle.c). */
void nvshare_memory_forget_context(int gpu, int slot);

/* In a forked child: drop the parent's bookkeeping without freeing or locking. */
void nvshare_memory_forget_after_fork(void);

#endif
