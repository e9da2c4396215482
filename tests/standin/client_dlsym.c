/* Test client that dlopens libcuda.so.1 and dlsym's every function by its
 * exported (versioned) name, as PyTorch's libraries do for ~60 functions. */
#include <dlfcn.h>
#include <stdio.h>

#include "workload.h"

static int load_dlsym(struct driver *driver, int per_thread)
{
    (void)per_thread;
    void *handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        fprintf(stderr, "client_dlsym: %s\n", dlerror());
        return -1;
    }
#define STANDIN_DLSYM(base, symbol)                                   \
    if ((*(void **)&driver->base = dlsym(handle, #symbol)) == NULL) { \
        fprintf(stderr, "client_dlsym: no symbol %s\n", #symbol);     \
        return -1;                                                    \
    }
    DRIVER_API(STANDIN_DLSYM)
#undef STANDIN_DLSYM
    return 0;
}

int main(int argc, char **argv)
{
    return client_main("dlsym", load_dlsym, argc, argv);
}
