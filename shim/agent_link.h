/* The client thread's connection to the agent (agent_link.c): the socket,
 * frames in and out.  Used by the client thread only. */
#ifndef NVSHARE_AGENT_LINK_H
#define NVSHARE_AGENT_LINK_H

#include <stdint.h>

#include "nvshare_protocol.h"

/* Connects to the agent's socket (NVSHARE_SOCKET).  0, or errno's value. */
int nvshare_link_connect(void);
/* Says HELLO: this process's GPUs, name and features.  0 when sent. */
int nvshare_link_hello(void);
/* 1 while connected. */
int nvshare_link_up(void);
/* The socket to poll (-1 while not connected). */
int nvshare_link_fd(void);
void nvshare_link_close(void);

/* 0 when the whole frame went out. */
int nvshare_link_send(uint16_t type, const void *payload, uint32_t bytes);
/* A lock message about gpu (idle_ms: RELEASED's, else 0). */
int nvshare_link_send_lock(uint16_t type, int gpu, uint64_t lease, uint32_t idle_ms);

/* Reads what the socket has: 1 read (or nothing yet), 0 closed by the agent,
 * -1 error (errno says). */
int nvshare_link_receive(void);
/* The next complete frame read: 1 taken, 0 none yet, -1 not a frame of this
 * protocol (header says what came). */
int nvshare_link_next_frame(struct nvshare_header *header,
                            unsigned char payload[NVSHARE_MAX_PAYLOAD_BYTES]);
/* The oldest descriptor the agent sent with its frames and no frame took (FAIR_SLOT's
 * page), or -1; the caller closes it. */
int nvshare_link_take_fd(void);

/* ---- when to try again ----
 * After a failed try or a lost agent: the next try after the backoff, and the
 * socket's directory watched meanwhile. */
void nvshare_link_retry_later(void);
/* The agent answered: should it go, the next try is at once; no watch. */
void nvshare_link_answered(void);
/* The agent stayed silent: the next try after the longest backoff. */
void nvshare_link_slow_down(void);
double nvshare_link_retry_at_ms(void);
/* The directory watch to poll while no agent is connected (-1: none); when it
 * is readable, nvshare_link_read_watch (a socket that appeared is tried now). */
int nvshare_link_watch_fd(void);
void nvshare_link_read_watch(void);

/* In a forked child: the parent's connection and watch are closed. */
void nvshare_link_forget_after_fork(void);

#endif
