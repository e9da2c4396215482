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
 *
 * Growing the protocol without a new version: each side says which additions
 * it knows (HELLO.features from the shim, WELCOME from the agent).  WELCOME
 * goes to every shim, whatever its HELLO announced: a shim that does not know
 * it ignores it.  Past that, an addition the other side would misread or
 * refuse goes only to a side that announced it (docs/protocol.md lists which).
 * Both sides ignore frame types and flag bits they do not know, except that
 * an agent refuses unknown types from a shim (which never sends them unasked).
 */
#ifndef NVSHARE_PROTOCOL_H
#define NVSHARE_PROTOCOL_H

#include <stdint.h>

/* Where the agent listens unless told otherwise (the shim's NVSHARE_SOCKET, the agent's
 * --socket; systemd/nvshare.socket says the same, which a test checks).  Outside the
 * wire format below, which cffi reads: cffi takes no string constants; the agent
 * reads this line itself (agent/protocol.py). */
#define NVSHARE_DEFAULT_SOCKET_PATH "/run/nvshare/scheduler.sock"

/* BEGIN NVSHARE WIRE FORMAT */
#define NVSHARE_MAGIC             0x4853564e /* the bytes "NVSH" on a little-endian host */
#define NVSHARE_PROTOCOL_VERSION  1
#define NVSHARE_MAX_GPUS          16
#define NVSHARE_UUID_BYTES        16 /* CUuuid / NVML UUID, raw bytes */
#define NVSHARE_COMMAND_BYTES     32
#define NVSHARE_ERROR_TEXT_BYTES  128
#define NVSHARE_MAX_PAYLOAD_BYTES 512 /* larger frames are a protocol error */
/* The agent's default drop grace, and what a shim assumes before SETTINGS came */
#define NVSHARE_DEFAULT_DROP_GRACE_MS 5000

enum nvshare_message_type {
    NVSHARE_MSG_HELLO = 1,        /* shim -> agent: first frame on a connection */
    NVSHARE_MSG_SETTINGS = 2,     /* agent -> shim: after HELLO and on every change */
    NVSHARE_MSG_LOCK_REQUEST = 3, /* shim -> agent: wants to run on a GPU */
    /* agent -> shim: may run (exclusive, or shared beside others) */
    NVSHARE_MSG_LOCK_GRANT = 4,
    /* agent -> shim: finish in-flight work and release (at once, or once idle) */
    NVSHARE_MSG_DROP_REQUEST = 5,
    /* shim -> agent: stopped using the GPU (idle, or after a drop request) */
    NVSHARE_MSG_RELEASED = 6,
    NVSHARE_MSG_REVOKED = 7, /* agent -> shim: lock taken away after ignoring a drop request */
    NVSHARE_MSG_MEMORY_REPORT = 8, /* shim -> agent: bytes allocated on a GPU */
    NVSHARE_MSG_ERROR = 9,         /* agent -> shim: the agent closes the connection after it */
    NVSHARE_MSG_WELCOME = 10,      /* agent -> shim: after SETTINGS, what this agent does */
    /* shim -> agent: a GPU's total memory; only to an agent that announced GPU_MEMORY */
    NVSHARE_MSG_GPU_MEMORY = 11,
    /* agent -> shim: "still here", to a shim that announced KEEPALIVE, while it waits */
    NVSHARE_MSG_KEEPALIVE = 12,
    /* shim -> agent: how long this process kept a GPU busy; only to an agent that announced
     * USAGE */
    NVSHARE_MSG_GPU_USAGE = 13,
    /* agent -> shim: the memory cap of this process's share group on a GPU; only to a shim
     * that announced MEMORY_CAP */
    NVSHARE_MSG_MEMORY_CAP = 14,
    /* agent -> shim: this process's slot in a GPU's fair page; only to a shim that
     * announced FAIR */
    NVSHARE_MSG_FAIR_SLOT = 15
};

/* Additions a peer announces: the shim in HELLO.features, the agent in
 * WELCOME.features.  A bit only means something in the direction named. */
enum nvshare_features {
    /* shim: honours DROP_REQUEST with NVSHARE_DROP_WHEN_IDLE and GRANT_RELEASE_WHEN_IDLE */
    NVSHARE_FEATURE_YIELD = 1,
    NVSHARE_FEATURE_GPU_MEMORY = 2, /* agent: takes GPU_MEMORY frames */
    /* shim: wants KEEPALIVE while it waits; agent: sends them, every WELCOME.keepalive_ms */
    NVSHARE_FEATURE_KEEPALIVE = 4,
    /* shim: measures its GPU time; agent: takes GPU_USAGE frames and schedules by them */
    NVSHARE_FEATURE_USAGE = 8,
    /* shim: takes MEMORY_CAP frames and refuses allocations past the cap */
    NVSHARE_FEATURE_MEMORY_CAP = 16,
    /* shim: takes FAIR_SLOT frames and shares the GPU by them (struct nvshare_fair_page) */
    NVSHARE_FEATURE_FAIR = 32
};

