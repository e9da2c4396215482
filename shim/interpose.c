/*
 * Interposition: how every path to the driver ends at a hook.
 *
 * Programs linked to libcuda bind to the shim's exported functions (the
 * shim is preloaded, so it comes first in the lookup scope).  PyTorch instead
 * calls dlsym(handle, "cu...") and cudart calls cuGetProcAddress(_v2), also
 * for "cuGetProcAddress" itself.  Both hand out the driver's own addresses,
 * so both are hooked here and swap each address for its row's hook, using a
 * map built from the driver's address of every exported name in the table.
 * That covers every cudaVersion and per-thread-stream variant without
 * encoding the driver's versioning rules: on the H100 (driver 580) every
 * pointer cuGetProcAddress_v2 returned was the address of an exported name.
 */
#define _GNU_SOURCE
#include "interpose.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"
#include "hooks.h"
#include "log.h"

/* Every row's hook, in the table's order: the generated ones (hooks.c) and
 * the hand-written ones, declared in hooks.h. */
#define GATED_ROW(name, signature, stream, launch) (void *)name,
#define OWN_ROW(name, kind, stream, prototype)     (void *)name,
static void *const hook_functions[NVSHARE_HOOK_COUNT] = {NVSHARE_HOOK_TABLE(GATED_ROW, OWN_ROW)};

struct pointer_to_hook {
    uintptr_t real;
    void *hook;
};
static struct pointer_to_hook hook_map[NVSHARE_HOOK_COUNT];
static size_t hook_map_size;

static pthread_once_t map_once = PTHREAD_ONCE_INIT;

static int by_real_address(const void *a, const void *b)
{
    uintptr_t left = ((const struct pointer_to_hook *)a)->real;
    uintptr_t right = ((const struct pointer_to_hook *)b)->real;
    return (left > right) - (left < right);
}

/* The driver's address of every row -> the row's hook, sorted for a binary search. */
static void build_map(void)
{
    for (size_t row = 0; row < NVSHARE_HOOK_COUNT; row++) {
        if (nvshare_real[row] == NULL)
            continue;
        hook_map[hook_map_size].real = (uintptr_t)nvshare_real[row];
        hook_map[hook_map_size].hook = hook_functions[row];
        hook_map_size++;
    }
    qsort(hook_map, hook_map_size, sizeof hook_map[0], by_real_address);
}

/* "cuMemcpyHtoDAsync_v2_ptsz" and "cuMemcpyHtoDAsync" share the base
 * "cuMemcpyHtoDAsync": the family a lookup belongs to. */
static size_t base_length(const char *name)
{
    static const char *const suffixes[] = {"_ptsz", "_ptds", "_v2", "_v3", "_v4"};
    size_t length = strlen(name);
    for (int stripped = 1; stripped;) {
        stripped = 0;
        for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
            size_t suffix = strlen(suffixes[i]);
            if (length > suffix && strncmp(name + length - suffix, suffixes[i], suffix) == 0) {
                length -= suffix;
                stripped = 1;
            }
        }
    }
    return length;
}

static int family_is_hooked(const char *name)
{
    size_t length = base_length(name);
    for (size_t row = 0; row < NVSHARE_HOOK_COUNT; row++) {
        const char *hooked = nvshare_hook_names[row];
        if (base_length(hooked) == length && strncmp(hooked, name, length) == 0)
            return 1;
    }
    return 0;
}

void *nvshare_hook_for(void *real, const char *name, int cuda_version, unsigned long long flags)
{
    if (real == NULL || nvshare_resolve_driver() != 0)
        return real;
    pthread_once(&map_once, build_map);
    size_t low = 0, high = hook_map_size;
    while (low < high) {
        size_t middle = (low + high) / 2;
        if (hook_map[middle].real < (uintptr_t)real)
            low = middle + 1;
        else
            high = middle;
    }
    if (low < hook_map_size && hook_map[low].real == (uintptr_t)real)
        return hook_map[low].hook;
    if (name != NULL && nvshare_debug_enabled() && family_is_hooked(name))
        nvshare_debug("%s (cudaVersion %d, flags %llu) resolved to a function the hook table "
                      "does not know; it runs ungated",
                      name, cuda_version, flags);
    return real;
}

/* The interposed dlsym.  RTLD_NEXT (and RTLD_DEFAULT's scope) is relative to
 * the caller, which glibc finds from the return address: those calls are tail
 * calls, so glibc sees the application's return address, not the shim's.  gcc
 * emits tail calls only when optimising (tests/shim/test_dlsym_versions.py
 * checks the behaviour). */
