/* The forward's linears (kdt_dlin: src/model/internal.h) whatever their format: one dispatch,
 * y [M, N] f32 (+)= x [M, K] . W^T, that runs cuBLAS on weights in the model's dtype and
 * src/cuda/quant_gemm.h's kernels on weights kept quantized (FP8 blocks, INT4 groups): the decode
 * GEMM while M <= KDT_LIN_QGEMM_ROWS, else a bf16 dequantized copy of W (the model's d_deq)
 * then cuBLAS. Every call queues on one stream with no host wait, so a forward of them can be
 * captured in a CUDA graph. Also the small-batch MoE on quantized experts (moe.cu). */
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "model/internal.h"

/* Past this many rows the quantized weights are dequantized for cuBLAS (quant_gemm re-reads them
 * per 32 rows: docs/perf/quant.md, the prefill column). */
#define KDT_LIN_QGEMM_ROWS 64
/* Up to this many rows (at most KDT_SGEMM_MAX_ROWS; $KDT_LIN_SGEMM_ROWS overrides it, 0 turns it off)
 * INT4 weights and FP8 weights of at least KDT_LIN_SGEMM_FP8_ELEMS values go to the weight-streaming
 * kernel (stream_gemm.h): a row's result is then the same bits in a decode step and in a 16-row tree.
 * bf16 weights stay on cuBLAS, ahead of the streaming kernel at every Kimi shape measured (H200, 2026-12-02
 * 16:58, bench_quant_gemm --gemv: by 2-12% at one row with its best cfg and K split, more at 16,
 * docs/perf/quant.md); bf16 weights of at most $KDT_LIN_SGEMM_BF16_MB MB (default 0) go to it too, with
 * programmatic dependent launch inside a PDL forward and an MLP's gate/up fused with SiLU.mul:
 * batch-invariant products at a measured cost. */
#define KDT_LIN_SGEMM_ROWS 16
#define KDT_LIN_SGEMM_FP8_ELEMS (48ll << 20)
#define KDT_LIN_SGEMM_BF16_MB 0ll

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kdt_lin_ctx {
    cublasHandle_t blas;         /* on stream s, with its workspace set */
    cudaStream_t s;
    kdt_dtype dt;                /* the activations' dtype (bf16 wherever a weight is quantized) */
    void *deq;                   /* bf16 [the model's deq_elems] */
    float *tmp;                  /* f32 [M x the largest N]: a quantized product before it is added or placed */
} kdt_lin_ctx;

/* y [M, N] (row stride ldy) = x [M, K] (dt, row stride ldx) . W^T + beta * y, W [N, K] (wt, row
 * stride ldw) row-major: one column-major cuBLAS GEMM y^T = W . x^T, f32 accumulation. */
kdt_status kdt_lin_gemm(cublasHandle_t h, int64_t M, int64_t N, int64_t K, const void *W, cudaDataType wt, int64_t ldw, const void *x,
                        cudaDataType xt, int64_t ldx, void *y, cudaDataType yt, int64_t ldy, float beta);

/* y [M, N] f32 = x [M, K] (dt, contiguous) . W_e^T, matrix e of w; added to y when accumulate. */
kdt_status kdt_lin(const kdt_lin_ctx *c, const kdt_dlin *w, int64_t e, int64_t M, const void *x, float *y, int accumulate);

/* act [M, I] (dt) = silu(x gate^T) * (x up^T) of gate_up [2I, K] (gate rows first): in one launch of the
 * streaming kernel where kdt_lin would take it (bf16), else kdt_lin into gu [M, 2I] f32 then kdt_mk_silu_mul. */
kdt_status kdt_lin_glu(const kdt_lin_ctx *c, const kdt_dlin *w, int64_t M, const void *x, float *gu, void *act);

/* Makes m->d_deq (m->deq_elems bf16) if the model has quantized weights and it is not there yet;
 * outside any capture (it allocates). */
kdt_status kdt_lin_prepare(kdt_model *m);

/* kdt_mk_moe_small (kernels.h) on experts of any format: gate_up E x [2I, hid], down E x [hid, I]. */
kdt_status kdt_lin_moe_small(int64_t R, const void *x, const int32_t *perm, int32_t K, const int32_t *counts, const int32_t *offs,
                             const kdt_dlin *gate_up, const kdt_dlin *down, int32_t hid, int32_t I, void *act, float *ye,
                             kdt_dtype dt, cudaStream_t s);

#ifdef __cplusplus
}
#endif
