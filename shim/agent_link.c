/*
 * The lock client's connection to the agent: the UNIX socket, HELLO, frames
 * of nvshare_protocol.h in and out, and when to try again.  Used by the
 * client thread only (lock_client.c), which decides what to send, what the
 * frames mean and when an agent is lost.
 *
 * After losing an agent that had answered, the next try is at once (under
 * systemd the socket outlives the agent: the connect waits in its backlog for
 * the new one), then after 50 ms, doubling up to 1 s.  Meanwhile the socket's
 * directory is watched (inotify), so a socket created anew (the agent with
 * --socket removes and re-creates it) is tried within milliseconds of
 * appearing; where inotify is not to be had, the backoff alone.  No try is
 * made sooner than that: nothing spins while the agent is away.
 */
#define _GNU_SOURCE
#include "agent_link.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "config.h"
#include "devices.h"
#include "log.h"
#include "wire.h"

#define SEND_TIMEOUT_S      2
#define RECONNECT_FIRST_MS  50.0
#define RECONNECT_MAX_MS    1000.0
#define REAPPEARED_FIRST_MS 5.0 /* the socket appeared: bound, and listening a moment later */

static int socket_fd = -1;
static struct nvshare_inbox inbox;

static double retry_at_ms;
/* The wait before the next try, should this one fail; 0: at once. */
static double backoff_ms = RECONNECT_FIRST_MS;
/* inotify on the socket's directory while no agent has answered; -1: none. */
static int watch_fd = -1;

int nvshare_link_connect(void)
{
    const char *path = nvshare_config()->socket_path;
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    strcpy(address.sun_path, path);
    /* Non-blocking for the connect only: with the agent's backlog full (nobody
     * accepts: the agent stopped, or a socket unit whose service cannot start)
     * a blocking connect would wait for good; this one fails with EAGAIN and
     * is tried again later.  A connect that goes into the backlog succeeds at
     * once, and the agent's silence is the client thread's to notice. */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&address, sizeof address) != 0 ||
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
        int why = errno;
        if (fd >= 0)
            close(fd);
        return why;
    }
    struct timeval send_timeout = {.tv_sec = SEND_TIMEOUT_S};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);
    socket_fd = fd;
    nvshare_wire_clear(&inbox);
    return 0;
}

int nvshare_link_hello(void)
{
    /* The additions this shim honours: WHEN_IDLE drops and RELEASE_WHEN_IDLE
     * grants (lock_machine.c), KEEPALIVE frames while it waits (lock_client.c), its GPU
     * time (usage_meter.c), memory caps (memory.c) and fair pages (fair_share.c). */
    struct nvshare_hello hello = {.gpu_count = (uint32_t)nvshare_gpu_count(),
                                  .features = NVSHARE_FEATURE_YIELD | NVSHARE_FEATURE_KEEPALIVE |
                                              NVSHARE_FEATURE_USAGE | NVSHARE_FEATURE_MEMORY_CAP |
                                              NVSHARE_FEATURE_FAIR};
    for (int gpu = 0; gpu < nvshare_gpu_count(); gpu++)
        hello.gpus[gpu] = *nvshare_gpu_uuid(gpu);
    /* The program's name (argv[0]'s base name), not this thread's. */
    strncpy(hello.command, program_invocation_short_name, sizeof hello.command - 1);
    return nvshare_link_send(NVSHARE_MSG_HELLO, &hello, sizeof hello);
}

int nvshare_link_up(void)
{
    return socket_fd >= 0;
}

int nvshare_link_fd(void)
{
    return socket_fd;
}

void nvshare_link_close(void)
{
    if (socket_fd >= 0)
        close(socket_fd);
    socket_fd = -1;
    nvshare_wire_clear(&inbox);
}

int nvshare_link_send(uint16_t type, const void *payload, uint32_t bytes)
{
    return nvshare_wire_send(socket_fd, type, payload, bytes);
}

int nvshare_link_send_lock(uint16_t type, int gpu, uint64_t lease, uint32_t idle_ms)
{
    struct nvshare_lock_message message = {
        .gpu = *nvshare_gpu_uuid(gpu), .lease = lease, .idle_ms = idle_ms};
    return nvshare_link_send(type, &message, sizeof message);
}

int nvshare_link_receive(void)
{
    return nvshare_wire_receive(socket_fd, &inbox);
}

int nvshare_link_take_fd(void)
{
    return nvshare_wire_take_fd(&inbox);
}

int nvshare_link_next_frame(struct nvshare_header *header,
                            unsigned char payload[NVSHARE_MAX_PAYLOAD_BYTES])
{
    return nvshare_wire_next_frame(&inbox, header, payload);
}

/* ---- when to try again ------------------------------------------------------------------- */

/* The socket's directory, watched for the socket's name: created, moved in,
 * or its attributes changed (a socket unit or the agent sets its mode). */
static void watch_socket_directory(void)
{
    if (watch_fd >= 0)
        return;
    char directory[sizeof nvshare_config()->socket_path];
    strcpy(directory, nvshare_config()->socket_path);
    char *slash = strrchr(directory, '/');
    if (slash == NULL)
        strcpy(directory, ".");
    else if (slash == directory)
        slash[1] = '\0';
    else
        *slash = '\0';
    int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd >= 0 && inotify_add_watch(fd, directory, IN_CREATE | IN_MOVED_TO | IN_ATTRIB) < 0) {
        nvshare_debug("cannot watch %s (%s): reconnecting by backoff alone", directory,
                      strerror(errno));
        close(fd);
        fd = -1;
    }
    watch_fd = fd;
}

static void stop_watching(void)
{
    if (watch_fd >= 0)
        close(watch_fd);
    watch_fd = -1;
}

/* Reads what the watch saw: 1 when the socket (re)appeared. */
static int socket_reappeared(void)
{
    const char *path = nvshare_config()->socket_path;
    const char *name = strrchr(path, '/') != NULL ? strrchr(path, '/') + 1 : path;
    char events[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    int seen = 0;
    ssize_t got;
    while ((got = read(watch_fd, events, sizeof events)) > 0) {
        for (char *at = events; at < events + got;) {
            const struct inotify_event *event = (const struct inotify_event *)(void *)at;
            if ((event->mask & IN_Q_OVERFLOW) || (event->len > 0 && strcmp(event->name, name) == 0))
                seen = 1;
            at += sizeof *event + event->len;
        }
    }
    return seen;
}

void nvshare_link_retry_later(void)
{
    watch_socket_directory();
    retry_at_ms = nvshare_now_ms() + backoff_ms;
    backoff_ms = backoff_ms == 0                     ? RECONNECT_FIRST_MS
                 : 2 * backoff_ms > RECONNECT_MAX_MS ? RECONNECT_MAX_MS
                                                     : 2 * backoff_ms;
}

void nvshare_link_answered(void)
{
    backoff_ms = 0; /* this one is alive: should it go, try again at once */
    stop_watching();
}

void nvshare_link_slow_down(void)
{
    backoff_ms = RECONNECT_MAX_MS; /* each try leaves a connection in a silent agent's backlog */
}

double nvshare_link_retry_at_ms(void)
{
    return retry_at_ms;
}

int nvshare_link_watch_fd(void)
{
    return watch_fd;
}

void nvshare_link_read_watch(void)
{
    if (socket_reappeared()) {
        retry_at_ms = nvshare_now_ms(); /* now, and soon after: it listens a moment later */
        backoff_ms = REAPPEARED_FIRST_MS;
    }
}

void nvshare_link_forget_after_fork(void)
{
    nvshare_link_close();
    stop_watching();
    backoff_ms = RECONNECT_FIRST_MS;
}
