/* Matrix products with weights kept quantized in GPU memory (docs/interfaces.md section 4), for the decode and
 * verify sizes of the model's projections and experts: y = x W^T with x bf16 and W stored as
 *   FP8 blocks: w e4m3 bytes [N, K], scale f32 [ceil(N/128), ceil(K/128)] (DeepSeek-V3, Kimi K2);
 *   INT4 groups: w int32 words [N, K/8] (value k in bits 4 (k % 8) .. of word k / 8, offset by 8),
 *                scale bf16 [N, K/32] (compressed-tensors pack-quantized, Kimi K2.5 / K2.6).
 * The weights are dequantized in registers, once for up to 32 rows of x, and multiplied on the
 * tensor cores (bf16 operands, f32 accumulation, scales applied in f32); a K split sums its
 * partials in a fixed order (deterministic, no atomics). Past 32 rows the weights are read once
 * per 32: for prefill sizes, the dequantize kernels write a bf16 copy of W for cuBLAS.
 * All pointers are device memory; every launcher runs on `stream` and returns kdt_status. */
#pragma once

#include "kdt/kdt.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KDT_QGEMM_FP8_BLOCK 128
#define KDT_QGEMM_INT4_GROUP 32

/* y [M, N] f32 = x [M, K] bf16 @ dequant(w)^T. K % 16 == 0; x and w 16-byte aligned. */
kdt_status kdt_qgemm_fp8(const void *x, const void *w, const float *scale, float *y, int32_t M, int32_t N, int32_t K,
                         void *stream);
/* y [M, N] f32 = x [M, K] bf16 @ dequant(w)^T. K % 32 == 0; x and w 16-byte aligned. */
kdt_status kdt_qgemm_int4(const void *x, const void *w, const void *scale, float *y, int32_t M, int32_t N, int32_t K,
                          void *stream);
/* out [N, K] bf16 = dequant(w), rounded to nearest even (the prefill path's cuBLAS operand). */
kdt_status kdt_dequant_fp8_bf16(const void *w, const float *scale, void *out, int32_t N, int32_t K, void *stream);
kdt_status kdt_dequant_int4_bf16(const void *w, const void *scale, void *out, int32_t N, int32_t K, void *stream);

#ifdef __cplusplus
}
#endif
