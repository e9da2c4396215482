/*
 * The test clients' common workload: allocate, check whether the allocation is
 * managed, copy in, launch add_one N times (rotating over every launch
 * flavour), copy back, verify, free; in bursts, with optional sleeps between
 * them (idle release), a fork, VMM and IPC (passthrough paths), and
 * cuMemGetInfo.  Prints exactly one result line on stdout.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "workload.h"

struct options {
    int loops, launches, ints, sleep_ms, duration_ms, linger_ms;
    const char *alloc, *launch;
    int use_stream, do_fork, vmm, vmm_release_first, ipc, meminfo, per_thread, threads, side_thread,
        device;
    unsigned long long big_bytes;
};

static const struct driver *cu;
static const char *client;
static char extra[512]; /* key=value pairs for the result line */

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...)
{
    size_t used = strlen(extra);
    va_list args;
    va_start(args, fmt);
    vsnprintf(extra + used, sizeof extra - used, fmt, args);
    va_end(args);
}

static const char *error_name(CUresult r)
{
    const char *name = NULL;
    if (cu->cuGetErrorName(r, &name) != CUDA_SUCCESS || name == NULL)
        return "UNKNOWN_ERROR";
    return name;
}

/* --errno: the driver (and an interposer) must leave errno alone on success. */
static int check_errno;
static const char *errno_clobbered;

/* Any failing call ends the client with one line naming the call. */
#define CHECK(call)                                                                           \
    do {                                                                                      \
        if (check_errno)                                                                      \
            errno = 4242;                                                                     \
        CUresult check_result_ = (call);                                                      \
        if (check_errno && errno != 4242 && errno_clobbered == NULL)                          \
            errno_clobbered = #call;                                                          \
        if (check_result_ != CUDA_SUCCESS) {                                                  \
            printf("client=%s pid=%d result=error call=%s error=%s\n", client, (int)getpid(), \
                   #call, error_name(check_result_));                                         \
            fflush(stdout);                                                                   \
            _exit(1);                                                                         \
        }                                                                                     \
    } while (0)

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

struct gpu {
    CUfunction add_one, spin;
    CUstream stream;
};

static CUdeviceptr allocate(const struct options *o, const struct gpu *g, size_t bytes)
{
    CUdeviceptr p = 0;
    if (strcmp(o->alloc, "pitch") == 0) {
        size_t pitch = 0;
        CHECK(cu->cuMemAllocPitch(&p, &pitch, bytes, 1, 4));
    } else if (strcmp(o->alloc, "async") == 0) {
        CHECK(cu->cuMemAllocAsync(&p, bytes, g->stream));
    } else if (strcmp(o->alloc, "managed") == 0) {
        CHECK(cu->cuMemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL));
    } else {
        CHECK(cu->cuMemAlloc(&p, bytes));
    }
    return p;
}

static void release(const struct options *o, const struct gpu *g, CUdeviceptr p)
{
    if (strcmp(o->alloc, "async") == 0) {
        CHECK(cu->cuMemFreeAsync(p, g->stream));
        CHECK(cu->cuStreamSynchronize(g->stream));
    } else {
        CHECK(cu->cuMemFree(p));
    }
}

static void launch(const struct options *o, const struct gpu *g, int index, CUdeviceptr *p, int *n)
{
    void *params[] = {p, n};
    static const char *const flavours[] = {"kernel", "ex", "coop"};
    const char *flavour = strcmp(o->launch, "all") == 0 ? flavours[index % 3] : o->launch;
    if (strcmp(flavour, "ex") == 0) {
        CUlaunchConfig config = {1, 1, 1, 256, 1, 1, 0, g->stream, NULL, 0};
        CHECK(cu->cuLaunchKernelEx(&config, g->add_one, params, NULL));
    } else if (strcmp(flavour, "coop") == 0) {
        CHECK(cu->cuLaunchCooperativeKernel(g->add_one, 1, 1, 1, 256, 1, 1, 0, g->stream, params));
    } else {
        CHECK(cu->cuLaunchKernel(g->add_one, 1, 1, 1, 256, 1, 1, 0, g->stream, params, NULL));
    }
}

