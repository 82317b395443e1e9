/* Weight-streaming matrix products for decode and verify sizes (M <= 32 rows of x): y = x W^T with x
 * bf16 and W in one of three formats, read from DRAM once and at close to the copy ceiling
 * (docs/perf/quant.md, "Streaming small-M GEMM"):
 *   KDT_SGEMM_BF16: w bf16 [N, K], no scale (K % 8 == 0);
 *   KDT_SGEMM_FP8:  w e4m3 bytes [N, K], scale f32 [ceil(N/128), ceil(K/128)] (K % 16 == 0);
 *   KDT_SGEMM_INT4: w int32 words [N, K/8] (value k in bits 4 (k % 8) .. of word k / 8, offset by 8),
 *                   scale bf16 [N, K/32], 2-byte aligned (K % 32 == 0).
 * x and w 16-byte aligned, x rows contiguous. Deterministic, and a row's result does not depend on M:
 * each output element sums its k in an order fixed by (N, K, format) alone.
 * All pointers are device memory; every launcher runs on `stream` and returns kdt_status. */
#pragma once

#include "kdt/kdt.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KDT_SGEMM_MAX_ROWS 32

typedef enum { KDT_SGEMM_BF16 = 0, KDT_SGEMM_FP8 = 1, KDT_SGEMM_INT4 = 2 } kdt_sgemm_fmt;

/* flags (OR'ed):
 *   KDT_SGEMM_ACCUMULATE: y += the product instead of y =;
 *   KDT_SGEMM_PDL: launched with programmatic dependent launch (the caller's previous kernel may still run):
 *     each block loads its first weights, which no kernel writes, then waits for the previous grid
 *     (griddepcontrol.wait) before it reads x or touches y, so its DRAM ramp-up overlaps that kernel's tail;
 *   KDT_SGEMM_GLU (bf16 only, no accumulate): w is a gate/up stack [2I, K] (N = 2I, gate rows first) and
 *     y is bf16 [M, I] = silu(x gate^T) * (x up^T), each product rounded as the f32 y would be, then
 *     silu(g) * u = g / (1 + exp(-g)) * u in f32 rounded to bf16 (kdt_mk_silu_mul's formula). */
#define KDT_SGEMM_ACCUMULATE 1u
#define KDT_SGEMM_PDL 2u
#define KDT_SGEMM_GLU 4u

/* y [M, N] f32 = x [M, K] bf16 . dequant(w)^T, or as flags say; 0 <= M <= 32. */
kdt_status kdt_sgemm(kdt_sgemm_fmt fmt, const void *x, const void *w, const void *scale, void *y, int32_t M, int32_t N, int32_t K,
                     unsigned flags, void *stream);

/* kdt_sgemm with the kernel's shape named (bench_quant_gemm's variants): cfg 0 picks by M as
 * kdt_sgemm does; 1 .. KDT_SGEMM_CFGS - 1 force one (row tiles a warp x steps in flight a lane: 1 x 4,
 * 2 x 4; 3 and 4: 1 x 8 and 2 x 4 with int4's transpose through shared memory, for bf16 and fp8 as 1 and 2).
 * GLU runs 2 whatever the cfg. */
#define KDT_SGEMM_CFGS 5
kdt_status kdt_sgemm_cfg(int cfg, kdt_sgemm_fmt fmt, const void *x, const void *w, const void *scale, void *y, int32_t M, int32_t N,
                         int32_t K, unsigned flags, void *stream);
/* The cfg kdt_sgemm picks for M rows (the bench prints it): every cfg gives the same bits. */
int kdt_sgemm_auto_cfg(kdt_sgemm_fmt fmt, int32_t M);

#ifdef __cplusplus
}
#endif
