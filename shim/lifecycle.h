/* Starting the client, fork and context teardown (lifecycle.c). */
#ifndef NVSHARE_LIFECYCLE_H
#define NVSHARE_LIFECYCLE_H

/* Starts the client at the first CUDA call; harmless to call again. */
void nvshare_client_start(void);

#endif