/* One burst: fill, launch add_one `launches` times (+ a graph), read back, verify. */
static int burst(const struct options *o, const struct gpu *g, CUdeviceptr p, int round)
{
    int n = o->ints;
    int *host = malloc((size_t)n * sizeof *host);
    if (host == NULL)
        return 0;
    for (int i = 0; i < n; i++)
        host[i] = round * 1000 + i;
    CHECK(cu->cuMemsetD32(p, 0, (size_t)n));
    if (o->use_stream)
        CHECK(cu->cuMemcpyHtoDAsync(p, host, (size_t)n * sizeof *host, g->stream));
    else
        CHECK(cu->cuMemcpyHtoD(p, host, (size_t)n * sizeof *host));
    CUevent start, stop;
    CHECK(cu->cuEventCreate(&start, 0));
    CHECK(cu->cuEventCreate(&stop, 0));
    CHECK(cu->cuEventRecord(start, g->stream));
    for (int k = 0; k < o->launches; k++)
        launch(o, g, k, &p, &n);
    if (strcmp(o->launch, "all") == 0 || strcmp(o->launch, "graph") == 0) {
        CUgraph graph;
        CUgraphExec exec;
        CHECK(cu->cuGraphCreate(&graph, 0));
        CHECK(cu->cuGraphInstantiateWithFlags(&exec, graph, 0));
        CHECK(cu->cuGraphLaunch(exec, g->stream));
        CHECK(cu->cuGraphExecDestroy(exec));
        CHECK(cu->cuGraphDestroy(graph));
    }
    CHECK(cu->cuEventRecord(stop, g->stream));
    CHECK(cu->cuEventSynchronize(stop));
    float ms = 0;
    CHECK(cu->cuEventElapsedTime(&ms, start, stop));
    CHECK(cu->cuEventDestroy(start));
    CHECK(cu->cuEventDestroy(stop));
    CHECK(cu->cuStreamSynchronize(g->stream));
    memset(host, 0xff, (size_t)n * sizeof *host);
    CHECK(cu->cuMemcpyDtoH(host, p, (size_t)n * sizeof *host));
    int good = 1;
    for (int i = 0; i < n; i++)
        good &= host[i] == round * 1000 + i + o->launches;
    free(host);
    return good;
}

static size_t free_memory(void)
{
    size_t free_bytes = 0, total_bytes = 0;
    CHECK(cu->cuMemGetInfo(&free_bytes, &total_bytes));
    return free_bytes;
}

/* release_first: release the handle while it is mapped (the CUDA guide's
 * order; the memory stays until the unmap).  Either way a retained handle is
 * released while mapped.  With meminfo, notes the free memory then and after
 * the unmap. */
static void vmm_roundtrip(int first, int device, int release_first, int meminfo)
{
    CUmemAllocationProp prop = {0};
    prop.type = 1; /* CU_MEM_ALLOCATION_TYPE_PINNED */
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    size_t granularity = 0;
    CHECK(cu->cuMemGetAllocationGranularity(&granularity, &prop, 0));
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle handle = 0;
    CHECK(cu->cuMemAddressReserve(&va, granularity, 0, 0, 0));
    CHECK(cu->cuMemCreate(&handle, granularity, &prop, 0));
    CHECK(cu->cuMemMap(va, granularity, 0, handle, 0));
    if (release_first)
        CHECK(cu->cuMemRelease(handle));
    CUmemGenericAllocationHandle retained = 0; /* another reference, as NCCL takes one */
    CHECK(cu->cuMemRetainAllocationHandle(&retained, (void *)(uintptr_t)va));
    CHECK(cu->cuMemRelease(retained));
    if (first && meminfo)
        note(" mem_free_vmm_mapped=%zu", free_memory());
    CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, device}, 3};
    CHECK(cu->cuMemSetAccess(va, granularity, &access, 1));
    int in[4] = {1, 2, 3, 4}, out[4] = {0};
    CHECK(cu->cuMemcpyHtoD(va, in, sizeof in));
    CHECK(cu->cuMemcpyDtoH(out, va, sizeof out));
    CHECK(cu->cuMemUnmap(va, granularity));
    if (!release_first)
        CHECK(cu->cuMemRelease(handle));
    CHECK(cu->cuMemAddressFree(va, granularity));
    if (first && meminfo)
        note(" mem_free_after_vmm=%zu vmm_bytes=%zu", free_memory(), granularity);
    if (first)
        note(" vmm=%s", memcmp(in, out, sizeof in) == 0 ? "ok" : "wrong");
}

