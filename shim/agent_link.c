/*
 * The lock client's connection to the agent: the UNIX socket, HELLO, and
 * frames of nvshare_protocol.h in and out.  Used by the client thread only
 * (lock_client.c), which decides what to send and what the frames mean.
 */
#define _GNU_SOURCE
#include "agent_link.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "config.h"
#include "devices.h"
#include "wire.h"

#define SEND_TIMEOUT_S 2

static int socket_fd = -1;
static struct nvshare_inbox inbox;

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
    inbox.used = 0;
    return 0;
}

int nvshare_link_hello(void)
{
    /* The additions this shim honours: WHEN_IDLE drops and RELEASE_WHEN_IDLE
     * grants (lock_machine.c), and KEEPALIVE frames while it waits (lock_client.c). */
    struct nvshare_hello hello = {.gpu_count = (uint32_t)nvshare_gpu_count(),
                                  .features = NVSHARE_FEATURE_YIELD | NVSHARE_FEATURE_KEEPALIVE};
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
    inbox.used = 0;
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

int nvshare_link_next_frame(struct nvshare_header *header,
                            unsigned char payload[NVSHARE_MAX_PAYLOAD_BYTES])
{
    return nvshare_wire_next_frame(&inbox, header, payload);
}

void nvshare_link_forget_after_fork(void)
{
    nvshare_link_close();
}