enum nvshare_grant_flags {
    NVSHARE_GRANT_EXCLUSIVE = 1, /* no other process runs on the GPU meanwhile */
    NVSHARE_GRANT_SHARED = 2,    /* others may run beside this one */
    /* with SHARED: release when idle for idle_release_ms all the same (anti-thrash auto,
     * where shared leases are short); exclusive leases always do */
    NVSHARE_GRANT_RELEASE_WHEN_IDLE = 4,
    /* drops are likely (anti-thrash auto, a turn while not everyone's memory fits):
     * bound the queue by the longest recent kernel, not the average, for the whole
     * lease (and to 5 ms once others wait); a shim that does not know the bit
     * ignores it */
    NVSHARE_GRANT_SHORT_QUEUE = 8,
    /* since this process last held the GPU, another one whose memory does not fit beside
     * it held the GPU alone for a turn: its pages may be on the host, so prefetch at this
     * grant however short the absence was (a shim that does not know the bit goes by time
     * alone) */
    NVSHARE_GRANT_DISPLACED = 16
};

enum nvshare_drop_flags {
    /* someone waits: release once no work has run for lock_message.idle_ms, rather than
     * at once; a later DROP_REQUEST without the flag still means at once */
    NVSHARE_DROP_WHEN_IDLE = 1
};

enum nvshare_anti_thrash {
    NVSHARE_ANTI_THRASH_OFF = 0, /* every request granted at once, shared */
    NVSHARE_ANTI_THRASH_ON = 1,  /* one holder per GPU, turns of at most the time quantum */
    NVSHARE_ANTI_THRASH_AUTO = 2 /* per GPU: light work beside the holder while memory fits */
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
    uint32_t features;  /* enum nvshare_features this shim knows (0 before they existed) */
    struct nvshare_gpu_uuid gpus[NVSHARE_MAX_GPUS];
    char command[NVSHARE_COMMAND_BYTES]; /* NUL-padded; for logs and status only */
};

/* NVSHARE_MSG_SETTINGS */
struct nvshare_settings {
    uint32_t anti_thrash; /* enum nvshare_anti_thrash; for logs: grants carry the lease's kind */
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
    uint32_t flags; /* LOCK_GRANT: enum nvshare_grant_flags; DROP_REQUEST: enum
                       nvshare_drop_flags; else 0 */
    /* RELEASED: for how long no work had run when the GPU was let go (the idle wait
     * of an idle release; 0: busy, or a shim from before this field);
     * DROP_REQUEST with NVSHARE_DROP_WHEN_IDLE: release after this long idle; else 0 */
    uint32_t idle_ms;
};

/* NVSHARE_MSG_MEMORY_REPORT: the totals now, not a delta. */
struct nvshare_memory_report {
    struct nvshare_gpu_uuid gpu;
    uint64_t managed_bytes;   /* converted to unified memory */
    uint64_t unmanaged_bytes; /* passed through (VMM, IPC): cannot be evicted */
};

/* NVSHARE_MSG_WELCOME: the agent's answer to HELLO, right after SETTINGS. */
struct nvshare_welcome {
    uint32_t features;     /* enum nvshare_features this agent does */
    uint32_t keepalive_ms; /* with FEATURE_KEEPALIVE: the most time between two frames to a
                              shim that waits for a grant; 0 otherwise */
};

/* NVSHARE_MSG_GPU_MEMORY: sent once per GPU after WELCOME, so that an agent
 * without NVML (a container, CI) knows each GPU's capacity. */
struct nvshare_gpu_memory {
    struct nvshare_gpu_uuid gpu;
    uint64_t total_bytes; /* cuDeviceTotalMem */
};

/* NVSHARE_MSG_KEEPALIVE */
struct nvshare_keepalive {
    uint32_t waiting_gpus; /* how many of this shim's requests wait in a queue now */
    uint32_t reserved;
};

/* NVSHARE_MSG_GPU_USAGE: the GPU time this process has kept a GPU busy with since it
 * connected (work submitted and not yet finished: kernels, copies, a thread inside a gated
 * call), sampled by the shim every few milliseconds while it holds the GPU.  A running total,
 * so a lost or late frame loses nothing: the agent takes differences.  Sent every
 * ~100 ms while it changes, and before each RELEASED. */
