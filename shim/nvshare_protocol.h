/*
 * nvshare wire protocol: the one definition of the frames that libnvshare.so
 * (the shim) and nvshare-agent exchange over the UNIX stream socket
 * /run/nvshare/scheduler.sock.  docs/protocol.md explains when each is sent.
 *
 * The agent does not re-declare this layout: it feeds the text between the
 * BEGIN/END markers below to cffi's ffi.cdef().  So that part may hold only
 * what cdef accepts: integer #defines, enums, and structs of fixed-width
 * integers and char arrays.  Every field is naturally aligned, so C and cffi
 * agree on the layout with no packing pragmas.
 *
 * Both peers live on one host, so integers travel in native byte order.
 * A frame is a header followed by exactly header.payload_bytes of payload,
 * whose layout is fixed by header.type.
 */
#ifndef NVSHARE_PROTOCOL_H
#define NVSHARE_PROTOCOL_H

#include <stdint.h>

/* BEGIN NVSHARE WIRE FORMAT */
#define NVSHARE_MAGIC             0x4853564e /* the bytes "NVSH" on a little-endian host */
#define NVSHARE_PROTOCOL_VERSION  1
#define NVSHARE_MAX_GPUS          16
#define NVSHARE_UUID_BYTES        16 /* CUuuid / NVML UUID, raw bytes */
#define NVSHARE_COMMAND_BYTES     32
#define NVSHARE_ERROR_TEXT_BYTES  128
#define NVSHARE_MAX_PAYLOAD_BYTES 512 /* larger frames are a protocol error */

enum nvshare_message_type {
    NVSHARE_MSG_HELLO = 1,        /* shim -> agent: first frame on a connection */
    NVSHARE_MSG_SETTINGS = 2,     /* agent -> shim: after HELLO and on every change */
    NVSHARE_MSG_LOCK_REQUEST = 3, /* shim -> agent: wants to run on a GPU */
    NVSHARE_MSG_LOCK_GRANT =
        4, /* agent -> shim: may run (exclusive, or shared when anti-thrash is off) */
    NVSHARE_MSG_DROP_REQUEST =
        5, /* agent -> shim: quantum over, finish in-flight work and release */
    NVSHARE_MSG_RELEASED =
        6, /* shim -> agent: stopped using the GPU (idle, or after a drop request) */
    NVSHARE_MSG_REVOKED = 7, /* agent -> shim: lock taken away after ignoring a drop request */
    NVSHARE_MSG_MEMORY_REPORT = 8, /* shim -> agent: bytes allocated on a GPU */
    NVSHARE_MSG_ERROR = 9          /* agent -> shim: the agent closes the connection after it */
};

enum nvshare_grant_flags {
    NVSHARE_GRANT_EXCLUSIVE = 1, /* anti-thrash on: this process alone holds the GPU */
    NVSHARE_GRANT_SHARED = 2     /* anti-thrash off: run freely beside others */
};

enum nvshare_error_code {
    NVSHARE_ERR_BAD_MAGIC = 1,
    NVSHARE_ERR_VERSION_MISMATCH = 2,
    NVSHARE_ERR_BAD_FRAME = 3, /* unknown type, wrong size, malformed payload */
    NVSHARE_ERR_PROTOCOL = 4,  /* a valid frame at the wrong time */
    NVSHARE_ERR_FLOOD = 5      /* too many frames too fast */
};

struct nvshare_header {
    uint32_t magic;         /* NVSHARE_MAGIC */
    uint16_t version;       /* NVSHARE_PROTOCOL_VERSION */
    uint16_t type;          /* enum nvshare_message_type */
    uint32_t payload_bytes; /* must equal the size of the type's payload struct */
    uint32_t reserved;      /* zero */
};

struct nvshare_gpu_uuid {
    uint8_t bytes[NVSHARE_UUID_BYTES];
};

/* NVSHARE_MSG_HELLO.  pid, uid and gid are not here on purpose: the agent
 * takes them from the kernel (SO_PEERCRED), never from the client. */
struct nvshare_hello {
    uint32_t gpu_count; /* entries used in gpus[], 0..NVSHARE_MAX_GPUS */
    uint32_t reserved;
    struct nvshare_gpu_uuid gpus[NVSHARE_MAX_GPUS];
    char command[NVSHARE_COMMAND_BYTES]; /* NUL-padded; for logs and status only */
};

/* NVSHARE_MSG_SETTINGS */
struct nvshare_settings {
    uint32_t anti_thrash;     /* 1: one holder per GPU; 0: every request granted at once */
    uint32_t time_quantum_ms; /* how long a holder keeps a GPU while others wait */
    uint32_t idle_release_ms; /* a holder with no work for this long releases early */
    uint32_t drop_grace_ms;   /* after a drop request, the lock is revoked after this */
};

/* NVSHARE_MSG_LOCK_REQUEST, _LOCK_GRANT, _DROP_REQUEST, _RELEASED, _REVOKED.
 * lease numbers one grant; RELEASED echoes it so that a release crossing a
 * revoke on the wire is recognised as stale.  LOCK_REQUEST sends lease 0. */
struct nvshare_lock_message {
    struct nvshare_gpu_uuid gpu;
    uint64_t lease;
    uint32_t flags; /* LOCK_GRANT: enum nvshare_grant_flags; else 0 */
    uint32_t reserved;
};

/* NVSHARE_MSG_MEMORY_REPORT: the totals now, not a delta. */
struct nvshare_memory_report {
    struct nvshare_gpu_uuid gpu;
    uint64_t managed_bytes;   /* converted to unified memory */
    uint64_t unmanaged_bytes; /* passed through (VMM, IPC): cannot be evicted */
};

/* NVSHARE_MSG_ERROR */
struct nvshare_error {
    uint32_t code; /* enum nvshare_error_code */
    uint32_t reserved;
    char text[NVSHARE_ERROR_TEXT_BYTES]; /* NUL-terminated, one line */
};
/* END NVSHARE WIRE FORMAT */

#ifdef __cplusplus
#define NVSHARE_STATIC_ASSERT static_assert
#else
#define NVSHARE_STATIC_ASSERT _Static_assert
#endif
NVSHARE_STATIC_ASSERT(sizeof(struct nvshare_header) == 16, "header layout");
NVSHARE_STATIC_ASSERT(sizeof(struct nvshare_hello) == 296, "hello layout");
NVSHARE_STATIC_ASSERT(sizeof(struct nvshare_settings) == 16, "settings layout");
NVSHARE_STATIC_ASSERT(sizeof(struct nvshare_lock_message) == 32, "lock message layout");
NVSHARE_STATIC_ASSERT(sizeof(struct nvshare_memory_report) == 32, "memory report layout");
NVSHARE_STATIC_ASSERT(sizeof(struct nvshare_error) == 136, "error layout");

#endif /* NVSHARE_PROTOCOL_H */
