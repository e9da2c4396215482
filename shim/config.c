#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

#include "nvshare_protocol.h"

#define DEFAULT_MAX_QUEUED_MS 50

static struct nvshare_config config;
static pthread_once_t config_once = PTHREAD_ONCE_INIT;

/* A flag variable: unset or "0"/"1".  Anything else warns and keeps the default. */
static int read_flag(const char *name, int fallback)
{
    const char *text = secure_getenv(name);
    if (text == NULL || *text == '\0')
        return fallback;
    if (strcmp(text, "0") == 0)
        return 0;
    if (strcmp(text, "1") == 0)
        return 1;
    nvshare_warn("%s=%.40s is not 0 or 1; using %d", name, text, fallback);
    return fallback;
}

static unsigned read_count(const char *name, unsigned fallback, unsigned largest)
{
    const char *text = secure_getenv(name);
    if (text == NULL || *text == '\0')
        return fallback;
    /* Digits by hand, not strtoul: built against glibc 2.38 or later headers, strtoul
     * becomes __isoc23_strtoul and the shim would need that glibc (glibc_baseline.h). */
    unsigned long value = 0;
    const char *digit = text;
    for (; *digit >= '0' && *digit <= '9' && value <= largest; digit++)
        value = value * 10 + (unsigned long)(*digit - '0');
    if (*digit != '\0' || value > largest) {
        nvshare_warn("%s=%.40s is not a whole number 0..%u; using %u", name, text, largest,
                     fallback);
        return fallback;
    }
    return (unsigned)value;
}

/* Bytes with an optional K, M, G or T suffix (powers of 1024), as the agent's sizes;
 * anything else warns and means no cap. */
static uint64_t read_size(const char *name)
{
    const char *text = secure_getenv(name);
    if (text == NULL || *text == '\0')
        return 0;
    uint64_t value = 0;
    const char *digit = text;
    for (; *digit >= '0' && *digit <= '9' && value <= UINT64_MAX / 10 - 9; digit++)
        value = value * 10 + (uint64_t)(*digit - '0');
    int no_digits = digit == text;
    static const char suffixes[] = "KMGT";
    const char *suffix = *digit != '\0' ? strchr(suffixes, *digit) : NULL;
    int shift = suffix != NULL ? 10 * (int)(suffix - suffixes + 1) : 0;
    if (suffix != NULL)
        digit++;
    if (no_digits || *digit != '\0' || value > (UINT64_MAX >> shift)) {
        nvshare_warn("%s=%.40s is not a size (bytes, or with K, M, G or T); no cap", name, text);
        return 0;
    }
    return value << shift;
}

static void load(void)
{
    int saved_errno = errno;
    config.debug = nvshare_debug_enabled(); /* log.c reads NVSHARE_DEBUG */
    const char *socket_path = secure_getenv("NVSHARE_SOCKET");
    if (socket_path == NULL || *socket_path == '\0')
        socket_path = NVSHARE_DEFAULT_SOCKET_PATH;
    if (strlen(socket_path) >= sizeof config.socket_path) {
        nvshare_warn("NVSHARE_SOCKET is longer than %zu bytes; using %s",
                     sizeof config.socket_path - 1, NVSHARE_DEFAULT_SOCKET_PATH);
        socket_path = NVSHARE_DEFAULT_SOCKET_PATH;
    }
    strcpy(config.socket_path, socket_path);
    config.prefetch = read_flag("NVSHARE_PREFETCH", 1);
    config.prefetch_after_ms = read_count("NVSHARE_PREFETCH_AFTER_MS", 1000, 3600000);
    config.single_oversub = read_flag("NVSHARE_ENABLE_SINGLE_OVERSUB", 0);
    config.max_queued_ms = read_count("NVSHARE_MAX_QUEUED_MS", DEFAULT_MAX_QUEUED_MS, 3600000);
    config.memory_cap_bytes = read_size("NVSHARE_MEMORY_CAP");
    errno = saved_errno;
}

const struct nvshare_config *nvshare_config(void)
{
    pthread_once(&config_once, load);
    return &config;
}
