/*
 * What the shim knows of this process's device memory: every allocation it
 * converted, counted or parked (by address; VMM memory and arrays by handle), and the
 * totals per GPU that the client thread reports to the agent (coalesced: the
 * allocations ring the client thread's doorbell, the thread sends the latest
 * totals).  The hooks that allocate and free (memory.c, memory_passthrough.c,
 * parking.c) and the grant's prefetch (memory_prefetch.c) all read and write
 * here.
 *
 * The mutex guards the maps and totals only; no driver call runs under it.
 */
#define _GNU_SOURCE
#include "memory_accounting.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "allocation_map.h"
#include "config.h"
#include "driver.h"
#include "hooks.h"
#include "log.h"
#include "nvshare_protocol.h"
#include "shim_threads.h"

struct gpu_memory {
    uint64_t managed_bytes;
    uint64_t unmanaged_bytes;
    uint64_t reserved_bytes; /* allocations under way, counted against the limit */
    uint64_t cap_bytes;      /* the share group's cap (MEMORY_CAP); 0: none */
    uint64_t others_bytes;   /* what the group's other processes hold */
    int changed;             /* totals not yet reported */
    int cap_said;            /* by this connection's agent (MEMORY_CAP) */
};

pthread_mutex_t nvshare_memory_mutex = PTHREAD_MUTEX_INITIALIZER;
struct allocation_map nvshare_pointer_map;
struct allocation_map nvshare_handle_map;
struct allocation_map nvshare_vmm_mapping_map;
struct allocation_map nvshare_array_map;
static struct gpu_memory gpus[NVSHARE_MAX_GPUS];
/* A connection's agent has yet to say its caps; allocations wait on caps_cond. */
static int caps_awaited;
static pthread_cond_t caps_cond = PTHREAD_COND_INITIALIZER;

static void count(int gpu, enum allocation_kind kind, uint64_t bytes, int adding)
{
    int unmanaged = kind == ALLOCATION_VMM || kind == ALLOCATION_IPC || kind == ALLOCATION_ARRAY;
    uint64_t *total = unmanaged ? &gpus[gpu].unmanaged_bytes : &gpus[gpu].managed_bytes;
    *total = adding ? *total + bytes : (*total >= bytes ? *total - bytes : 0);
    gpus[gpu].changed = 1;
}

void nvshare_memory_remember(struct allocation_map *map, uint64_t key, uint64_t bytes, int gpu,
                             int context_slot, enum allocation_kind kind)
{
    struct allocation entry = {.key = key,
                               .bytes = bytes,
                               .gpu = gpu,
                               .context_slot = context_slot,
                               .kind = kind,
                               .opens = 1};
    pthread_mutex_lock(&nvshare_memory_mutex);
    struct allocation *known = allocation_map_find(map, key);
    if (known != NULL && kind == ALLOCATION_IPC && known->kind == ALLOCATION_IPC) {
        known->opens++; /* a handle opened again: the same mapping, its reference counted */
    } else {
        /* An address handed out again while still known: its free went unseen (a
         * context past the slots), so the old entry's bytes are gone. */
        if (known != NULL)
            count(known->gpu, known->kind, known->bytes, 0);
        if (allocation_map_put(map, &entry) == 0)
            count(gpu, kind, bytes, 1);
    }
    pthread_mutex_unlock(&nvshare_memory_mutex);
    nvshare_client_wake();
}

int nvshare_memory_forget(struct allocation_map *map, uint64_t key, enum allocation_kind kind)
{
    struct allocation entry;
    pthread_mutex_lock(&nvshare_memory_mutex);
    struct allocation *found = allocation_map_find(map, key);
    if (found != NULL && found->kind == kind && found->opens > 1) {
        found->opens--; /* an IPC mapping still open, a VMM handle still mapped or unreleased */
        pthread_mutex_unlock(&nvshare_memory_mutex);
        return 1;
    }
    int known = found != NULL && found->kind == kind && allocation_map_take(map, key, &entry);
    if (known)
        count(entry.gpu, entry.kind, entry.bytes, 0);
    pthread_mutex_unlock(&nvshare_memory_mutex);
    if (known)
        nvshare_client_wake();
    return known;
}

int nvshare_memory_take(struct allocation_map *map, uint64_t key, enum allocation_kind kind,
                        struct allocation *taken)
{
    pthread_mutex_lock(&nvshare_memory_mutex);
    struct allocation *found = allocation_map_find(map, key);
    int known = found != NULL && found->kind == kind && allocation_map_take(map, key, taken);
    if (known)
        count(taken->gpu, taken->kind, taken->bytes, 0);
    pthread_mutex_unlock(&nvshare_memory_mutex);
    if (known)
        nvshare_client_wake();
    return known;
}

