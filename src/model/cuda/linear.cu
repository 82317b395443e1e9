/* The forward's linears: cuBLAS on weights in the model's dtype (bf16 ones on request on the weight-streaming
 * kernel, with PDL in a PDL forward); on weights kept quantized, the weight-streaming kernel (stream_gemm.h) at
 * decode and verify sizes where it is ahead, else quant_gemm's kernels (see linear.h). A stack of two
 * quantized parts (FP8 gate/up whose gate rows are not a whole number of 128-row blocks) runs one product
 * per part, each placed into its columns of y; an accumulated product of parts goes through the same
 * placing kernel. */
#include <climits>
#include <stdlib.h>

#include "common/cuda/cuda_common.cuh"
#include "cuda/quant_gemm.h"
#include "cuda/stream_gemm.h"
#include "model/cuda.h"
#include "model/cuda/kernels.h"
#include "model/cuda/linear.h"
#include "model/cuda/moe_quant.h"

namespace {

/* y [M, ldy] columns col0 .. col0 + n (=, or += when accumulate) t [M, n]. */
__global__ void place_kernel(float *__restrict__ y, int64_t ldy, int64_t col0, const float *__restrict__ t, int64_t M, int64_t n,
                             bool accumulate) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < M * n; i += (int64_t)gridDim.x * blockDim.x) {
        float *o = y + (i / n) * ldy + col0 + i % n;
        *o = accumulate ? *o + t[i] : t[i];
    }
}

/* $name where set, else dflt; clamped to 0 .. hi. */
int64_t env_clamped(const char *name, int64_t dflt, int64_t hi) {
    const char *e = getenv(name);
    const int64_t v = e ? atoll(e) : dflt;
    return v < 0 ? 0 : v > hi ? hi : v;
}

/* Rows up to which the streaming kernel runs: $KDT_LIN_SGEMM_ROWS where set (0 turns it off: the
 * before of a before / after run), else KDT_LIN_SGEMM_ROWS. */
int64_t sgemm_rows() {
    static const int64_t rows = env_clamped("KDT_LIN_SGEMM_ROWS", KDT_LIN_SGEMM_ROWS, KDT_SGEMM_MAX_ROWS);
    return rows;
}

/* A quantized product of M rows with W [N, K] on the streaming kernel (else quant_gemm's): where the H200's
 * bench_quant_gemm has it ahead (docs/perf/quant.md): INT4 at every shape, FP8 on the large matrices. */
bool sgemm_quant(bool int4, int64_t M, int64_t N, int64_t K) { return M <= sgemm_rows() && (int4 || N * K >= KDT_LIN_SGEMM_FP8_ELEMS); }

/* A bf16 product of M rows of x with W [N, K] on the streaming kernel (else cuBLAS): up to sgemm_rows() rows,
 * x and W 16-byte aligned, W of at most KDT_LIN_SGEMM_BF16_MB MB ($KDT_LIN_SGEMM_BF16_MB overrides it). */
bool sgemm_bf16(const kdt_lin_ctx *c, int64_t M, int64_t N, int64_t K, const void *x, const void *W) {
    static const int64_t mb = env_clamped("KDT_LIN_SGEMM_BF16_MB", KDT_LIN_SGEMM_BF16_MB, INT64_MAX / 2000000);
    return c->dt == KDT_BF16 && M <= sgemm_rows() && N * K * 2 <= mb * 1000000 && N <= INT_MAX && K <= INT_MAX && K % 8 == 0 &&
           ((uintptr_t)x | (uintptr_t)W) % 16 == 0;
}

/* The bf16 streaming kernel's flags: PDL where the calling thread's forward launches its kernels so (the
 * quantized products launch as they were measured, without). */
unsigned sgemm_flags(int accumulate) { return (accumulate ? KDT_SGEMM_ACCUMULATE : 0u) | (kdt_mk_pdl() ? KDT_SGEMM_PDL : 0u); }

unsigned blocks_for(int64_t n) { return (unsigned)(n < 256 * 4096 ? (n + 255) / 256 : 4096); }

/* Matrix e's slice of part p: weights and scales. */
const void *part_w(const kdt_dlin *w, int p, int64_t e) {
    return (const char *)w->w[p] + (size_t)e * kdt_dlin_rows(w, p) * kdt_wfmt_row_bytes(w->fmt, w->K);
}
const void *part_s(const kdt_dlin *w, int p, int64_t e) {
    return (const char *)w->scale[p] + (size_t)e * kdt_wfmt_scale_bytes(w->fmt, kdt_dlin_rows(w, p), w->K);
}

} // namespace

extern "C" kdt_status kdt_lin_gemm(cublasHandle_t h, int64_t M, int64_t N, int64_t K, const void *W, cudaDataType wt, int64_t ldw,
                                   const void *x, cudaDataType xt, int64_t ldx, void *y, cudaDataType yt, int64_t ldy, float beta) {
    if (M == 0 || N == 0) return KDT_OK;
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX || ldw > INT_MAX || ldx > INT_MAX || ldy > INT_MAX)
        return kdt_fail(KDT_ERR_UNSUPPORTED, "forward: a GEMM of %lld x %lld x %lld is too large for cuBLAS", (long long)M,
                        (long long)N, (long long)K);
    const float alpha = 1.0f;
    KDT_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)M, (int)K, &alpha, W, wt, (int)ldw, x, xt, (int)ldx,
                                  &beta, y, yt, (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return KDT_OK;
}

