/* The client thread's services for the rest of the shim. */
#ifndef NVSHARE_LOCK_CLIENT_H
#define NVSHARE_LOCK_CLIENT_H

/* Wake the client thread: memory totals changed. */
void nvshare_client_wake(void);

#endif