#ifndef __OPTIMIZE__
#error "interpose.c needs optimisation (-O1 or more): dlsym(RTLD_NEXT) relies on a tail call"
#endif
/* Every copy of the shim exports this.  Two copies can end up in one process
 * (LD_PRELOAD naming a copy on a node whose /etc/ld.so.preload names another):
 * the first one the global scope reaches hooks the process, and any other
 * only forwards dlsym, so the first one's lookups reach the driver.  Before
 * this, each copy resolved the driver through the other's dlsym and a CUDA
 * program recursed in cuInit until its stack ran out.  The comparison takes
 * the local name: the exported one binds to the first copy's, in every copy. */
static const char own_marker = 1;
NVSHARE_EXPORT extern const char nvshare_shim_marker __attribute__((alias("own_marker")));

static atomic_int copy_role; /* 0 not known yet, 1 in charge, -1 stays out */

static int in_charge(nvshare_dlsym_fn lookup)
{
    int role = atomic_load_explicit(&copy_role, memory_order_acquire);
    if (role == 0) {
        int saved_errno = errno;
        role = lookup(RTLD_DEFAULT, "nvshare_shim_marker") == &own_marker ? 1 : -1;
        if (role < 0)
            nvshare_debug("another copy of libnvshare.so came first in this process; this one "
                          "stays out of the way");
        atomic_store_explicit(&copy_role, role, memory_order_release);
        errno = saved_errno;
    }
    return role > 0;
}

static int is_own_hook(const void *function)
{
    for (size_t row = 0; row < NVSHARE_HOOK_COUNT; row++) {
        if (hook_functions[row] == function)
            return 1;
    }
    return 0;
}

NVSHARE_NOT_SANITIZED static void *interposed_dlsym(void *handle, const char *name)
{
    nvshare_dlsym_fn lookup = nvshare_real_dlsym();
    if (handle == RTLD_NEXT || lookup == NULL || name == NULL || name[0] != 'c' || name[1] != 'u' ||
        !in_charge(lookup))
        return lookup ? lookup(handle, name) : NULL;
    void *found = lookup(handle, name);
    if (found == NULL) {
        /* Asked by the shim, RTLD_DEFAULT searched the shim's scope; a library
         * loaded with RTLD_LOCAL that needs libcuda has it in its own scope
         * only.  Ask again as a tail call, so glibc sees the caller.  A name
         * the shim hooks is exported, so the first lookup never misses it. */
        return lookup(handle, name);
    }
    if (!nvshare_driver_looked_for()) {
        /* Never load libcuda for a non-CUDA "cu..." name (cuserid): resolve
         * only when the driver is already in the process. */
        int saved_errno = errno;
        void *loaded = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (loaded != NULL)
            dlclose(loaded);
        errno = saved_errno;
        if (loaded == NULL)
            /* Without the driver, one of the shim's own exports answers only
             * because the shim is preloaded: a program probing for CUDA
             * ("is cuInit there?") must see what it would see without it. */
            return is_own_hook(found) ? NULL : found;
    }
    return nvshare_hook_for(found, name, 0, 0);
}

/* One body, two symbol versions. */
NVSHARE_EXPORT void *nvshare_dlsym_glibc_2_34(void *handle, const char *name)
    __attribute__((alias("interposed_dlsym")));
NVSHARE_EXPORT void *nvshare_dlsym_glibc_2_2_5(void *handle, const char *name)
    __attribute__((alias("interposed_dlsym")));
__asm__(".symver nvshare_dlsym_glibc_2_34, dlsym@@GLIBC_2.34");
__asm__(".symver nvshare_dlsym_glibc_2_2_5, dlsym@GLIBC_2.2.5");

NVSHARE_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                            cuuint64_t flags,
                                            CUdriverProcAddressQueryResult *symbolStatus)
{
    NVSHARE_REAL_OR_RETURN(cuGetProcAddress_v2, real);
    CUresult result = real(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (result == CUDA_SUCCESS && pfn != NULL && *pfn != NULL) {
        int saved_errno = errno;
        *pfn = nvshare_hook_for(*pfn, symbol, cudaVersion, flags);
        errno = saved_errno;
    }
    return result;
}

NVSHARE_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                         cuuint64_t flags)
{
    NVSHARE_REAL_OR_RETURN(cuGetProcAddress, real);
    CUresult result = real(symbol, pfn, cudaVersion, flags);
    if (result == CUDA_SUCCESS && pfn != NULL && *pfn != NULL) {
        int saved_errno = errno;
        *pfn = nvshare_hook_for(*pfn, symbol, cudaVersion, flags);
        errno = saved_errno;
    }
    return result;
}
