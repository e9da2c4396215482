/* Diagnostics on stderr, every line prefixed "[nvshare] ". */
#ifndef NVSHARE_LOG_H
#define NVSHARE_LOG_H

#include <stdatomic.h>

#define NVSHARE_PRINTF(a, b) __attribute__((format(printf, a, b)))

/* NVSHARE_DEBUG=1 (read once, at the first call; a bad value warns once). */
int nvshare_debug_enabled(void);
/* Debug lines appear only with NVSHARE_DEBUG=1. */
void nvshare_debug(const char *fmt, ...) NVSHARE_PRINTF(1, 2);
/* "[nvshare] warning: ..." lines always appear. */
void nvshare_warn(const char *fmt, ...) NVSHARE_PRINTF(1, 2);

/* Each call site warns at most once per process. */
#define NVSHARE_WARN_ONCE(...)                          \
    do {                                                \
        static atomic_int nvshare_warned_here_;         \
        if (!atomic_exchange(&nvshare_warned_here_, 1)) \
            nvshare_warn(__VA_ARGS__);                  \
    } while (0)

/* Monotonic milliseconds, for timings in logs and for idle detection. */
double nvshare_now_ms(void);

#endif
