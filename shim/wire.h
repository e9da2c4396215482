/* Frames of nvshare_protocol.h on a stream socket: sending one, and cutting
 * received bytes into frames.  No state beyond the inbox the caller owns. */
#ifndef NVSHARE_WIRE_H
#define NVSHARE_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "nvshare_protocol.h"

#define NVSHARE_INBOX_FDS 8

struct nvshare_inbox {
    size_t used;
    unsigned char bytes[sizeof(struct nvshare_header) + NVSHARE_MAX_PAYLOAD_BYTES];
    /* Descriptors that came with the bytes (SCM_RIGHTS: a FAIR_SLOT's page), oldest first. */
    int fds[NVSHARE_INBOX_FDS];
    int fd_count;
};

/* 0 when the whole frame went out (MSG_NOSIGNAL: a closed peer is an error,
 * not a SIGPIPE), -1 otherwise. */
int nvshare_wire_send(int fd, uint16_t type, const void *payload, uint32_t bytes);

/* Appends what the socket has without blocking, and the descriptors sent with it
 * (close-on-exec; past NVSHARE_INBOX_FDS they are closed): 1 read (or nothing yet),
 * 0 peer closed, -1 error (errno says). */
int nvshare_wire_receive(int fd, struct nvshare_inbox *inbox);

/* The oldest descriptor received and not yet taken (the caller closes it), or -1. */
int nvshare_wire_take_fd(struct nvshare_inbox *inbox);

/* Empties the inbox, closing the descriptors no frame took. */
void nvshare_wire_clear(struct nvshare_inbox *inbox);

/* Takes the next complete frame out of the inbox: 1 taken, 0 incomplete,
 * -1 not a frame of this protocol version (header says what came). */
int nvshare_wire_next_frame(struct nvshare_inbox *inbox, struct nvshare_header *header,
                            unsigned char payload[NVSHARE_MAX_PAYLOAD_BYTES]);

#endif
