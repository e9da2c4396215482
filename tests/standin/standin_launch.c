/*
 * Stand-in driver: fake kernels, modules, launches and graphs.
 *
 * Any image loads as a module; cuModuleGetFunction knows two kernels by name:
 * add_one(int *p, int n) adds 1 to p[0..n), so tests can check results, and
 * spin() only takes time.  Each runs for $STANDIN_KERNEL_US on its stream's
 * worker.  An instantiated graph runs as one spin.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "standin.h"

#define MODULE_MAGIC   0x4d4f4455u
#define FUNCTION_MAGIC 0x46554e43u
#define GRAPH_MAGIC    0x47524150u

struct CUmod_st {
    uint32_t magic;
};
struct CUgraph_st {
    uint32_t magic;
};
struct CUgraphExec_st {
    uint32_t magic;
};

enum { KERNEL_ADD_ONE, KERNEL_SPIN };
struct CUfunc_st {
    uint32_t magic;
    int kernel;
    const char *name;
};
static struct CUfunc_st kernels[] = {
    {FUNCTION_MAGIC, KERNEL_ADD_ONE, "add_one"}, /* (int *p, int n): p[i] += 1 for i < n */
    {FUNCTION_MAGIC, KERNEL_SPIN, "spin"},       /* (): just takes time */
};

/* Runs on the stream's worker thread. */
void standin_run_kernel(struct standin_op *op)
{
    const char *name = kernels[op->u.kernel.kernel].name;
    standin_log("@kernel_start", "name=%s via=%s seq=%llu", name, op->u.kernel.via,
                (unsigned long long)op->seq);
    unsigned us = standin_kernel_us();
    if (us > 0)
        usleep(us);
    if (op->u.kernel.kernel == KERNEL_ADD_ONE) {
        int *p = (int *)(uintptr_t)op->u.kernel.ptr;
        for (int i = 0; i < op->u.kernel.count; i++)
            p[i] += 1;
    }
    standin_log("@kernel_done", "name=%s via=%s seq=%llu", name, op->u.kernel.via,
                (unsigned long long)op->seq);
}

/* ---- modules: any image loads; functions are the fake kernels above ---- */
STANDIN_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    CUresult result = standin_require_ctx();
    if (result == CUDA_SUCCESS && (module == NULL || image == NULL))
        result = CUDA_ERROR_INVALID_VALUE;
    CUmodule loaded = NULL;
    if (result == CUDA_SUCCESS && (loaded = calloc(1, sizeof *loaded)) == NULL)
        result = CUDA_ERROR_OUT_OF_MEMORY;
    if (result == CUDA_SUCCESS) {
        loaded->magic = MODULE_MAGIC;
        *module = loaded;
    }
    standin_log("cuModuleLoadData", "module=%p result=%d", (void *)loaded, result);
    return result;
}