/* Opens the handle twice (the second open gives the same mapping) and closes
 * it as often; with meminfo, the free memory then. */
static void ipc_roundtrip(CUdeviceptr p, int meminfo)
{
    CUipcMemHandle handle;
    CUdeviceptr opened = 0, again = 0;
    CHECK(cu->cuIpcGetMemHandle(&handle, p));
    CHECK(cu->cuIpcOpenMemHandle(&opened, handle, 1));
    CHECK(cu->cuIpcOpenMemHandle(&again, handle, 1));
    CHECK(cu->cuIpcCloseMemHandle(again));
    CHECK(cu->cuIpcCloseMemHandle(opened));
    note(" ipc=ok ipc_same_mapping=%d", opened == again);
    if (meminfo) {
        size_t free_bytes = 0, total_bytes = 0;
        CHECK(cu->cuMemGetInfo(&free_bytes, &total_bytes));
        note(" mem_free_after_ipc=%zu", free_bytes);
    }
}

/* --threads: more threads doing the same bursts at once, each on its own stream. */
struct worker {
    const struct options *o;
    struct gpu g;
    CUcontext ctx;
    int index, good;
    pthread_t thread;
};

static void *work_in_thread(void *arg)
{
    struct worker *w = arg;
    CHECK(cu->cuCtxSetCurrent(w->ctx));
    CHECK(cu->cuStreamCreate(&w->g.stream, 0));
    CUdeviceptr p = allocate(w->o, &w->g, (size_t)w->o->ints * sizeof(int));
    w->good = 1;
    for (int round = 0; round < w->o->loops; round++)
        w->good &= burst(w->o, &w->g, p, 100 * (w->index + 1) + round);
    release(w->o, &w->g, p);
    CHECK(cu->cuStreamDestroy(w->g.stream));
    return NULL;
}

/* --side-thread: a thread that only allocates, inspects and frees memory,
 * which must never wait behind another thread's wait for the GPU. */
struct side {
    const struct options *o;
    struct gpu g;
    CUcontext ctx;
    int stop;
    int allocations;
};

static void *allocate_on_the_side(void *arg)
{
    struct side *s = arg;
    CHECK(cu->cuCtxSetCurrent(s->ctx));
    while (!__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
        CUdeviceptr p = allocate(s->o, &s->g, 4096);
        unsigned managed = 0;
        CHECK(cu->cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p));
        release(s->o, &s->g, p);
        s->allocations++;
        usleep(20000);
    }
    return NULL;
}

