/*
 * Forced into every object (-include): the shim loads into processes of any
 * glibc since 2.17, not only the build host's.  Containers on a node often run
 * older distributions, and a preloaded object needing a newer glibc version
 * than the process has stops that process before main.
 *
 * glibc 2.32 and 2.34 moved these functions into libc under new default
 * versions and kept the original ones as aliases of the same code; binding to
 * the originals works on both sides of the move.  glibc 2.38's headers rename
 * strtoul and the scanf family to C23 variants (__isoc23_strtoul) that need 2.38,
 * so the shim calls none of them.  tests/shim/test_containers.py fails the build
 * if any reference needs more than 2.17.
 */
#ifndef NVSHARE_GLIBC_BASELINE_H
#define NVSHARE_GLIBC_BASELINE_H

#define NVSHARE_ORIGINAL_VERSION(name) __asm__(".symver " #name "," #name "@GLIBC_2.2.5")

NVSHARE_ORIGINAL_VERSION(dlopen);
NVSHARE_ORIGINAL_VERSION(dlclose);
NVSHARE_ORIGINAL_VERSION(dlvsym);
NVSHARE_ORIGINAL_VERSION(pthread_create);
NVSHARE_ORIGINAL_VERSION(pthread_once);
NVSHARE_ORIGINAL_VERSION(pthread_mutex_trylock);
NVSHARE_ORIGINAL_VERSION(pthread_sigmask);
NVSHARE_ORIGINAL_VERSION(pthread_testcancel);

#endif