static int is_managed(const struct allocation *entry)
{
    return nvshare_memory_kind_is_managed(entry->kind);
}

int nvshare_memory_kind_is_managed(enum allocation_kind kind)
{
    return kind == ALLOCATION_CONVERTED || kind == ALLOCATION_APP_MANAGED;
}

enum allocation_kind nvshare_memory_kind_of(uint64_t pointer)
{
    pthread_mutex_lock(&nvshare_memory_mutex);
    struct allocation *found = allocation_map_find(&nvshare_pointer_map, pointer);
    enum allocation_kind kind = found != NULL ? found->kind : 0;
    pthread_mutex_unlock(&nvshare_memory_mutex);
    return kind;
}

int nvshare_memory_reserve(int gpu, uint64_t bytes, uint64_t limit, uint64_t *in_use)
{
    pthread_mutex_lock(&nvshare_memory_mutex);
    struct gpu_memory *memory = &gpus[gpu];
    *in_use = memory->managed_bytes + memory->unmanaged_bytes + memory->reserved_bytes;
    int fits = *in_use <= limit && bytes <= limit - *in_use;
    if (fits)
        memory->reserved_bytes += bytes;
    pthread_mutex_unlock(&nvshare_memory_mutex);
    return fits;
}

void nvshare_memory_unreserve(int gpu, uint64_t bytes)
{
    pthread_mutex_lock(&nvshare_memory_mutex);
    gpus[gpu].reserved_bytes -= bytes;
    pthread_mutex_unlock(&nvshare_memory_mutex);
}

void nvshare_memory_set_cap(int gpu, uint64_t cap_bytes, uint64_t others_bytes)
{
    pthread_mutex_lock(&nvshare_memory_mutex);
    gpus[gpu].cap_bytes = cap_bytes;
    gpus[gpu].others_bytes = cap_bytes ? others_bytes : 0;
    gpus[gpu].cap_said = 1;
    pthread_mutex_unlock(&nvshare_memory_mutex);
}

void nvshare_memory_await_caps(void)
{
    pthread_mutex_lock(&nvshare_memory_mutex);
    caps_awaited = 1;
    for (int gpu = 0; gpu < NVSHARE_MAX_GPUS; gpu++)
        gpus[gpu].cap_said = 0;
    pthread_mutex_unlock(&nvshare_memory_mutex);
}

/* Called with the mutex held. */
static void stop_awaiting_caps(void)
{
    caps_awaited = 0;
    pthread_cond_broadcast(&caps_cond);
}

void nvshare_memory_caps_told(void)
{
    pthread_mutex_lock(&nvshare_memory_mutex);
    /* A cap kept from an earlier agent that this one did not say is gone. */
    for (int gpu = 0; gpu < NVSHARE_MAX_GPUS; gpu++)
        if (!gpus[gpu].cap_said)
            gpus[gpu].cap_bytes = gpus[gpu].others_bytes = 0;
    stop_awaiting_caps();
    pthread_mutex_unlock(&nvshare_memory_mutex);
}

void nvshare_memory_caps_untold(void)
{
    pthread_mutex_lock(&nvshare_memory_mutex);
    stop_awaiting_caps();
    pthread_mutex_unlock(&nvshare_memory_mutex);
}

/* Called with the mutex held: waits while the caps are being told, at most
 * NVSHARE_CAPS_WAIT_MS.  The client thread ends the wait (WELCOME, a lost or silent
 * agent); past the bound an agent that answered but never welcomed (one from before
 * WELCOME) is waited for no longer on this connection. */
static void wait_for_caps(void)
{
    if (!caps_awaited)
        return;
    int cancel_state; /* a cancelled wait would leave the mutex locked */
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
    double deadline_ms = nvshare_now_ms() + NVSHARE_CAPS_WAIT_MS;
    while (caps_awaited) {
        double left_ms = deadline_ms - nvshare_now_ms();
        if (left_ms <= 0) {
            stop_awaiting_caps();
            NVSHARE_WARN_ONCE("the nvshare agent did not say this process's memory caps within "
                              "%d ms: allocating without them until it does",
                              NVSHARE_CAPS_WAIT_MS);
            break;
        }
        /* The condition's clock is CLOCK_REALTIME: short slices, the bound kept by the
         * monotonic clock, so that a clock step neither ends nor stretches the wait. */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        long slice_ns = (long)(left_ms < 50 ? left_ms * 1e6 : 50e6);
        until.tv_nsec += slice_ns;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&caps_cond, &nvshare_memory_mutex, &until);
    }
    pthread_setcancelstate(cancel_state, NULL);
}

