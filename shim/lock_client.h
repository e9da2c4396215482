/* The client thread's services for the rest of the shim. */
#ifndef NVSHARE_LOCK_CLIENT_H
#define NVSHARE_LOCK_CLIENT_H

/* Wake the client thread: memory totals changed. */
void nvshare_client_wake(void);

/* Starts one of the shim's own threads: detached, and taking no signals (they
 * belong to the application's threads).  Returns pthread_create's error. */
int nvshare_start_shim_thread(void *(*thread_main)(void *), void *arg);

#endif
