/* The lock client's link to the agent (agent_link.c); client thread only. */
#ifndef NVSHARE_AGENT_LINK_H
#define NVSHARE_AGENT_LINK_H

#include <stdint.h>

#include "nvshare_protocol.h"

int nvshare_send_frame(uint16_t type, const void *payload, uint32_t bytes);
int nvshare_send_lock_message(uint16_t type, int gpu, uint64_t lease);
/* Connects and says HELLO; on failure runs unscheduled (warning once on the
 * first attempt) and sets the next retry time. */
void nvshare_connect_to_agent(int first_attempt);
/* The agent is gone or spoke nonsense: warn once, open every gate, retry later. */
void nvshare_lose_agent(const char *why);

#endif
