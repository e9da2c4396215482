#include "wire.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>

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
    ssize_t got =
        recv(fd, inbox->bytes + inbox->used, sizeof inbox->bytes - inbox->used, MSG_DONTWAIT);
    if (got == 0)
        return 0;
    if (got < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 1 : -1;
    inbox->used += (size_t)got;
    return 1;
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
