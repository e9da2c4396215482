#define _GNU_SOURCE
#include "wire.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

int nvshare_wire_send(int fd, uint16_t type, const void *payload, uint32_t bytes)
{
    if (fd < 0 || bytes > NVSHARE_MAX_PAYLOAD_BYTES)
        return -1;
    unsigned char frame[sizeof(struct nvshare_header) + NVSHARE_MAX_PAYLOAD_BYTES];
    struct nvshare_header header = {
        .magic = NVSHARE_MAGIC,
        .version = NVSHARE_PROTOCOL_VERSION,
        .type = type,
        .payload_bytes = bytes,
    };
    memcpy(frame, &header, sizeof header);
    memcpy(frame + sizeof header, payload, bytes);
    size_t total = sizeof header + bytes, sent = 0;
    while (sent < total) {
        ssize_t wrote = send(fd, frame + sent, total - sent, MSG_NOSIGNAL);
        if (wrote < 0 && errno == EINTR)
            continue;
        if (wrote <= 0)
            return -1;
        sent += (size_t)wrote;
    }
    return 0;
}

int nvshare_wire_receive(int fd, struct nvshare_inbox *inbox)
{
    struct iovec space = {.iov_base = inbox->bytes + inbox->used,
                          .iov_len = sizeof inbox->bytes - inbox->used};
    union {
        struct cmsghdr align;
        char bytes[CMSG_SPACE(sizeof(int) * NVSHARE_INBOX_FDS)];
    } control;
    struct msghdr message = {.msg_iov = &space,
                             .msg_iovlen = 1,
                             .msg_control = control.bytes,
                             .msg_controllen = sizeof control.bytes};
    ssize_t got = recvmsg(fd, &message, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (got == 0)
        return 0;
    if (got < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 1 : -1;
    inbox->used += (size_t)got;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&message); c != NULL; c = CMSG_NXTHDR(&message, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; i++) {
            int received;
            memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof received);
            if (inbox->fd_count < NVSHARE_INBOX_FDS)
                inbox->fds[inbox->fd_count++] = received;
            else
                close(received);
        }
    }
    return 1;
}

int nvshare_wire_take_fd(struct nvshare_inbox *inbox)
{
    if (inbox->fd_count == 0)
        return -1;
    int fd = inbox->fds[0];
    inbox->fd_count--;
    memmove(inbox->fds, inbox->fds + 1, (size_t)inbox->fd_count * sizeof(int));
    return fd;
}

void nvshare_wire_clear(struct nvshare_inbox *inbox)
{
    for (int i = 0; i < inbox->fd_count; i++)
        close(inbox->fds[i]);
    inbox->fd_count = 0;
    inbox->used = 0;
}

int nvshare_wire_next_frame(struct nvshare_inbox *inbox, struct nvshare_header *header,
                            unsigned char payload[NVSHARE_MAX_PAYLOAD_BYTES])
{
    if (inbox->used < sizeof *header)
        return 0;
    memcpy(header, inbox->bytes, sizeof *header);
    if (header->magic != NVSHARE_MAGIC || header->version != NVSHARE_PROTOCOL_VERSION ||
        header->payload_bytes > NVSHARE_MAX_PAYLOAD_BYTES)
        return -1;
    size_t frame = sizeof *header + header->payload_bytes;
    if (inbox->used < frame)
        return 0;
    memcpy(payload, inbox->bytes + sizeof *header, header->payload_bytes);
    inbox->used -= frame;
    memmove(inbox->bytes, inbox->bytes + frame, inbox->used);
    return 1;
}
