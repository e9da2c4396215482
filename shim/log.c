#define _GNU_SOURCE
#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* NVSHARE_DEBUG is read here, not in config.c: logging sits below everything
 * else, configuration included (config.c warns through it), and a copy of the
 * shim that never starts a client (a second copy in the process, interpose.c)
 * still logs.  Read at the first debug line, never at load time. */
static int debug_enabled;
static pthread_once_t debug_once = PTHREAD_ONCE_INIT;

/* One write(2) per line so lines of several threads and processes do not
 * interleave, and no stdio: stderr's FILE lock and buffer belong to the
 * application.  write(2) is a cancellation point, and the shim logs while it
 * holds its mutexes: a thread cancelled there would leave them locked, so
 * cancellation waits for the thread's next cancellation point of its own. */
static void write_line(const char *prefix, const char *fmt, va_list args)
{
    int saved_errno = errno, cancel_state;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel_state);
    char line[768];
    int used = snprintf(line, sizeof line, "[nvshare] %s", prefix);
    /* The analyser cannot see that every caller has called va_start. */
    int wrote = vsnprintf(line + used, sizeof line - (size_t)used - 1, fmt, /* NOLINT */ args);
    if (wrote < 0)
        wrote = 0;
    size_t length = (size_t)used + (size_t)wrote;
    if (length > sizeof line - 2)
        length = sizeof line - 2;
    line[length++] = '\n';
    ssize_t ignored = write(STDERR_FILENO, line, length);
    (void)ignored;
    pthread_setcancelstate(cancel_state, NULL);
    errno = saved_errno;
}

static void read_debug(void)
{
    int saved_errno = errno;
    const char *text = secure_getenv("NVSHARE_DEBUG");
    if (text != NULL && strcmp(text, "1") == 0)
        debug_enabled = 1;
    else if (text != NULL && *text != '\0' && strcmp(text, "0") != 0)
        nvshare_warn("NVSHARE_DEBUG=%.40s is not 0 or 1; using 0", text);
    errno = saved_errno;
}

int nvshare_debug_enabled(void)
{
    pthread_once(&debug_once, read_debug);
    return debug_enabled;
}

void nvshare_debug(const char *fmt, ...)
{
    if (!nvshare_debug_enabled())
        return;
    va_list args;
    va_start(args, fmt);
    write_line("", fmt, args);
    va_end(args);
}

void nvshare_warn(const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    write_line("warning: ", fmt, args);
    va_end(args);
}

double nvshare_now_ms(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec * 1e3 + (double)now.tv_nsec / 1e6;
}
