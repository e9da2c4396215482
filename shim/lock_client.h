/* The lock client's thread (lock_client.c). */
#ifndef NVSHARE_LOCK_CLIENT_H
#define NVSHARE_LOCK_CLIENT_H

/* The client thread's body: started once per process, at the first CUDA call. */
void *nvshare_client_main(void *unused);

/* In a forked child: the parent's connection state and directory watch are not its own. */
void nvshare_client_forget_after_fork(void);

#endif
