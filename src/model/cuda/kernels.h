/* Kernels of the model's CUDA forward (kernels.cu): the steps between the cuBLAS
 * projections. `dt` is the activation dtype (KDT_BF16 or KDT_F32): what the GEMMs read; norms,
 * rope, the router and the residual stream work in f32. Every launcher queues its work on the
 * stream and checks the launch; inputs are trusted (the forward built them). */
#pragma once

#include <cuda_runtime.h>

#include "kdt/kdt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether the calling thread's launches of the model's kernels use programmatic dependent launch
 * (pdl.cuh); the forward sets it for its own work (KDT_MODEL_PDL) and clears it after. */
void kdt_mk_set_pdl(int on);
int  kdt_mk_pdl(void);

/* x [R, hid] f32 = rows tokens [R] of embed [V, hid] (dt). */
kdt_status kdt_mk_embed(float *x, const void *embed, kdt_dtype dt, const int32_t *tokens, int64_t R, int32_t hid,
                        cudaStream_t s);

/* RMSNorm: out row i = w * (x * rsqrt(mean(x^2) + eps)), x = in row (rows ? rows[i] : i) [n]
 * (in row stride in_ld); written to out_f32 (stride f32_ld) and to out_act (dt, stride act_ld),
 * either of which may be NULL; neither may overlap in (a small batch's row is cut over several blocks,
 * each reading it whole). R output rows. */
kdt_status kdt_mk_rmsnorm(const float *in, int64_t in_ld, const int32_t *rows, int64_t R, int32_t n, const float *w,
                          float eps, float *out_f32, int64_t f32_ld, void *out_act, int64_t act_ld, kdt_dtype dt,
                          cudaStream_t s);

/* cs, sn [R, half] = cos, sin (pos [R] * inv_freq [half]) * factor. */
kdt_status kdt_mk_rope_table(float *cs, float *sn, const int32_t *pos, const float *inv_freq, int64_t R, int32_t half,
                             float factor, cudaStream_t s);

/* Queries q [R, H, nope + rope] f32 (row stride q_ld): q_nope to qn [R, H, nope] (dt), rope(q_rope)
 * to qabs [R, H, Dv + rope] (dt) from column Dv on. Rope input pairs interleaved or split, output
 * in transformers' order (the pairs' first elements, then their second elements). */
kdt_status kdt_mk_q_prep(const float *q, int64_t q_ld, const float *cs, const float *sn, int64_t R, int32_t H,
                         int32_t nope, int32_t rope, int32_t Dv, int interleave, void *qn, void *qabs, kdt_dtype dt,
                         cudaStream_t s);

/* kdt_mk_q_prep and the W_UK absorb of the forward in one launch, for small batches (a block per
 * head, 64 of the Dv columns and row, its 8 warps splitting the nope sum): qabs [R, H, Dv + rope]
 * (dt) = [q_nope . W_UK_h, rope(q_rope)], W_UK_h the first nope rows of head h of kv_b
 * [H, nope + vd, Dv] (dt). Dv even. Deterministic, and a row's bits do not depend on the batch. */
kdt_status kdt_mk_q_absorb(const float *q, int64_t q_ld, const float *cs, const float *sn, int64_t R, int32_t H, int32_t nope,
                           int32_t rope, int32_t Dv, int interleave, const void *kv_b, int32_t vd, void *qabs, kdt_dtype dt,
                           cudaStream_t s);

/* Latent cache rows: ckv [R, Dv + rope] f32 (row stride ld) becomes [rmsnorm(c_kv; w, eps),
 * rope(k_rope)] written to row slot_rows[r] of pool [*, Dv + rope] (dt). */
kdt_status kdt_mk_kv_append(const float *ckv, int64_t ld, const float *w, float eps, const float *cs, const float *sn,
                            const int64_t *slot_rows, int64_t R, int32_t Dv, int32_t rope, int interleave, void *pool,
                            kdt_dtype dt, cudaStream_t s);
/* The same, and in the same launch the q_a norm: qa [R, ql] (dt) = rmsnorm(q_in row [ql] (row
 * stride ld); q_w, eps). q_in NULL: the cache rows alone. */
kdt_status kdt_mk_kv_append_qa(const float *ckv, int64_t ld, const float *w, float eps, const float *cs, const float *sn,
                               const int64_t *slot_rows, int64_t R, int32_t Dv, int32_t rope, int interleave, void *pool,
                               const float *q_in, const float *q_w, int32_t ql, void *qa, kdt_dtype dt, cudaStream_t s);

