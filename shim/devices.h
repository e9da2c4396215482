/* The GPUs this process sees (devices.c): how many, their UUIDs, their memory. */
#ifndef NVSHARE_DEVICES_H
#define NVSHARE_DEVICES_H

#include <stdatomic.h>
#include <stdint.h>

#include "nvshare_protocol.h"

/* Asks the driver once which GPUs there are.  0 when they are known (now or
 * before); -1 before cuInit (or without a driver): the next call asks again.
 * Cheap once known: every allocation calls it. */
int nvshare_devices_discover(void);

/* The GPUs known so far: 0 until discovered, at most NVSHARE_MAX_GPUS. */
int nvshare_gpu_count(void);
const struct nvshare_gpu_uuid *nvshare_gpu_uuid(int gpu);
/* The index of the GPU with this UUID, or -1. */
int nvshare_gpu_of_uuid(const struct nvshare_gpu_uuid *uuid);
/* gpu's total memory in bytes (cuDeviceTotalMem_v2); 0 when unknown. */
uint64_t nvshare_gpu_total_bytes(int gpu);

/* Bumped whenever what a thread cached about its current context (its GPU and
 * slot, contexts.c) may be stale: when the GPUs become known here, and when
 * the driver frees a context (lifecycle.c). */
extern atomic_uint nvshare_context_generation;

/* In a forked child: the GPUs stay; the mutex may have been copied locked. */
void nvshare_devices_forget_after_fork(void);

#endif
