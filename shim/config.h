/* The shim's environment (shim/README.md, "Environment"), read once with secure_getenv
 * at the first CUDA call, never at load time. */
#ifndef NVSHARE_CONFIG_H
#define NVSHARE_CONFIG_H

#include <stdint.h>
#include <sys/un.h>

struct nvshare_config {
    char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* NVSHARE_SOCKET */
    int debug;                  /* NVSHARE_DEBUG=1 (read by log.c) */
    int prefetch;               /* NVSHARE_PREFETCH (default 1) */
    unsigned prefetch_after_ms; /* NVSHARE_PREFETCH_AFTER_MS: only after this long away */
    int single_oversub;         /* NVSHARE_ENABLE_SINGLE_OVERSUB=1 */
    unsigned max_queued_ms;     /* NVSHARE_MAX_QUEUED_MS (default 50, 0 = unbounded) */
    /* NVSHARE_MEMORY_CAP: this process's own memory cap per GPU, in bytes (K, M, G or T
     * suffix); 0 none.  The device plugin sets it for a pod (docs/kubernetes.md). */
    uint64_t memory_cap_bytes;
};

const struct nvshare_config *nvshare_config(void);

#endif