extern "C" kdt_status kdt_lin(const kdt_lin_ctx *c, const kdt_dlin *w, int64_t e, int64_t M, const void *x, float *y, int accumulate) {
    const int64_t N = w->N, K = w->K;
    const float beta = accumulate ? 1.0f : 0.0f;
    if (M == 0) return KDT_OK;
    if (w->fmt == KDT_WFMT_DENSE) {
        const cudaDataType ct = c->dt == KDT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
        const void *W = (const char *)w->w[0] + (size_t)e * N * K * kdt_dtype_size(c->dt);
        if (sgemm_bf16(c, M, N, K, x, W))
            return kdt_sgemm(KDT_SGEMM_BF16, x, W, nullptr, y, (int32_t)M, (int32_t)N, (int32_t)K, sgemm_flags(accumulate), c->s);
        return kdt_lin_gemm(c->blas, M, N, K, W, ct, K, x, ct, K, y, CUDA_R_32F, N, beta);
    }
    if (c->dt != KDT_BF16 || M > INT_MAX)
        return kdt_fail(KDT_ERR_UNSUPPORTED, "forward: quantized weights [%lld, %lld] need bf16 activations and fewer rows than 2^31",
                        (long long)N, (long long)K);
    const bool int4 = w->fmt == KDT_WFMT_INT4;
    kdt_status s = KDT_OK;
    if (w->packed) { /* INT4 experts in the grouped kernel's layout (moe_quant.h): to bf16 at any size, then cuBLAS */
        s = kdt_moe_quant_int4_dequant(w, e, c->deq, c->s);
        return s == KDT_OK ? kdt_lin_gemm(c->blas, M, N, K, c->deq, CUDA_R_16BF, K, x, CUDA_R_16BF, K, y, CUDA_R_32F, N, beta) : s;
    }
    if (M > KDT_LIN_QGEMM_ROWS) { /* prefill sizes: W dequantized once, then cuBLAS's tensor cores */
        for (int p = 0, row = 0; p < w->parts && s == KDT_OK; row += kdt_dlin_rows(w, p), p++) {
            void *out = (uint16_t *)c->deq + (size_t)row * K;
            s = int4 ? kdt_dequant_int4_bf16(part_w(w, p, e), part_s(w, p, e), out, kdt_dlin_rows(w, p), (int32_t)K, c->s)
                     : kdt_dequant_fp8_bf16(part_w(w, p, e), (const float *)part_s(w, p, e), out, kdt_dlin_rows(w, p), (int32_t)K, c->s);
        }
        return s == KDT_OK ? kdt_lin_gemm(c->blas, M, N, K, c->deq, CUDA_R_16BF, K, x, CUDA_R_16BF, K, y, CUDA_R_32F, N, beta) : s;
    }
    const bool sgemm = sgemm_quant(int4, M, N, K), direct = w->parts == 1 && (!accumulate || sgemm);
    for (int p = 0, row = 0; p < w->parts && s == KDT_OK; row += kdt_dlin_rows(w, p), p++) {
        const int32_t n = kdt_dlin_rows(w, p);
        float *out = direct ? y : c->tmp;
        if (sgemm)
            s = kdt_sgemm(int4 ? KDT_SGEMM_INT4 : KDT_SGEMM_FP8, x, part_w(w, p, e), part_s(w, p, e), out, (int32_t)M, n, (int32_t)K,
                          direct && accumulate ? KDT_SGEMM_ACCUMULATE : 0u, c->s);
        else
            s = int4 ? kdt_qgemm_int4(x, part_w(w, p, e), part_s(w, p, e), out, (int32_t)M, n, (int32_t)K, c->s)
                     : kdt_qgemm_fp8(x, part_w(w, p, e), (const float *)part_s(w, p, e), out, (int32_t)M, n, (int32_t)K, c->s);
        if (s != KDT_OK || direct) continue;
        place_kernel<<<blocks_for(M * n), 256, 0, c->s>>>(y, N, row, c->tmp, M, n, accumulate != 0);
        KDT_CUDA_CHECK_LAUNCH("linear place");
    }
    return s;
}

extern "C" kdt_status kdt_lin_glu(const kdt_lin_ctx *c, const kdt_dlin *w, int64_t M, const void *x, float *gu, void *act) {
    const int64_t I = w->N / 2;
    if (w->fmt == KDT_WFMT_DENSE && w->N % 2 == 0 && sgemm_bf16(c, M, w->N, w->K, x, w->w[0]))
        return kdt_sgemm(KDT_SGEMM_BF16, x, w->w[0], nullptr, act, (int32_t)M, (int32_t)w->N, (int32_t)w->K,
                         KDT_SGEMM_GLU | sgemm_flags(0), c->s);
    KDT_TRY(kdt_lin(c, w, 0, M, x, gu, 0));
    return kdt_mk_silu_mul(gu, M, (int32_t)I, act, c->dt, c->s);
}

extern "C" kdt_status kdt_lin_prepare(kdt_model *m) {
    if (!m->deq_elems || m->d_deq) return KDT_OK;
    return kdt_model_dbuf(m, m->deq_elems * 2, &m->d_deq);
}
