/* Frames of nvshare_protocol.h on a stream socket: sending one, and cutting
 * received bytes into frames.  No state beyond the inbox the caller owns. */
#ifndef NVSHARE_WIRE_H
#define NVSHARE_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "nvshare_protocol.h"

struct nvshare_inbox {
    size_t used;
    unsigned char bytes[sizeof(struct nvshare_header) + NVSHARE_MAX_PAYLOAD_BYTES];
};

/* 0 when the whole frame went out (MSG_NOSIGNAL: a closed peer is an error,
 * not a SIGPIPE), -1 otherwise. */
int nvshare_wire_send(int fd, uint16_t type, const void *payload, uint32_t bytes);

/* Appends what the socket has without blocking: 1 read (or nothing yet),
 * 0 peer closed, -1 error (errno says). */
int nvshare_wire_receive(int fd, struct nvshare_inbox *inbox);

/* Takes the next complete frame out of the inbox: 1 taken, 0 incomplete,
 * -1 not a frame of this protocol version (header says what came). */
int nvshare_wire_next_frame(struct nvshare_inbox *inbox, struct nvshare_header *header,
                            unsigned char payload[NVSHARE_MAX_PAYLOAD_BYTES]);

#endif
