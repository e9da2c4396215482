/* Handing out hooks instead of the driver's functions: dlsym and
 * cuGetProcAddress(_v2) (interpose.c). */
#ifndef NVSHARE_INTERPOSE_H
#define NVSHARE_INTERPOSE_H

#include "hooks.h"

/* The hook for a function the driver handed out, or the function itself when
 * the table has no row for it.  name/cuda_version/flags only feed a debug
 * line when a hooked family hands out an unknown variant. */
void *nvshare_hook_for(void *real, const char *name, int cuda_version, unsigned long long flags);

#endif
