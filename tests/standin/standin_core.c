/*
 * Stand-in driver: configuration, the call log, fork handling, initialisation
 * and error strings.  A test fixture, never the product.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "standin.h"

pthread_mutex_t standin_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t standin_progress = PTHREAD_COND_INITIALIZER;

static int initialised;
static int device_count = 1;
static size_t total_mem = 16ull << 30;
static unsigned kernel_us;
static int launch_noop;
static unsigned launch_us;
static unsigned prefetch_us;
static unsigned ctx_destroy_us;
static int log_fd = -1;
static pthread_once_t config_once = PTHREAD_ONCE_INIT;

static unsigned long long env_number(const char *name, unsigned long long fallback)
{
    const char *text = getenv(name);
    if (text == NULL || *text == '\0')
        return fallback;
    char *end;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 0);
    if (errno != 0 || *end != '\0') {
        fprintf(stderr, "standin: ignoring bad %s=%s\n", name, text);
        return fallback;
    }
    return value;
}

/* Runs inside the first driver call: must leave the caller's errno alone. */
static void read_config(void)
{
    int saved_errno = errno;
    device_count = (int)env_number("STANDIN_DEVICE_COUNT", 1);
    if (device_count < 0 || device_count > 16)
        device_count = 1;
    total_mem = (size_t)env_number("STANDIN_TOTAL_MEM", 16ull << 30);
    kernel_us = (unsigned)env_number("STANDIN_KERNEL_US", 0);
    prefetch_us = (unsigned)env_number("STANDIN_PREFETCH_US", 0);
    ctx_destroy_us = (unsigned)env_number("STANDIN_CTX_DESTROY_US", 0);
    launch_noop = env_number("STANDIN_LAUNCH_NOOP", 0) != 0;
    launch_us = (unsigned)env_number("STANDIN_LAUNCH_US", 0);
    const char *path = getenv("STANDIN_LOG");
    if (path != NULL && *path != '\0')
        log_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    errno = saved_errno;
}

static void configure(void)
{
    pthread_once(&config_once, read_config);
}

int standin_initialised(void)
{
    return __atomic_load_n(&initialised, __ATOMIC_ACQUIRE);
}
int standin_device_count(void)
{
    configure();
    return device_count;
}
size_t standin_total_mem(void)
{
    configure();
    return total_mem;
}
unsigned standin_kernel_us(void)
{
    configure();
    return kernel_us;
}
int standin_launch_noop(void)
{
    configure();
    return launch_noop;
}
unsigned standin_launch_us(void)
{
    configure();
    return launch_us;
}
unsigned standin_prefetch_us(void)
{
    configure();
    return prefetch_us;
}
unsigned standin_ctx_destroy_us(void)
{
    configure();
    return ctx_destroy_us;
}

void standin_log(const char *function, const char *fmt, ...)
{
    configure();
    if (log_fd < 0)
        return;
    int saved_errno = errno;
    char line[512];
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    int used =
        snprintf(line, sizeof line, "%d %ld %s t=%lld.%06ld", (int)getpid(),
                 (long)syscall(SYS_gettid), function, (long long)now.tv_sec, now.tv_nsec / 1000);
    if (fmt != NULL && *fmt != '\0' && used < (int)sizeof line - 2) {
        line[used++] = ' ';
        va_list args;
        va_start(args, fmt);
        int more = vsnprintf(line + used, sizeof line - (size_t)used - 1, fmt, args);
        va_end(args);
        used += more < 0 ? 0 : more;
    }
    if (used > (int)sizeof line - 2)
        used = (int)sizeof line - 2;
    line[used++] = '\n';
    /* One write() of an O_APPEND fd: lines of concurrent processes never mix. */
    ssize_t ignored = write(log_fd, line, (size_t)used);
    (void)ignored;
    errno = saved_errno;
}

/* ---- fork: the child gets a fresh set of worker threads ---- */
static void before_fork(void)
{
    pthread_mutex_lock(&standin_lock);
}
static void after_fork_parent(void)
{
    pthread_mutex_unlock(&standin_lock);
}
static void after_fork_child(void)
{
    pthread_mutex_init(&standin_lock, NULL);
    pthread_cond_init(&standin_progress, NULL);
    standin_streams_after_fork_child();
    standin_capture_after_fork_child();
}

__attribute__((constructor)) static void register_fork_handlers(void)
{
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* ---- initialisation, version, errors ---- */
STANDIN_EXPORT CUresult cuInit(unsigned int flags)
{
    configure();
    CUresult result = flags != 0          ? CUDA_ERROR_INVALID_VALUE
                      : device_count == 0 ? CUDA_ERROR_NO_DEVICE
                                          : CUDA_SUCCESS;
    if (result == CUDA_SUCCESS)
        __atomic_store_n(&initialised, 1, __ATOMIC_RELEASE);
    standin_log("cuInit", "flags=%u result=%d", flags, result);
    return result;
}

STANDIN_EXPORT CUresult cuDriverGetVersion(int *version)
{
    standin_log("cuDriverGetVersion", NULL);
    if (version == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *version = 13000;
    return CUDA_SUCCESS;
}

static const struct {
    CUresult code;
    const char *name, *text;
} error_table[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult lookup_error(CUresult error, const char **text, int want_name)
{
    if (text == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof error_table / sizeof error_table[0]; i++) {
        if (error_table[i].code == error) {
            *text = want_name ? error_table[i].name : error_table[i].text;
            return CUDA_SUCCESS;
        }
    }
    *text = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

STANDIN_EXPORT CUresult cuGetErrorString(CUresult error, const char **text)
{
    standin_log("cuGetErrorString", "error=%d", error);
    return lookup_error(error, text, 0);
}

STANDIN_EXPORT CUresult cuGetErrorName(CUresult error, const char **text)
{
    standin_log("cuGetErrorName", "error=%d", error);
    return lookup_error(error, text, 1);
}
