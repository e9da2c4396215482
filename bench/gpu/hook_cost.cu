// What the shim's launch hook itself costs, measured inside one process:
// cuLaunchKernel through the hook (what dlsym hands the application under the
// shim) against the driver's own cuLaunchKernel (glibc's dlsym, which the shim
// does not interpose), alternating block by block.  Both paths share the
// process, the context and the GPU's state, so the process-to-process spread
// that blurs launch_loop.cu's figure (~1 us) cancels out.
//   LD_PRELOAD=libnvshare.so hook_cost [BLOCKS] [LAUNCHES_PER_BLOCK]
// A third path, the driver's own launch followed by one locked add on a
// private counter, asks whether a locked instruction right after a launch
// costs more than its own few nanoseconds (the gate's leave is one).
// Prints one JSON line: ns per launch of every block, each path, and the
// driver's cuCtxGetCurrent (the gate calls it on every launch) for scale.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <string>
#include <vector>

__global__ void empty_kernel() {}

typedef void *(*dlsym_fn)(void *, const char *);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, CUstream, void **, void **);
typedef CUresult (*synchronize_fn)(void);
typedef CUresult (*get_current_fn)(CUcontext *);

static launch_fn driver_launch;
static unsigned long locked_counter;

static CUresult launch_then_locked_add(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                       unsigned by, unsigned bz, unsigned shared, CUstream stream, void **params,
                                       void **extra) {
    CUresult result = driver_launch(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
    __atomic_fetch_add(&locked_counter, 1, __ATOMIC_SEQ_CST);
    return result;
}

static void fail(const char *what) {
    std::fprintf(stderr, "hook_cost: %s\n", what);
    std::exit(1);
}

// glibc's own dlsym, taken from libc by version so the shim's dlsym is not asked.
static dlsym_fn glibc_dlsym() {
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    if (libc == nullptr) fail("libc.so.6 is not loaded");
    void *found = dlvsym(libc, "dlsym", "GLIBC_2.34");
    if (found == nullptr) found = dlvsym(libc, "dlsym", "GLIBC_2.2.5");
    if (found == nullptr) fail("no versioned dlsym in libc");
    return (dlsym_fn)found;
}

static std::string module_of(void *function) {
    Dl_info info;
    return dladdr(function, &info) && info.dli_fname ? info.dli_fname : "?";
}

static double now_ns() {
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static void print_list(const char *key, const std::vector<double> &values) {
    std::printf("\"%s\": [", key);
    for (size_t i = 0; i < values.size(); i++) std::printf("%s%.2f", i ? ", " : "", values[i]);
    std::printf("]");
}

int main(int argc, char **argv) {
    const int blocks = argc > 1 ? std::atoi(argv[1]) : 4000;
    const int per_block = argc > 2 ? std::atoi(argv[2]) : 64;
    if (blocks < 1 || per_block < 1) fail("BLOCKS and LAUNCHES_PER_BLOCK must be positive numbers");

    // Through cudart first: the context exists, and under the shim this process holds the lock.
    empty_kernel<<<1, 1>>>();
    if (cudaDeviceSynchronize() != cudaSuccess) fail("the first launch failed");
    CUfunction function;
    if (cudaGetFuncBySymbol(&function, (const void *)empty_kernel) != cudaSuccess) fail("cudaGetFuncBySymbol");

    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (cuda == nullptr) fail("libcuda.so.1 is not loaded");
    dlsym_fn driver_lookup = glibc_dlsym();
    launch_fn hooked = (launch_fn)dlsym(cuda, "cuLaunchKernel");
    launch_fn driver = (launch_fn)driver_lookup(cuda, "cuLaunchKernel");
    synchronize_fn synchronize = (synchronize_fn)driver_lookup(cuda, "cuCtxSynchronize");
    get_current_fn get_current = (get_current_fn)driver_lookup(cuda, "cuCtxGetCurrent");
    if (hooked == nullptr || driver == nullptr || synchronize == nullptr || get_current == nullptr)
        fail("a driver function is missing");

    driver_launch = driver;
    const int path_count = 3;
    launch_fn paths[path_count] = {driver, hooked, launch_then_locked_add};
    std::vector<double> ns[path_count];
    const int warm_up = 200;
    for (int block = -warm_up; block < blocks; block++) {
        for (int turn = 0; turn < path_count; turn++) {
            // The order rotates every block, so no path always follows another.
            int path = block < 0 ? turn : (block + turn) % path_count;
            double start = now_ns();
            for (int i = 0; i < per_block; i++)
                if (paths[path](function, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr) != CUDA_SUCCESS)
                    fail("cuLaunchKernel failed");
            double elapsed = now_ns() - start;
            synchronize();      // each block starts with nothing queued
            if (block >= 0) ns[path].push_back(elapsed / per_block);
        }
    }

    // cuCtxGetCurrent: the fastest of 200 rounds of 1,000 calls.
    double get_current_ns = 1e30;
    for (int round = 0; round < 200; round++) {
        CUcontext context;
        double start = now_ns();
        for (int i = 0; i < 1000; i++) get_current(&context);
        double each = (now_ns() - start) / 1000;
        if (each < get_current_ns) get_current_ns = each;
    }

    std::printf("{\"blocks\": %d, \"launches_per_block\": %d, \"hooked_in\": \"%s\", \"driver_in\": \"%s\", "
                "\"ctx_get_current_ns\": %.2f, ", blocks, per_block, module_of((void *)hooked).c_str(),
                module_of((void *)driver).c_str(), get_current_ns);
    print_list("driver_ns", ns[0]);
    std::printf(", ");
    print_list("hook_ns", ns[1]);
    std::printf(", ");
    print_list("driver_then_locked_ns", ns[2]);
    std::printf("}\n");
    return 0;
}
