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

/* The same for a cuBLAS call (in files that include <cublas_v2.h>), with cuBLAS's message. */
#define KDT_CUBLAS_CHECK(call)                                                                   \
    do {                                                                                         \
        cublasStatus_t kdt_b_ = (call);                                                          \
        if (kdt_b_ != CUBLAS_STATUS_SUCCESS)                                                     \
            return kdt_fail(KDT_ERR_CUDA, "%s:%d: %s: %s", __FILE__, __LINE__, #call,            \
                            cublasGetStatusString(kdt_b_));                                      \
    } while (0)

/* Returns from the enclosing function when a library call fails, with that call's status. */
#define KDT_TRY(call)                                                                            \
    do {                                                                                         \
        kdt_status kdt_s_ = (call);                                                              \
        if (kdt_s_ != KDT_OK) return kdt_s_;                                                     \
    } while (0)