STANDIN_EXPORT CUresult cuModuleUnload(CUmodule module)
{
    standin_log("cuModuleUnload", "module=%p", (void *)module);
    if (module == NULL || module->magic != MODULE_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    module->magic = 0;
    free(module);
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuModuleGetFunction(CUfunction *fn, CUmodule module, const char *name)
{
    CUresult result = standin_require_ctx();
    if (result == CUDA_SUCCESS && (fn == NULL || name == NULL))
        result = CUDA_ERROR_INVALID_VALUE;
    if (result == CUDA_SUCCESS && (module == NULL || module->magic != MODULE_MAGIC))
        result = CUDA_ERROR_INVALID_HANDLE;
    if (result == CUDA_SUCCESS) {
        result = CUDA_ERROR_NOT_FOUND;
        for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++) {
            if (strcmp(kernels[i].name, name) == 0) {
                *fn = &kernels[i];
                result = CUDA_SUCCESS;
            }
        }
    }
    standin_log("cuModuleGetFunction", "name=%s result=%d", name != NULL ? name : "(null)", result);
    return result;
}

/* ---- launches ---- */
static CUresult launch(const char *via, CUfunction f, CUstream s, void **params, unsigned grid,
                       unsigned block)
{
    if (f == NULL || f->magic != FUNCTION_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    if (grid == 0 || block == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (f->kernel == KERNEL_SPIN && standin_launch_noop())
        return standin_require_ctx();
    if (standin_launch_us() > 0)
        usleep(standin_launch_us());
    struct standin_op *op = standin_new_op(OP_KERNEL);
    if (op == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    op->u.kernel.kernel = f->kernel;
    op->u.kernel.via = via;
    char detail[96];
    if (f->kernel == KERNEL_ADD_ONE) {
        /* Parameters are read at launch time, as the real driver does. */
        if (params == NULL || params[0] == NULL || params[1] == NULL) {
            free(op);
            return CUDA_ERROR_INVALID_VALUE;
        }
        op->u.kernel.ptr = *(CUdeviceptr *)params[0];
        op->u.kernel.count = *(int *)params[1];
        if (op->u.kernel.count < 0 ||
            standin_device_range(op->u.kernel.ptr, (size_t)op->u.kernel.count * sizeof(int)) ==
                NULL) {
            standin_log(via, "func=add_one ptr=0x%llx n=%d result=%d", op->u.kernel.ptr,
                        op->u.kernel.count, CUDA_ERROR_INVALID_VALUE);
            free(op);
            return CUDA_ERROR_INVALID_VALUE;
        }
        snprintf(detail, sizeof detail, "func=add_one ptr=0x%llx n=%d", op->u.kernel.ptr,
                 op->u.kernel.count);
    } else {
        snprintf(detail, sizeof detail, "func=%s", f->name);
    }
    return standin_submit(via, s, op, detail);
}

STANDIN_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                       unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                       CUstream s, void **params, void **extra)
{
    (void)shared, (void)extra;
    return launch("cuLaunchKernel", f, s, params, gx * gy * gz, bx * by * bz);
}

STANDIN_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                            unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                            CUstream s, void **params, void **extra)
{
    (void)shared, (void)extra;
    return launch("cuLaunchKernel_ptsz", f, s, params, gx * gy * gz, bx * by * bz);
}

static CUresult launch_ex(const char *via, const CUlaunchConfig *c, CUfunction f, void **params)
{
    if (c == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(via, f, c->hStream, params, c->gridDimX * c->gridDimY * c->gridDimZ,
                  c->blockDimX * c->blockDimY * c->blockDimZ);
}

STANDIN_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params,
                                         void **extra)
{
    (void)extra;
    return launch_ex("cuLaunchKernelEx", c, f, params);
}

STANDIN_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params,
                                              void **extra)
{
    (void)extra;
    return launch_ex("cuLaunchKernelEx_ptsz", c, f, params);
}

STANDIN_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy,
                                                  unsigned gz, unsigned bx, unsigned by,
                                                  unsigned bz, unsigned shared, CUstream s,
                                                  void **params)
{
    (void)shared;
    return launch("cuLaunchCooperativeKernel", f, s, params, gx * gy * gz, bx * by * bz);
}

STANDIN_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy,
                                                       unsigned gz, unsigned bx, unsigned by,
                                                       unsigned bz, unsigned shared, CUstream s,
                                                       void **params)
{
    (void)shared;
    return launch("cuLaunchCooperativeKernel_ptsz", f, s, params, gx * gy * gz, bx * by * bz);
}

/* ---- graphs: an instantiated graph runs as one "spin" kernel ---- */
STANDIN_EXPORT CUresult cuGraphCreate(CUgraph *graph, unsigned int flags)
{
    standin_log("cuGraphCreate", "flags=%u", flags);
    if (graph == NULL || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if ((*graph = calloc(1, sizeof **graph)) == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    (*graph)->magic = GRAPH_MAGIC;
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuGraphDestroy(CUgraph graph)
{
    standin_log("cuGraphDestroy", "graph=%p", (void *)graph);
    if (graph == NULL || graph->magic != GRAPH_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    graph->magic = 0;
    free(graph);
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph,
                                                    unsigned long long flags)
{
    standin_log("cuGraphInstantiateWithFlags", "graph=%p flags=%llu", (void *)graph, flags);
    if (exec == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (graph == NULL || graph->magic != GRAPH_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    if ((*exec = calloc(1, sizeof **exec)) == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    (*exec)->magic = GRAPH_MAGIC;
    return CUDA_SUCCESS;
}

STANDIN_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec)
{
    standin_log("cuGraphExecDestroy", "exec=%p", (void *)exec);
    if (exec == NULL || exec->magic != GRAPH_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    exec->magic = 0;
    free(exec);
    return CUDA_SUCCESS;
}

static CUresult graph_launch(const char *via, CUgraphExec exec, CUstream s)
{
    if (exec == NULL || exec->magic != GRAPH_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    return launch(via, &kernels[KERNEL_SPIN], s, NULL, 1, 1);
}

STANDIN_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream s)
{
    return graph_launch("cuGraphLaunch", exec, s);
}
STANDIN_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream s)
{
    return graph_launch("cuGraphLaunch_ptsz", exec, s);
}
