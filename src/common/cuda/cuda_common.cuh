/* Shared by every .cu file: the CUDA check macros and small device helpers. */
#pragma once

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include "common/internal.h"

/* Returns KDT_ERR_CUDA from the enclosing function with file, line, call and CUDA's message. */
#define KDT_CUDA_CHECK(call)                                                                     \
    do {                                                                                         \
        cudaError_t kdt_e_ = (call);                                                             \
        if (kdt_e_ != cudaSuccess)                                                               \
            return kdt_fail(KDT_ERR_CUDA, "%s:%d: %s: %s", __FILE__, __LINE__, #call,            \
                            cudaGetErrorString(kdt_e_));                                         \
    } while (0)

/* After every launch: catches bad configurations and earlier asynchronous faults. */
#define KDT_CUDA_CHECK_LAUNCH(what) KDT_CUDA_CHECK(cudaPeekAtLastError())
