#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"

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

void nvshare_debug(const char *fmt, ...)
{
    if (!nvshare_config()->debug)
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