static int parse(int argc, char **argv, struct options *o)
{
    static const struct option longs[] = {{"loops", required_argument, NULL, 'l'},
                                          {"launches", required_argument, NULL, 'n'},
                                          {"ints", required_argument, NULL, 'i'},
                                          {"sleep-ms", required_argument, NULL, 's'},
                                          {"duration-ms", required_argument, NULL, 'd'},
                                          {"alloc", required_argument, NULL, 'a'},
                                          {"launch", required_argument, NULL, 'k'},
                                          {"stream", no_argument, NULL, 'S'},
                                          {"fork", no_argument, NULL, 'f'},
                                          {"vmm", no_argument, NULL, 'v'},
                                          {"ipc", no_argument, NULL, 'p'},
                                          {"meminfo", no_argument, NULL, 'm'},
                                          {"big-alloc", required_argument, NULL, 'b'},
                                          {"per-thread", no_argument, NULL, 't'},
                                          {"threads", required_argument, NULL, 'T'},
                                          {"side-thread", no_argument, NULL, 'A'},
                                          {"errno", no_argument, NULL, 'E'},
                                          {"device", required_argument, NULL, 'D'},
                                          {"linger-ms", required_argument, NULL, 'L'},
                                          {"vmm-release-first", no_argument, NULL, 'R'},
                                          {NULL, 0, NULL, 0}};
    *o = (struct options){
        .loops = 3, .launches = 4, .ints = 1024, .alloc = "plain", .launch = "all"};
    int c;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case 'l':
            o->loops = atoi(optarg);
            break;
        case 'n':
            o->launches = atoi(optarg);
            break;
        case 'i':
            o->ints = atoi(optarg);
            break;
        case 's':
            o->sleep_ms = atoi(optarg);
            break;
        case 'd':
            o->duration_ms = atoi(optarg);
            break;
        case 'a':
            o->alloc = optarg;
            break;
        case 'k':
            o->launch = optarg;
            break;
        case 'S':
            o->use_stream = 1;
            break;
        case 'f':
            o->do_fork = 1;
            break;
        case 'v':
            o->vmm = 1;
            break;
        case 'p':
            o->ipc = 1;
            break;
        case 'm':
            o->meminfo = 1;
            break;
        case 'b':
            o->big_bytes = strtoull(optarg, NULL, 0);
            break;
        case 't':
            o->per_thread = 1;
            break;
        case 'T':
            o->threads = atoi(optarg);
            break;
        case 'A':
            o->side_thread = 1;
            break;
        case 'E':
            check_errno = 1;
            break;
        case 'D':
            o->device = atoi(optarg);
            break;
        case 'L':
            o->linger_ms = atoi(optarg);
            break;
        case 'R':
            o->vmm = o->vmm_release_first = 1;
            break;
        default:
            return -1;
        }
    }
    if (optind != argc || o->threads < 0 || o->threads > 64 || o->loops < 0 || o->launches < 0 ||
        o->ints <= 0)
        return -1;
    return 0;
}