/* out [n, I] (dt) = silu(gu[:, :I]) * gu[:, I:], gu [n, 2I] f32. */
kdt_status kdt_mk_silu_mul(const float *gu, int64_t n, int32_t I, void *out, kdt_dtype dt, cudaStream_t s);

/* DeepSeek-V3's router on logits [R, E] f32 (x . W^T): sigmoid scores, bias [E] added for
 * choosing only, the topk_group groups (of E / G) with the best sums of their two best biased
 * scores, the K best experts in them (ties to the lower index); weights the unbiased scores,
 * divided by their sum + 1e-20 when norm, times scale. Out: idx [R, K], wt [R, K] f32. */
kdt_status kdt_mk_route(const float *logits, const float *bias, int64_t R, int32_t E, int32_t G, int32_t topk_group,
                        int32_t K, int norm, float scale, int32_t *idx, float *wt, cudaStream_t s);

/* Groups the n assignments idx [n] (row r, choice k at r * K + k) by expert: counts [E], offs [E]
 * (where expert e's assignments start in perm; may be NULL), perm [n] (assignments of expert 0 in
 * order, then expert 1, ...), pos [n] (where each assignment sits in perm; left alone for indices
 * outside [0, E)). */
kdt_status kdt_mk_moe_plan(const int32_t *idx, int64_t n, int32_t E, int32_t *counts, int32_t *offs, int32_t *perm,
                           int32_t *pos, cudaStream_t s);

/* The routed experts of a small batch (moe.cu), from the device-side plan above, with no
 * host wait: act [n, I] (dt) = silu(x_r . gate_e^T) * (x_r . up_e^T) and ye [n, hid] f32 =
 * act . down_e^T for each assignment p of expert e (x_r = row perm[p] / K of x [R, hid] (dt));
 * w_gate_up [E, 2I, hid], w_down [E, hid, I] (dt). f32 accumulation in a fixed order
 * (deterministic). Needs kdt_mk_moe_small_fits(hid, I): both multiples of 8. */
int        kdt_mk_moe_small_fits(int32_t hid, int32_t I);
/* An RMSNorm made by the kernel that reads its output: rows x[rows ? rows[i] : i] [K] f32 (row
 * stride K), weights w [K], as kdt_mk_rmsnorm computes them (the same bits). */
typedef struct kdt_mk_norm {
    const float *x, *w;
    const int32_t *rows;
    float eps;
} kdt_mk_norm;

/* The same kernels on R rows (at most a few tens; weights streamed once per 16 rows) of x [R, K]
 * (dt) and w [N, K] (dt), K % 8 == 0: gate_up: y [R, N] (dt) = silu(x . w[:N]^T) * (x . w[N:2N]^T),
 * w [2N, K]; else y [R, N] f32 = x . w^T, added to y when accumulate. With norm, x is norm's output
 * (x itself unread), normalized while staged: no norm launch before. Deterministic. */
kdt_status kdt_mk_dense_small(int32_t R, const void *x, const void *w, int32_t K, int32_t N, int gate_up, void *y,
                              int accumulate, const kdt_mk_norm *norm, kdt_dtype dt, cudaStream_t s);
/* shared_gate_up [2I, hid], shared_down [hid, I] (dt; NULL: none): the layer's shared expert of the
 * same width in the same two launches, over every row, its R assignments at places R * K + r of
 * act and ye (sized R * (K + 1)); kdt_mk_moe_combine adds them. */
kdt_status kdt_mk_moe_small(int64_t R, const void *x, const int32_t *perm, int32_t K, const int32_t *counts, const int32_t *offs,
                            const void *w_gate_up, const void *w_down, const void *shared_gate_up, const void *shared_down,
                            int32_t E, int32_t hid, int32_t I, void *act, float *ye, kdt_dtype dt, cudaStream_t s);

/* xe [n, hid] (dt) = rows perm[j] / K of x [*, hid] (dt). */
kdt_status kdt_mk_gather_rows(const void *x, const int32_t *perm, int64_t n, int32_t K, int32_t hid, void *xe,
                              kdt_dtype dt, cudaStream_t s);

/* x [R, hid] += sum over each row's valid choices, in increasing expert order, of
 * wt[r, k] * ye[pos[r * K + k]] (ye [*, hid] f32), then, with shared (kdt_mk_moe_small's shared
 * expert), + ye[R * K + r]: the bits of the combine followed by the shared down projection
 * accumulating into x. */
kdt_status kdt_mk_moe_combine(float *x, const float *ye, const int32_t *idx, const float *wt, const int32_t *pos, int64_t R,
                              int32_t K, int32_t E, int32_t hid, int shared, cudaStream_t s);

#ifdef __cplusplus
}
#endif