struct nvshare_gpu_usage {
    struct nvshare_gpu_uuid gpu;
    uint64_t busy_us;
};

/* NVSHARE_MSG_MEMORY_CAP: sent after WELCOME for each GPU where the process's share group has
 * a cap, and again whenever the cap or what the group's other processes hold there changes.
 * The shim refuses an allocation that would take its own allocations past
 * cap_bytes - others_bytes (CUDA_ERROR_OUT_OF_MEMORY) and reports cap_bytes as the GPU's total
 * memory (cuMemGetInfo).  cap_bytes 0: no cap (others_bytes is then 0). */
struct nvshare_memory_cap {
    struct nvshare_gpu_uuid gpu;
    uint64_t cap_bytes;
    uint64_t others_bytes; /* what the group's other processes hold on gpu, as they reported */
};

/* NVSHARE_MSG_FAIR_SLOT: sent once per GPU, at this process's first grant there, with the
 * GPU's fair page: a descriptor of shared memory (SCM_RIGHTS, on the frame's first byte;
 * its size sealed).  slot is this process's in it, weight its share group's weight then
 * (a later one the agent writes in the slot). */
struct nvshare_fair_slot {
    struct nvshare_gpu_uuid gpu;
    uint32_t slot;
    uint32_t weight;
};

/* The fair page: one per GPU, shared memory the agent makes (NVSHARE_FAIR_PAGE_BYTES,
 * zeroed) and every shim holding that GPU maps.  Each slot is written by its own shim but for
 * weight and in_use, the agent's (a slot is zeroed when its process leaves).  A shim
 * whose lease is open and that has work queued or waiting is backlogged; its vtime grows
 * by its GPU time over its weight: its time with work on the GPU over one plus the number
 * of fresh backlogged others with on_gpu set (the driver's equal slices; a shim from
 * before on_gpu leaves it 0).  A shim holds its next launches while another backlogged
 * slot's vtime is more than a lead lower (docs/scheduling.md, "Side by side"). */
#define NVSHARE_FAIR_SLOTS      63
#define NVSHARE_FAIR_PAGE_BYTES 4096
struct nvshare_fair_state {
    uint64_t vtime_ns;   /* GPU time over weight, nanoseconds */
    uint64_t seen_ns;    /* CLOCK_MONOTONIC of its shim's last look: an older one is stale */
    uint32_t backlogged; /* 1: has work on the GPU or waiting to be launched */
    uint32_t weight;     /* the agent's: its group's weight now (the shim reads it each look) */
    uint32_t in_use;     /* the agent's: 1 while the slot is a process's and fair_page is on */
    uint32_t on_gpu;     /* 1: a launch or copy passed, or work was queued, at its last look */
    uint32_t reserved[8];
};
struct nvshare_fair_page {
    uint32_t magic; /* NVSHARE_MAGIC once the agent made it */
    /* Bumped by a shim whose slot stops being backlogged, or whose hold lifts; a held
     * thread waits on it (a futex shared by the shims), counted in wake_waiters, so that
     * it goes on as soon as the one it waited for has no work, not a look later. */
    uint32_t wake_seq;
    uint32_t wake_waiters;
    uint32_t reserved[13];
    struct nvshare_fair_state slots[NVSHARE_FAIR_SLOTS];
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
NVSHARE_STATIC_ASSERT(sizeof(struct nvshare_welcome) == 8, "welcome layout");
NVSHARE_STATIC_ASSERT(sizeof(struct nvshare_gpu_memory) == 24, "gpu memory layout");
NVSHARE_STATIC_ASSERT(sizeof(struct nvshare_keepalive) == 8, "keepalive layout");
NVSHARE_STATIC_ASSERT(sizeof(struct nvshare_gpu_usage) == 24, "gpu usage layout");
NVSHARE_STATIC_ASSERT(sizeof(struct nvshare_memory_cap) == 32, "memory cap layout");
NVSHARE_STATIC_ASSERT(sizeof(struct nvshare_fair_slot) == 24, "fair slot layout");
NVSHARE_STATIC_ASSERT(sizeof(struct nvshare_fair_state) == 64, "fair state layout");
NVSHARE_STATIC_ASSERT(sizeof(struct nvshare_fair_page) == NVSHARE_FAIR_PAGE_BYTES,
                      "fair page layout");

#endif /* NVSHARE_PROTOCOL_H */