int client_main(const char *client_name, driver_loader load, int argc, char **argv)
{
    client = client_name;
    struct options o;
    if (parse(argc, argv, &o) != 0) {
        fprintf(
            stderr,
            "usage: %s [--loops N] [--launches N] [--ints N] [--sleep-ms MS] [--duration-ms MS]\n"
            "  [--linger-ms MS] [--vmm-release-first]\n"
            "  [--alloc plain|pitch|async|managed] [--launch all|kernel|ex|coop|graph] [--stream]\n"
            "  [--fork] [--vmm] [--ipc] [--meminfo] [--big-alloc BYTES] [--per-thread]\n"
            "  [--threads N] [--side-thread] [--errno] [--device ORDINAL]\n",
            argv[0]);
        return 2;
    }
    static struct driver loaded;
    if (load(&loaded, o.per_thread) != 0)
        return 1;
    cu = &loaded;
    double began = now_ms();

    CUdevice dev;
    CUcontext ctx;
    CUmodule module;
    struct gpu g = {0};
    CHECK(cu->cuInit(0));
    CHECK(cu->cuDeviceGet(&dev, o.device));
    CHECK(cu->cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cu->cuCtxSetCurrent(ctx));
    CHECK(cu->cuModuleLoadData(&module, "standin fake image"));
    CHECK(cu->cuModuleGetFunction(&g.add_one, module, "add_one"));
    CHECK(cu->cuModuleGetFunction(&g.spin, module, "spin"));
    if (o.use_stream)
        CHECK(cu->cuStreamCreate(&g.stream, 0));

    if (o.meminfo) {
        size_t free_bytes = 0, total_bytes = 0;
        CHECK(cu->cuMemGetInfo(&free_bytes, &total_bytes));
        note(" mem_free=%zu mem_total=%zu", free_bytes, total_bytes);
    }
    if (o.big_bytes > 0) {
        CUdeviceptr big = 0;
        CUresult r = cu->cuMemAlloc(&big, o.big_bytes);
        note(" big_alloc=%s", r == CUDA_SUCCESS ? "ok" : error_name(r));
        if (r == CUDA_SUCCESS)
            CHECK(cu->cuMemFree(big));
    }

    size_t bytes = (size_t)o.ints * sizeof(int);
    CUdeviceptr p = allocate(&o, &g, bytes);
    unsigned managed = 0;
    CHECK(cu->cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p));
    if (o.meminfo) {
        size_t free_bytes = 0, total_bytes = 0;
        CHECK(cu->cuMemGetInfo(&free_bytes, &total_bytes));
        note(" mem_free_after_alloc=%zu", free_bytes);
    }

    int good = 1, rounds = 0;
    pid_t child = -1;
    struct side side = {.o = &o, .g = g, .ctx = ctx};
    pthread_t side_thread;
    if (o.side_thread && pthread_create(&side_thread, NULL, allocate_on_the_side, &side) != 0)
        return 1;
    struct worker workers[64];
    for (int i = 0; i < o.threads; i++) {
        workers[i] = (struct worker){.o = &o, .g = g, .ctx = ctx, .index = i};
        if (pthread_create(&workers[i].thread, NULL, work_in_thread, &workers[i]) != 0)
            return 1;
    }
    for (;;) {
        int more = o.duration_ms > 0 ? now_ms() - began < o.duration_ms : rounds < o.loops;
        if (!more)
            break;
        if (rounds > 0 && o.sleep_ms > 0)
            usleep((useconds_t)o.sleep_ms * 1000);
        good &= burst(&o, &g, p, rounds);
        if (o.vmm) /* every round: the shim must still warn only once */
            vmm_roundtrip(rounds == 0, o.device, o.vmm_release_first, o.meminfo);
        rounds++;
        if (o.do_fork && child < 0) {
            fflush(stdout);
            child = fork();
            if (child == 0) { /* the child: its own allocation and bursts */
                CUdeviceptr mine = allocate(&o, &g, bytes);
                int ok = burst(&o, &g, mine, 7) && burst(&o, &g, mine, 8);
                release(&o, &g, mine);
                _exit(ok ? 0 : 3);
            }
        }
    }
    for (int i = 0; i < o.threads; i++) {
        pthread_join(workers[i].thread, NULL);
        good &= workers[i].good;
    }
    if (o.threads > 0)
        note(" threads=%d", o.threads);
    if (o.side_thread) {
        __atomic_store_n(&side.stop, 1, __ATOMIC_RELEASE);
        pthread_join(side_thread, NULL);
        note(" side_allocations=%d", side.allocations);
    }
    if (o.linger_ms > 0) /* idle after the bursts, the process still there */
        usleep((useconds_t)o.linger_ms * 1000);
    if (o.ipc)
        ipc_roundtrip(p, o.meminfo);
    if (child > 0) {
        int status = 0;
        waitpid(child, &status, 0);
        int child_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        note(" fork_child=%s child_pid=%d", child_ok ? "ok" : "failed", (int)child);
        good &= child_ok;
    }
    release(&o, &g, p);
    if (g.stream != NULL)
        CHECK(cu->cuStreamDestroy(g.stream));
    if (check_errno)
        note(" errno=%s", errno_clobbered ? errno_clobbered : "kept");
    CHECK(cu->cuModuleUnload(module));
    CHECK(cu->cuDevicePrimaryCtxRelease(dev));
    printf("client=%s pid=%d result=%s managed=%u loops=%d launches=%d elapsed_ms=%.0f%s\n", client,
           (int)getpid(), good ? "ok" : "wrong", managed, rounds, rounds * o.launches,
           now_ms() - began, extra);
    fflush(stdout);
    return good ? 0 : 1;
}