int nvshare_memory_capped(int gpu, uint64_t *cap, uint64_t *room)
{
    pthread_mutex_lock(&nvshare_memory_mutex);
    wait_for_caps();
    *cap = gpus[gpu].cap_bytes;
    uint64_t others = gpus[gpu].others_bytes;
    pthread_mutex_unlock(&nvshare_memory_mutex);
    *room = *cap > others ? *cap - others : 0;
    /* The process's own cap (NVSHARE_MEMORY_CAP, a pod's from the device plugin): the
     * tighter of the two binds. */
    uint64_t own = nvshare_config()->memory_cap_bytes;
    if (own != 0 && (*cap == 0 || own < *room)) {
        *room = own;
        *cap = *cap == 0 || own < *cap ? own : *cap;
    }
    return *cap != 0;
}

void nvshare_memory_warn_over_cap(const char *what, uint64_t bytes, int gpu, uint64_t cap,
                                  uint64_t would_hold)
{
    NVSHARE_WARN_ONCE("%s of %llu bytes on GPU %d refused: this process's share group may hold "
                      "%llu bytes there (its memory cap: the agent's setting memory_cap, "
                      "nvsharectl share; or NVSHARE_MEMORY_CAP), it would hold %llu",
                      what, (unsigned long long)bytes, gpu, (unsigned long long)cap,
                      (unsigned long long)would_hold);
}

int nvshare_memory_reserve_under_cap(int gpu, uint64_t bytes, const char *what)
{
    uint64_t cap, room, in_use;
    int capped = nvshare_memory_capped(gpu, &cap, &room);
    if (nvshare_memory_reserve(gpu, bytes, capped ? room : NVSHARE_NO_LIMIT, &in_use))
        return 1;
    if (capped) /* else: bytes past 2^64 with what is held, which the driver refuses too */
        nvshare_memory_warn_over_cap(what, bytes, gpu, cap, cap - room + in_use + bytes);
    return 0;
}

uint64_t nvshare_memory_used(int gpu)
{
    pthread_mutex_lock(&nvshare_memory_mutex);
    uint64_t used = gpus[gpu].managed_bytes + gpus[gpu].unmanaged_bytes;
    pthread_mutex_unlock(&nvshare_memory_mutex);
    return used;
}

/* Forget a managed allocation, free it, and remember it again if the driver
 * refused (taking it out first keeps a racing allocation that reuses the
 * address from being forgotten instead).  A parked one is freed only when
 * parking asks: to the application it is freed already. */
static CUresult free_managed(CUdeviceptr dptr, int *was_ours, int parked_too)
{
    struct allocation entry;
    pthread_mutex_lock(&nvshare_memory_mutex);
    struct allocation *found = allocation_map_find(&nvshare_pointer_map, dptr);
    int parked = found != NULL && found->kind == ALLOCATION_PARKED;
    *was_ours = found != NULL && (parked_too ? parked : is_managed(found) || parked);
    if (*was_ours && (!parked || parked_too)) {
        allocation_map_take(&nvshare_pointer_map, dptr, &entry);
        count(entry.gpu, entry.kind, entry.bytes, 0);
    }
    pthread_mutex_unlock(&nvshare_memory_mutex);
    if (!*was_ours)
        return CUDA_SUCCESS;
    if (parked && !parked_too)
        return CUDA_ERROR_INVALID_VALUE; /* freed twice */
    CUresult result = NVSHARE_REAL(cuMemFree_v2)(dptr);
    /* A parked block the driver would not free is gone for the application
     * already: nothing could free it later. */
    if (result != CUDA_SUCCESS && !parked)
        nvshare_memory_remember(&nvshare_pointer_map, entry.key, entry.bytes, entry.gpu,
                                entry.context_slot, entry.kind);
    else
        nvshare_client_wake();
    return result;
}

CUresult nvshare_memory_free(CUdeviceptr pointer, int *was_ours)
{
    return free_managed(pointer, was_ours, 0);
}

void nvshare_memory_free_parked(uint64_t pointer)
{
    int ours;
    free_managed(pointer, &ours, 1);
}

