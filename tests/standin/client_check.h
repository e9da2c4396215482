/* The small single-purpose clients' CHECK: a failing driver call ends the
 * test (return 1 from the function) with one line naming the call.  And
 * their common start. */
#ifndef STANDIN_CLIENT_CHECK_H
#define STANDIN_CLIENT_CHECK_H

#include <stdio.h>

#include "cuda_fixture.h"

#define CLIENT_CHECK(client, call)                                             \
    do {                                                                       \
        CUresult check_result_ = (call);                                       \
        if (check_result_ != CUDA_SUCCESS) {                                   \
            printf("client=" client " result=error call=%s error=%d\n", #call, \
                   (int)check_result_);                                        \
            return 1;                                                          \
        }                                                                      \
    } while (0)

/* cuInit, then device 0's primary context, made current. */
#define CLIENT_OPEN_PRIMARY_CONTEXT(client, context)                        \
    do {                                                                    \
        CUdevice device_;                                                   \
        CLIENT_CHECK(client, cuInit(0));                                    \
        CLIENT_CHECK(client, cuDeviceGet(&device_, 0));                     \
        CLIENT_CHECK(client, cuDevicePrimaryCtxRetain((context), device_)); \
        CLIENT_CHECK(client, cuCtxSetCurrent(*(context)));                  \
    } while (0)

#endif
