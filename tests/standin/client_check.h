/* The small single-purpose clients' CHECK: a failing driver call ends the
 * test (return 1 from the function) with one line naming the call. */
#ifndef STANDIN_CLIENT_CHECK_H
#define STANDIN_CLIENT_CHECK_H

#include <stdio.h>

#define CLIENT_CHECK(client, call)                                                     \
    do {                                                                               \
        CUresult check_result_ = (call);                                               \
        if (check_result_ != CUDA_SUCCESS) {                                           \
            printf("client=" client " result=error call=%s error=%d\n", #call,         \
                   (int)check_result_);                                                \
            return 1;                                                                  \
        }                                                                              \
    } while (0)

#endif
