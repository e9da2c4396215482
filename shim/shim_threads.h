/* The shim's own threads (shim_threads.c): starting one, and the client
 * thread's doorbell. */
#ifndef NVSHARE_SHIM_THREADS_H
#define NVSHARE_SHIM_THREADS_H

/* Starts one of the shim's own threads: detached, and taking no signals (they
 * belong to the application's threads).  Returns pthread_create's error. */
int nvshare_start_shim_thread(void *(*thread_main)(void *), void *arg);

/* The client thread's doorbell: an eventfd it polls.  Opened once, at the
 * client's start; 0 or -1. */
int nvshare_doorbell_open(void);
/* The descriptor to poll (-1 before it is open). */
int nvshare_doorbell_fd(void);
/* The client thread empties it after poll said so. */
void nvshare_doorbell_drain(void);

/* Wake the client thread: something it sends or watches changed (a lock
 * wanted or drained, memory totals).  Any thread; keeps errno. */
void nvshare_client_wake(void);

/* In a forked child: the parent's descriptor is closed, none is open. */
void nvshare_doorbell_forget_after_fork(void);

#endif
