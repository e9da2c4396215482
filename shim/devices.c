/*
 * The GPUs this process sees, learnt once from the driver at the first CUDA
 * call that needs them (the client's start, an allocation): their number, the
 * UUID the agent knows each one by, and their memory.  The first
 * NVSHARE_MAX_GPUS are scheduled; work on any further one runs unscheduled.
 */
#define _GNU_SOURCE
#include "devices.h"

#include <pthread.h>
#include <string.h>

#include "cuda_abi.h"
#include "driver.h"
#include "log.h"

static pthread_mutex_t discover_mutex = PTHREAD_MUTEX_INITIALIZER;
static atomic_int discovered;
static atomic_int gpu_count;
static struct nvshare_gpu_uuid uuids[NVSHARE_MAX_GPUS];
static _Atomic uint64_t total_bytes[NVSHARE_MAX_GPUS];
atomic_uint nvshare_context_generation = 1;

int nvshare_devices_discover(void)
{
    if (atomic_load_explicit(&discovered, memory_order_acquire))
        return 0;
    if (nvshare_resolve_driver() != 0)
        return -1;
    pthread_mutex_lock(&discover_mutex);
    int count = 0, known = atomic_load(&discovered);
    if (!known && nvshare_driver.device_get_count != NULL &&
        nvshare_driver.device_get_count(&count) == CUDA_SUCCESS) {
        if (count > NVSHARE_MAX_GPUS) {
            NVSHARE_WARN_ONCE("this process sees %d GPUs; nvshare schedules the first %d, work "
                              "on the others runs unscheduled",
                              count, NVSHARE_MAX_GPUS);
            count = NVSHARE_MAX_GPUS;
        }
        for (int gpu = 0; gpu < count; gpu++) {
            CUuuid uuid = {{0}};
            if (nvshare_driver.device_get_uuid != NULL)
                nvshare_driver.device_get_uuid(&uuid, gpu);
            memcpy(uuids[gpu].bytes, uuid.bytes, NVSHARE_UUID_BYTES);
        }
        atomic_store_explicit(&gpu_count, count, memory_order_release);
        atomic_fetch_add(&nvshare_context_generation, 1); /* GPUs now count: look again */
        atomic_store_explicit(&discovered, 1, memory_order_release);
        known = 1;
    }
    pthread_mutex_unlock(&discover_mutex);
    return known ? 0 : -1; /* before cuInit: try again at the next call */
}

int nvshare_gpu_count(void)
{
    return atomic_load_explicit(&gpu_count, memory_order_acquire);
}

const struct nvshare_gpu_uuid *nvshare_gpu_uuid(int gpu)
{
    return &uuids[gpu];
}

int nvshare_gpu_of_uuid(const struct nvshare_gpu_uuid *uuid)
{
    for (int gpu = 0; gpu < nvshare_gpu_count(); gpu++)
        if (memcmp(uuids[gpu].bytes, uuid->bytes, NVSHARE_UUID_BYTES) == 0)
            return gpu;
    return -1;
}

uint64_t nvshare_gpu_total_bytes(int gpu)
{
    uint64_t known = atomic_load_explicit(&total_bytes[gpu], memory_order_relaxed);
    if (known == 0 && nvshare_driver.device_total_mem != NULL) {
        size_t bytes = 0;
        if (nvshare_driver.device_total_mem(&bytes, gpu) == CUDA_SUCCESS)
            atomic_store_explicit(&total_bytes[gpu], known = bytes, memory_order_relaxed);
    }
    return known;
}

void nvshare_devices_forget_after_fork(void)
{
    discover_mutex = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
}