int nvshare_memory_set_kind(uint64_t pointer, int gpu, int slot, enum allocation_kind from,
                            enum allocation_kind to, uint64_t *bytes)
{
    pthread_mutex_lock(&nvshare_memory_mutex);
    struct allocation *found = allocation_map_find(&nvshare_pointer_map, pointer);
    int changed =
        found != NULL && found->kind == from && found->gpu == gpu && found->context_slot == slot;
    if (changed) {
        found->kind = to;
        *bytes = found->bytes;
    }
    pthread_mutex_unlock(&nvshare_memory_mutex);
    return changed;
}

struct nvshare_memory_range *nvshare_memory_managed_ranges(int gpu, size_t *count)
{
    pthread_mutex_lock(&nvshare_memory_mutex);
    *count = 0;
    struct nvshare_memory_range *ranges = malloc((nvshare_pointer_map.used + 1) * sizeof *ranges);
    for (size_t i = 0; ranges != NULL && i < nvshare_pointer_map.capacity; i++) {
        const struct allocation *entry = &nvshare_pointer_map.slots[i];
        if (entry->key != 0 && entry->gpu == gpu && is_managed(entry))
            ranges[(*count)++] = (struct nvshare_memory_range){entry->key, entry->bytes};
    }
    pthread_mutex_unlock(&nvshare_memory_mutex);
    return ranges;
}

/* ---- for the client thread --------------------------------------------------------------- */

int nvshare_memory_take_report(int gpu, uint64_t *managed_bytes, uint64_t *unmanaged_bytes)
{
    pthread_mutex_lock(&nvshare_memory_mutex);
    int changed = gpus[gpu].changed;
    gpus[gpu].changed = 0;
    *managed_bytes = gpus[gpu].managed_bytes;
    *unmanaged_bytes = gpus[gpu].unmanaged_bytes;
    pthread_mutex_unlock(&nvshare_memory_mutex);
    return changed;
}

void nvshare_memory_mark_all_changed(void)
{
    pthread_mutex_lock(&nvshare_memory_mutex);
    for (int gpu = 0; gpu < NVSHARE_MAX_GPUS; gpu++)
        gpus[gpu].changed = 1;
    pthread_mutex_unlock(&nvshare_memory_mutex);
}

/* Called with the mutex held: drops map's allocations of (gpu, slot); returns how many. */
static size_t forget_context_in(struct allocation_map *map, int gpu, int slot)
{
    size_t gone = 0;
    uint64_t *keys = malloc((map->used + 1) * sizeof *keys);
    for (size_t i = 0; keys != NULL && i < map->capacity; i++) {
        const struct allocation *entry = &map->slots[i];
        if (entry->key != 0 && entry->gpu == gpu && entry->context_slot == slot)
            keys[gone++] = entry->key;
    }
    /* Taken after the walk: taking moves entries of the map around. */
    for (size_t i = 0; i < gone; i++) {
        struct allocation entry;
        if (allocation_map_take(map, keys[i], &entry))
            count(entry.gpu, entry.kind, entry.bytes, 0);
    }
    free(keys);
    return gone;
}

void nvshare_memory_forget_context(int gpu, int slot)
{
    pthread_mutex_lock(&nvshare_memory_mutex);
    /* Arrays die with their context too, like the memory it allocated. */
    size_t gone = forget_context_in(&nvshare_pointer_map, gpu, slot) +
                  forget_context_in(&nvshare_array_map, gpu, slot);
    pthread_mutex_unlock(&nvshare_memory_mutex);
    if (gone > 0) {
        nvshare_debug("forgot %zu allocations of a destroyed context on GPU %d", gone, gpu);
        nvshare_client_wake();
    }
}

void nvshare_memory_forget_after_fork(void)
{
    nvshare_memory_mutex = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    /* The parent's maps are left allocated: freeing in a fork handler is unsafe. */
    memset(&nvshare_pointer_map, 0, sizeof nvshare_pointer_map);
    memset(&nvshare_handle_map, 0, sizeof nvshare_handle_map);
    memset(&nvshare_vmm_mapping_map, 0, sizeof nvshare_vmm_mapping_map);
    memset(&nvshare_array_map, 0, sizeof nvshare_array_map);
    memset(gpus, 0, sizeof gpus);
    caps_awaited = 0; /* the child's client, when it starts, awaits its own agent's */
    caps_cond = (pthread_cond_t)PTHREAD_COND_INITIALIZER;
}
