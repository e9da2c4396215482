/*
 * The lock client's link to the agent: frames on the socket, connecting
 * (HELLO), and falling back to running unscheduled when the agent is not
 * there or goes away.  Used by the client thread only (lock_client.c).
 */
#define _GNU_SOURCE
#include "agent_link.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "config.h"
#include "devices.h"
#include "gate.h"
#include "lock_state.h"
#include "log.h"
#include "memory_accounting.h"
#include "wire.h"

#define RECONNECT_INTERVAL_MS 1000.0
#define SEND_TIMEOUT_S        2

/* The one instance, by a short name. */
#define client nvshare_lock_client

/* ---- frames ------------------------------------------------------------------------------ */

int nvshare_send_frame(uint16_t type, const void *payload, uint32_t bytes)
{
    return nvshare_wire_send(client.socket_fd, type, payload, bytes);
}

int nvshare_send_lock_message(uint16_t type, int gpu, uint64_t lease)
{
    struct nvshare_lock_message message = {.gpu = *nvshare_gpu_uuid(gpu), .lease = lease};
    return nvshare_send_frame(type, &message, sizeof message);
}

/* ---- connection -------------------------------------------------------------------------- */

void nvshare_set_all_gates(int open)
{
    for (int gpu = 0; gpu < NVSHARE_MAX_GPUS; gpu++)
        atomic_store(&nvshare_gates[gpu].open, open);
}

static void run_unscheduled(const char *why)
{
    if (client.socket_fd >= 0)
        close(client.socket_fd);
    pthread_mutex_lock(&client.mutex);
    client.socket_fd = -1;
    client.inbox.used = 0;
    client.have_settings = 0;
    memset(client.locks, 0, sizeof client.locks);
    nvshare_set_all_gates(1);
    pthread_cond_broadcast(&client.changed);
    pthread_mutex_unlock(&client.mutex);
    client.retry_at_ms = nvshare_now_ms() + RECONNECT_INTERVAL_MS;
    nvshare_debug("running unscheduled: %s", why);
}

void nvshare_lose_agent(const char *why)
{
    NVSHARE_WARN_ONCE("lost the nvshare agent (%s): running unscheduled, reconnecting in "
                      "the background",
                      why);
    run_unscheduled(why);
}

void nvshare_connect_to_agent(int first_attempt)
{
    const char *path = nvshare_config()->socket_path;
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    strcpy(address.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&address, sizeof address) != 0) {
        int why = errno;
        if (fd >= 0)
            close(fd);
        if (first_attempt) {
            NVSHARE_WARN_ONCE("cannot reach the nvshare agent at %s (%s): running unscheduled, "
                              "retrying in the background",
                              path, strerror(why));
            run_unscheduled("no agent");
        }
        client.retry_at_ms = nvshare_now_ms() + RECONNECT_INTERVAL_MS;
        return;
    }
    struct timeval send_timeout = {.tv_sec = SEND_TIMEOUT_S};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);

    struct nvshare_hello hello = {.gpu_count = (uint32_t)nvshare_gpu_count()};
    for (int gpu = 0; gpu < nvshare_gpu_count(); gpu++)
        hello.gpus[gpu] = *nvshare_gpu_uuid(gpu);
    /* The program's name (argv[0]'s base name), not this thread's. */
    strncpy(hello.command, program_invocation_short_name, sizeof hello.command - 1);

    pthread_mutex_lock(&client.mutex);
    client.socket_fd = fd;
    client.inbox.used = 0;
    /* Scheduled from now on: the next GPU call of each GPU asks for its lock.
     * Threads already waiting (before the first connection) keep their place. */
    for (int gpu = 0; gpu < NVSHARE_MAX_GPUS; gpu++) {
        if (client.locks[gpu].state != LOCK_WANTED)
            memset(&client.locks[gpu], 0, sizeof client.locks[gpu]);
    }
    nvshare_set_all_gates(0);
    pthread_cond_broadcast(&client.changed);
    pthread_mutex_unlock(&client.mutex);

    if (nvshare_send_frame(NVSHARE_MSG_HELLO, &hello, sizeof hello) != 0) {
        nvshare_lose_agent("hello not sent");
        return;
    }
    nvshare_memory_mark_all_changed();
    nvshare_debug("connected to the agent at %s (%d GPUs)", path, nvshare_gpu_count());
}
