/* Stream-ordered frees, parked for reuse instead of freed at once (parking.c). */
#ifndef NVSHARE_PARKING_H
#define NVSHARE_PARKING_H

#include <stdint.h>

#include "cuda_abi.h"

/* cuMemFreeAsync of a converted allocation: park it.  1 when parked; 0 when
 * it cannot be (the caller frees it the synchronous way). */
int nvshare_park(CUdeviceptr pointer, CUstream stream);

/* A stream-ordered allocation of bytes on stream: 1 and *pointer when a
 * parked block of a fitting size may serve it, else 0. */
int nvshare_unpark(size_t bytes, CUstream stream, CUdeviceptr *pointer);

/* Frees parked blocks of gpu in the calling thread's context for real, oldest
 * first, until at least bytes are freed; returns the bytes freed. */
uint64_t nvshare_parking_free(int gpu, uint64_t bytes);

/* The driver freed the context of (gpu, slot), with its memory and events. */
void nvshare_parking_forget_context(int gpu, int slot);

/* In a forked child: forget the parent's parked blocks without touching them. */
void nvshare_parking_forget_after_fork(void);

#endif
