/* The decode GEMMs of quant_gemm.h with the kernel named, for bench_quant_gemm (the baseline kernel
 * beside the streaming one in the same run) and test_quant_gemm (both kernels at every M). The
 * model calls kdt_qgemm_fp8 / kdt_qgemm_int4, which are kdt_qgemm_with(KDT_QGEMM_AUTO, ...). */
#pragma once

#include "kdt/kdt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    KDT_QGEMM_AUTO = 0,     /* the streaming kernel up to 32 rows, the baseline past them */
    KDT_QGEMM_BASELINE = 1, /* qgemm_kernel: x and scales read inside each step */
    KDT_QGEMM_STREAM = 2,   /* qgemm_ring_kernel at every M (INT4 scales not 4-byte aligned: the baseline) */
} kdt_qgemm_kernel;

/* y [M, N] f32 = x [M, K] bf16 @ dequant(w)^T; int4 != 0: w and scale as kdt_qgemm_int4, else as kdt_qgemm_fp8. */
kdt_status kdt_qgemm_with(kdt_qgemm_kernel kernel, int int4, const void *x, const void *w, const void *scale, float *y, int32_t M,
                          int32_t N, int32_t K, void *stream);

#ifdef __cplusplus
}
#endif
