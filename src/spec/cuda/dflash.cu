/* The DFlash drafter's forward on CUDA (src/spec/dflash.h; the CPU version is src/spec/dflash.c,
 * whose steps this follows). Observe: the kept rows of the target's layer states (device, written
 * there by the target's forward) are gathered, projected by fc, normed by hidden_norm, and turned
 * by each layer's k_proj / v_proj (k_norm, rope at the token's position) into that layer's context
 * keys and values, f32 [slots, L, max_len, KV * hd]. Propose: the B blocks [root, mask, ...] go
 * through the layers as B * bs rows: one GEMM for q, k and v, the per-head norms and rope, the
 * attention of each block row over its slot's context and its whole block, o_proj, the SiLU MLP;
 * then the final norm of rows 1 .. D of each block, the target's LM head, and the top K of each
 * row's log-softmax (src/spec/cuda/rows.cu) straight into the drafter's scores and tokens. */
#include <cuda_bf16.h>
#include <cublas_v2.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cuda/cuda_common.cuh"
#include "model/cuda.h"
#include "model/cuda/kernels.h"
#include "spec/dflash.h"
#include "spec/internal.h"


namespace {

constexpr int kObsChunk = 256;  /* context rows per observe pass */
constexpr int kAttnWarps = 4;
constexpr int kMaxHd = 256;     /* head_dim: even, at most this (lanes past it are masked) */

struct Layer {
    float *in_norm, *post_norm, *q_norm, *k_norm; /* [hid], [hid], [hd], [hd] */
    void *qkv;                                    /* [qd + 2 kvd, hid]: q rows, k rows, v rows */
    void *o;                                      /* [hid, qd] */
    void *gate_up;                                /* [2I, hid] */
    void *down;                                   /* [hid, I] */
};

} // namespace

struct dfl_dev {
    dfl_config c;
    kdt_dtype dt;
    cudaDataType ct;
    size_t es;
    int32_t slots, max_len, D, qd, kvd;
    const void *embed, *lm_head;      /* the target's [V, hid] (dt) */
    void *fc;                         /* [hid, nT * hid] */
    float *hidden_norm, *norm, *inv_freq;
    Layer *ly;                        /* [L] */
    float *kc, *vc;                   /* [slots, L, max_len, kvd] */
    /* scratch: propose (RB = slots * bs rows) */
    float *x, *qkv, *gu, *logits;     /* [RB, hid], [RB, qd + 2 kvd], [RB, 2I], [slots * D, V] */
    void *hn, *att, *act;             /* [RB, hid], [RB, qd], [RB, I] (dt) */
    /* scratch: observe (kObsChunk rows) */
    void *feat, *chn;                 /* [ch, nT * hid], [ch, hid] (dt) */
    float *ctx, *kv;                  /* [ch, hid], [ch, 2 kvd] */
    int32_t *d_idx, *h_idx;           /* device / pinned host: small index lists */
    cublasHandle_t blas;
    void **allocs;
    size_t n_allocs, cap_allocs;
};

namespace {

__device__ float block_sum(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int w = threadIdx.x / 32, nw = (blockDim.x + 31) / 32;
    __syncthreads();
    if (threadIdx.x % 32 == 0) red[w] = v;
    __syncthreads();
    float t = 0.0f;
    for (int i = 0; i < nw; i++) t += red[i];
    return t;
}

/* One head [hd]: RMSNorm with w, then rope at pos (rotate-half, Qwen3's), from in to out (which may
 * be in). sh [hd] shared. */
__device__ void norm_rope(const float *in, float *out, const float *w, int hd, int pos, const float *inv_freq, float eps,
                          float *sh, float *red) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) ss += in[i] * in[i];
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)hd + eps);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) sh[i] = in[i] * r * w[i];
    __syncthreads();
    const int half = hd / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float f = (float)pos * inv_freq[i], c = cosf(f), s = sinf(f), a = sh[i], b = sh[i + half];
        out[i] = a * c - b * s;
        out[i + half] = b * c + a * s;
    }
}

/* Block rows: heads 0 .. H-1 (q) then H .. H+KV-1 (k) of qkv [R, ld] in place; row r at pos[r]. */
__global__ void qk_prep(float *qkv, int64_t ld, const int32_t *pos, int H, int hd, const float *q_norm, const float *k_norm,
                        const float *inv_freq, float eps) {
    extern __shared__ float sh[];
    __shared__ float red[32];
    const int r = blockIdx.x, h = blockIdx.y;
    float *e = qkv + r * ld + (int64_t)h * hd;
    norm_rope(e, e, h < H ? q_norm : k_norm, hd, pos[r], inv_freq, eps, sh, red);
}

/* Context rows: kv [n, 2 kvd] (k, then v) into layer l's cache at (slot[i], pos[i]). */
__global__ void kv_store(const float *kv, int kvd, const int32_t *slot, const int32_t *pos, int L, int l, int max_len, int hd,
                         const float *k_norm, const float *inv_freq, float eps, float *kc, float *vc) {
    extern __shared__ float sh[];
    __shared__ float red[32];
    const int i = blockIdx.x, g = blockIdx.y;
    const int64_t at = (((int64_t)slot[i] * L + l) * max_len + pos[i]) * kvd + (int64_t)g * hd;
    const float *k = kv + (int64_t)i * 2 * kvd + (int64_t)g * hd;
    for (int j = threadIdx.x; j < hd; j += blockDim.x) vc[at + j] = k[kvd + j];
    norm_rope(k, kc + at, k_norm, hd, pos[i], inv_freq, eps, sh, red);
}

template <typename T> __device__ T to_t(float v);
template <> __device__ float to_t<float>(float v) { return v; }
template <> __device__ __nv_bfloat16 to_t<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

/* Row r of the B * bs block rows, query head h: softmax(q . k / sqrt(hd)) . v over its slot's n
 * context keys, then its block's bs keys (no mask); online softmax per warp, warps merged. */
template <typename T, int E>
__global__ void block_attn(const float *qkv, int64_t ld, const float *kc, const float *vc, const int32_t *slot,
                           const int32_t *n_ctx, int bs, int L, int l, int max_len, int H, int KV, int hd, float scale, T *out) {
    __shared__ float sm[kAttnWarps], sl[kAttnWarps], sacc[kAttnWarps][kMaxHd];
    const int r = blockIdx.y, h = blockIdx.x, b = r / bs, g = h / (H / KV), lane = threadIdx.x % 32, w = threadIdx.x / 32;
    const int qd = H * hd, kvd = KV * hd, n = n_ctx[b];
    const float *q = qkv + r * ld + (int64_t)h * hd;
    const float *kbase = kc + ((int64_t)slot[b] * L + l) * max_len * kvd + (int64_t)g * hd;
    const float *vbase = vc + ((int64_t)slot[b] * L + l) * max_len * kvd + (int64_t)g * hd;
    float qr[E], acc[E], m = -INFINITY, lsum = 0.0f;
    for (int t = 0; t < E; t++) qr[t] = lane + 32 * t < hd ? q[lane + 32 * t] : 0.0f, acc[t] = 0.0f;
    for (int j = w; j < n + bs; j += kAttnWarps) {
        const float *k, *v;
        if (j < n) k = kbase + (int64_t)j * kvd, v = vbase + (int64_t)j * kvd;
        else k = qkv + (int64_t)(b * bs + j - n) * ld + qd + (int64_t)g * hd, v = k + kvd;
        float dot = 0.0f;
        for (int t = 0; t < E; t++)
            if (lane + 32 * t < hd) dot += qr[t] * k[lane + 32 * t];
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        const float s = dot * scale, mn = fmaxf(m, s), corr = expf(m - mn), p = expf(s - mn);
        lsum = lsum * corr + p;
        for (int t = 0; t < E; t++) acc[t] = acc[t] * corr + (lane + 32 * t < hd ? p * v[lane + 32 * t] : 0.0f);
        m = mn;
    }
    for (int t = 0; t < E; t++)
        if (lane + 32 * t < hd) sacc[w][lane + 32 * t] = acc[t];
    if (lane == 0) sm[w] = m, sl[w] = lsum;
    __syncthreads();
    float M = -INFINITY;
    for (int i = 0; i < kAttnWarps; i++) M = fmaxf(M, sm[i]);
    float den = 0.0f;
    for (int i = 0; i < kAttnWarps; i++) den += sm[i] == -INFINITY ? 0.0f : sl[i] * expf(sm[i] - M);
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        float num = 0.0f;
        for (int i = 0; i < kAttnWarps; i++) num += sm[i] == -INFINITY ? 0.0f : sacc[i][e] * expf(sm[i] - M);
        out[(int64_t)r * qd + (int64_t)h * hd + e] = to_t<T>(num / den);
    }
}

/* y [n, W] (dt) = rows rows[i] of x [*, W] f32. */
template <typename T>
__global__ void gather_rows(const float *x, const int32_t *rows, int64_t W, T *y) {
    const int i = blockIdx.y;
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < W; j += (int64_t)gridDim.x * blockDim.x)
        y[i * W + j] = to_t<T>(x[rows[i] * W + j]);
}

template <typename T>
__global__ void convert(const float *x, int64_t n, T *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) y[i] = to_t<T>(x[i]);
}

__global__ void scale(float *x, int64_t n, float s) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) x[i] *= s;
}

int grid_of(int64_t n) { return (int)((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096); }

kdt_status dalloc(dfl_dev *g, size_t nbytes, void **out) {
    if (g->n_allocs == g->cap_allocs) {
        const size_t cap = g->cap_allocs ? 2 * g->cap_allocs : 64;
        void **a = (void **)realloc(g->allocs, cap * sizeof *a);
        if (!a) return kdt_fail(KDT_ERR_NOMEM, "dflash cuda: out of memory");
        g->allocs = a;
        g->cap_allocs = cap;
    }
    cudaError_t e = cudaMalloc(out, nbytes ? nbytes : 1);
    if (e != cudaSuccess) {
        *out = nullptr;
        (void)cudaGetLastError();
        return kdt_fail(KDT_ERR_NOMEM, "dflash cuda: cudaMalloc of %zu bytes: %s", nbytes, cudaGetErrorString(e));
    }
    g->allocs[g->n_allocs++] = *out;
    return KDT_OK;
}

/* A device tensor of n elements (dt, or f32 when f32) from host src [n], or random: uniform in
 * center +- spread. */
kdt_status weight(dfl_dev *g, const float *src, size_t n, bool f32, uint64_t seed, float center, float spread, void **out) {
    const kdt_dtype dt = f32 ? KDT_F32 : g->dt;
    KDT_TRY(dalloc(g, n * kdt_dtype_size(dt), out));
    if (!src) return kdt_cuda_fill_uniform(*out, dt, n, seed, center, spread);
    if (dt == KDT_F32) {
        KDT_CUDA_CHECK(cudaMemcpy(*out, src, n * 4, cudaMemcpyHostToDevice));
        return KDT_OK;
    }
    float *tmp = nullptr;
    KDT_CUDA_CHECK(cudaMalloc(&tmp, n * 4));
    cudaError_t e = cudaMemcpy(tmp, src, n * 4, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) {
        convert<<<grid_of((int64_t)n), 256>>>(tmp, (int64_t)n, (__nv_bfloat16 *)*out);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    (void)cudaFree(tmp);
    if (e != cudaSuccess) return kdt_fail(KDT_ERR_CUDA, "dflash cuda: uploading weights: %s", cudaGetErrorString(e));
    return KDT_OK;
}

/* Several host matrices stacked in one device tensor: parts[i] of rows[i] x cols. */
kdt_status stacked(dfl_dev *g, const float *const *parts, const int64_t *rows, int np, int64_t cols, uint64_t seed, void **out) {
    int64_t total = 0;
    for (int i = 0; i < np; i++) total += rows[i];
    if (!parts) return weight(g, nullptr, (size_t)(total * cols), false, seed, 0.0f, 1.0f / sqrtf((float)cols), out);
    float *h = (float *)malloc((size_t)(total * cols) * sizeof *h);
    if (!h) return kdt_fail(KDT_ERR_NOMEM, "dflash cuda: out of memory staging weights");
    for (int i = 0, off = 0; i < np; off += (int)rows[i], i++) memcpy(h + off * cols, parts[i], (size_t)(rows[i] * cols) * sizeof *h);
    const kdt_status s = weight(g, h, (size_t)(total * cols), false, 0, 0, 0, out);
    free(h);
    return s;
}

kdt_status upload(dfl_dev *g, const dfl_model *m, uint64_t seed) {
    const dfl_config &c = g->c;
    const int64_t hid = c.hid, hd = c.hd, I = c.I;
    uint64_t sd = seed;
    KDT_TRY(weight(g, m ? m->fc : nullptr, (size_t)(hid * c.nT * hid), false, ++sd, 0.0f, 1.0f / sqrtf((float)(c.nT * hid)), &g->fc));
    KDT_TRY(weight(g, m ? m->hidden_norm : nullptr, (size_t)hid, true, ++sd, 1.0f, 0.1f, (void **)&g->hidden_norm));
    KDT_TRY(weight(g, m ? m->norm : nullptr, (size_t)hid, true, ++sd, 1.0f, 0.1f, (void **)&g->norm));
    for (int32_t l = 0; l < c.L; l++) {
        const dfl_layer *w = m ? &m->layers[l] : nullptr;
        Layer &d = g->ly[l];
        const float *qkv[3] = {w ? w->q : nullptr, w ? w->k : nullptr, w ? w->v : nullptr};
        const float *gu[2] = {w ? w->gate : nullptr, w ? w->up : nullptr};
        const int64_t qkv_rows[3] = {g->qd, g->kvd, g->kvd}, gu_rows[2] = {I, I};
        KDT_TRY(weight(g, w ? w->in_norm : nullptr, (size_t)hid, true, ++sd, 1.0f, 0.1f, (void **)&d.in_norm));
        KDT_TRY(weight(g, w ? w->post_norm : nullptr, (size_t)hid, true, ++sd, 1.0f, 0.1f, (void **)&d.post_norm));
        KDT_TRY(weight(g, w ? w->q_norm : nullptr, (size_t)hd, true, ++sd, 1.0f, 0.1f, (void **)&d.q_norm));
        KDT_TRY(weight(g, w ? w->k_norm : nullptr, (size_t)hd, true, ++sd, 1.0f, 0.1f, (void **)&d.k_norm));
        KDT_TRY(stacked(g, w ? qkv : nullptr, qkv_rows, 3, hid, ++sd, &d.qkv));
        KDT_TRY(weight(g, w ? w->o : nullptr, (size_t)(hid * g->qd), false, ++sd, 0.0f, 1.0f / sqrtf((float)g->qd), &d.o));
        KDT_TRY(stacked(g, w ? gu : nullptr, gu_rows, 2, hid, ++sd, &d.gate_up));
        KDT_TRY(weight(g, w ? w->down : nullptr, (size_t)(hid * I), false, ++sd, 0.0f, 1.0f / sqrtf((float)I), &d.down));
    }
    float *inv = (float *)malloc((size_t)(hd / 2) * sizeof *inv);
    if (!inv) return kdt_fail(KDT_ERR_NOMEM, "dflash cuda: out of memory");
    for (int32_t i = 0; i < hd / 2; i++) inv[i] = m ? m->inv_freq[i] : (float)pow(c.theta, -2.0 * i / hd);
    const kdt_status s = weight(g, inv, (size_t)(hd / 2), true, 0, 0, 0, (void **)&g->inv_freq);
    free(inv);
    return s;
}

/* y [M, N] f32 (+)= x [M, K] (dt) . W^T, W [N, K] (dt). */
kdt_status mm(dfl_dev *g, int64_t M, int64_t N, int64_t K, const void *W, const void *x, float *y, float beta) {
    const float one = 1.0f;
    KDT_CUBLAS_CHECK(cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)M, (int)K, &one, W, g->ct, (int)K, x, g->ct,
                                  (int)K, &beta, y, CUDA_R_32F, (int)N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return KDT_OK;
}

kdt_status attn(dfl_dev *g, int32_t l, int32_t R, const int32_t *slot, const int32_t *n_ctx, cudaStream_t s) {
    const dfl_config &c = g->c;
    const dim3 grid((unsigned)c.H, (unsigned)R);
    const float sc = 1.0f / sqrtf((float)c.hd);
    const int64_t ld = g->qd + 2 * g->kvd;
#define DFL_ATTN(T, E)                                                                                                  \
    block_attn<T, E><<<grid, 32 * kAttnWarps, 0, s>>>(g->qkv, ld, g->kc, g->vc, slot, n_ctx, c.bs, c.L, l, g->max_len, c.H, \
                                                       c.KV, c.hd, sc, (T *)g->att)
    const int E = (c.hd + 31) / 32;
    if (g->dt == KDT_F32) {
        if (E <= 4) DFL_ATTN(float, 4);
        else DFL_ATTN(float, 8);
    } else {
        if (E <= 4) DFL_ATTN(__nv_bfloat16, 4);
        else DFL_ATTN(__nv_bfloat16, 8);
    }
#undef DFL_ATTN
    KDT_CUDA_CHECK_LAUNCH("dflash block_attn");
    return KDT_OK;
}

/* One layer over the B * bs block rows in g->x (f32, updated in place); pos [R], slot [B], n_ctx [B] device. */
kdt_status layer(dfl_dev *g, int32_t l, int32_t B, const int32_t *pos, const int32_t *slot, const int32_t *n_ctx, cudaStream_t s) {
    const dfl_config &c = g->c;
    const Layer &w = g->ly[l];
    const int32_t R = B * c.bs, hid = c.hid;
    const int64_t ld = g->qd + 2 * g->kvd;
    KDT_TRY(kdt_mk_rmsnorm(g->x, hid, nullptr, R, hid, w.in_norm, c.eps, nullptr, 0, g->hn, hid, g->dt, s));
    KDT_TRY(mm(g, R, ld, hid, w.qkv, g->hn, g->qkv, 0.0f));
    qk_prep<<<dim3((unsigned)R, (unsigned)(c.H + c.KV)), 64, (size_t)c.hd * 4, s>>>(g->qkv, ld, pos, c.H, c.hd, w.q_norm, w.k_norm,
                                                                                   g->inv_freq, c.eps);
    KDT_CUDA_CHECK_LAUNCH("dflash qk_prep");
    KDT_TRY(attn(g, l, R, slot, n_ctx, s));
    KDT_TRY(mm(g, R, hid, g->qd, w.o, g->att, g->x, 1.0f));
    KDT_TRY(kdt_mk_rmsnorm(g->x, hid, nullptr, R, hid, w.post_norm, c.eps, nullptr, 0, g->hn, hid, g->dt, s));
    KDT_TRY(mm(g, R, 2 * (int64_t)c.I, hid, w.gate_up, g->hn, g->gu, 0.0f));
    KDT_TRY(kdt_mk_silu_mul(g->gu, R, c.I, g->act, g->dt, s));
    return mm(g, R, hid, c.I, w.down, g->act, g->x, 1.0f);
}

kdt_status setup(dfl_dev *g, const dfl_model *m, uint64_t seed) {
    const dfl_config &c = g->c;
    if (c.hd % 2 || c.hd > kMaxHd || c.H > 65535 || c.H % c.KV)
        return kdt_fail(KDT_ERR_UNSUPPORTED, "dflash cuda: head_dim %d must be even and at most %d (heads %d, kv heads %d)", c.hd,
                        kMaxHd, c.H, c.KV);
    KDT_CUBLAS_CHECK(cublasCreate(&g->blas));
    KDT_CUBLAS_CHECK(cublasSetMathMode(g->blas, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    g->ly = (Layer *)calloc((size_t)c.L, sizeof *g->ly);
    if (!g->ly) return kdt_fail(KDT_ERR_NOMEM, "dflash cuda: out of memory");
    KDT_TRY(upload(g, m, seed));
    const size_t S = (size_t)g->slots, RB = S * c.bs, es = g->es, hid = (size_t)c.hid, ch = kObsChunk;
    const size_t kv = S * c.L * g->max_len * g->kvd * 4;
    KDT_TRY(dalloc(g, kv, (void **)&g->kc));
    KDT_TRY(dalloc(g, kv, (void **)&g->vc));
    KDT_TRY(dalloc(g, RB * hid * 4, (void **)&g->x));
    KDT_TRY(dalloc(g, RB * (g->qd + 2 * g->kvd) * 4, (void **)&g->qkv));
    KDT_TRY(dalloc(g, RB * 2 * c.I * 4, (void **)&g->gu));
    KDT_TRY(dalloc(g, S * g->D * c.V * 4, (void **)&g->logits));
    KDT_TRY(dalloc(g, RB * hid * es, &g->hn));
    KDT_TRY(dalloc(g, RB * g->qd * es, &g->att));
    KDT_TRY(dalloc(g, RB * c.I * es, &g->act));
    KDT_TRY(dalloc(g, ch * c.nT * hid * es, &g->feat));
    KDT_TRY(dalloc(g, ch * hid * es, &g->chn));
    KDT_TRY(dalloc(g, ch * hid * 4, (void **)&g->ctx));
    KDT_TRY(dalloc(g, ch * 2 * g->kvd * 4, (void **)&g->kv));
    const size_t idx = 3 * (ch > RB ? ch : RB) + 2 * S + S * g->D;
    KDT_TRY(dalloc(g, idx * 4, (void **)&g->d_idx));
    KDT_CUDA_CHECK(cudaMallocHost((void **)&g->h_idx, idx * 4));
    KDT_CUDA_CHECK(cudaDeviceSynchronize()); /* the uploads and fills, before any stream uses them */
    return KDT_OK;
}

/* The host index list h_idx [n] to d_idx, on s (the pinned buffer is reused only after a later sync). */
kdt_status put_idx(dfl_dev *g, size_t n, cudaStream_t s) {
    KDT_CUDA_CHECK(cudaMemcpyAsync(g->d_idx, g->h_idx, n * 4, cudaMemcpyHostToDevice, s));
    return KDT_OK;
}

} // namespace

extern "C" void dfl_dev_free(dfl_dev *g) {
    if (!g) return;
    if (g->blas) (void)cublasDestroy(g->blas);
    for (size_t i = 0; i < g->n_allocs; i++) (void)cudaFree(g->allocs[i]);
    if (g->h_idx) (void)cudaFreeHost(g->h_idx);
    free(g->allocs);
    free(g->ly);
    free(g);
}

extern "C" kdt_status dfl_dev_create(const dfl_model *m, const dfl_config *c, uint64_t seed, const void *embed, const void *lm_head,
                                     kdt_dtype dt, int32_t slots, int32_t max_len, int32_t D, dfl_dev **out) {
    *out = nullptr;
    if (dt != KDT_F32 && dt != KDT_BF16) return kdt_fail(KDT_ERR_DTYPE, "dflash cuda: the target's dtype must be f32 or bf16");
    dfl_dev *g = (dfl_dev *)calloc(1, sizeof *g);
    if (!g) return kdt_fail(KDT_ERR_NOMEM, "dflash cuda: out of memory");
    g->c = m ? m->c : *c;
    g->dt = dt;
    g->ct = dt == KDT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    g->es = kdt_dtype_size(dt);
    g->slots = slots;
    g->max_len = max_len;
    g->D = D;
    g->qd = g->c.H * g->c.hd;
    g->kvd = g->c.KV * g->c.hd;
    g->embed = embed;
    g->lm_head = lm_head;
    const kdt_status s = setup(g, m, seed);
    if (s != KDT_OK) {
        (void)cudaDeviceSynchronize();
        dfl_dev_free(g);
        return s;
    }
    *out = g;
    return KDT_OK;
}

extern "C" kdt_status dfl_dev_observe(dfl_dev *g, int32_t n, const float *hidden, const int32_t *rows, const int32_t *slot,
                                      const int32_t *pos, void *stream) {
    const dfl_config &c = g->c;
    cudaStream_t s = (cudaStream_t)stream;
    KDT_CUBLAS_CHECK(cublasSetStream(g->blas, s));
    const int64_t W = (int64_t)c.nT * c.hid;
    for (int32_t i0 = 0; i0 < n; i0 += kObsChunk) {
        const int32_t k = n - i0 < kObsChunk ? n - i0 : kObsChunk;
        KDT_CUDA_CHECK(cudaStreamSynchronize(s)); /* the previous chunk's index list is read */
        memcpy(g->h_idx, rows + i0, (size_t)k * 4);
        memcpy(g->h_idx + k, slot + i0, (size_t)k * 4);
        memcpy(g->h_idx + 2 * k, pos + i0, (size_t)k * 4);
        KDT_TRY(put_idx(g, 3 * (size_t)k, s));
        const dim3 gg((unsigned)((W + 255) / 256 < 64 ? (W + 255) / 256 : 64), (unsigned)k);
        if (g->dt == KDT_F32) gather_rows<<<gg, 256, 0, s>>>(hidden, g->d_idx, W, (float *)g->feat);
        else gather_rows<<<gg, 256, 0, s>>>(hidden, g->d_idx, W, (__nv_bfloat16 *)g->feat);
        KDT_CUDA_CHECK_LAUNCH("dflash gather_rows");
        KDT_TRY(mm(g, k, c.hid, W, g->fc, g->feat, g->ctx, 0.0f));
        KDT_TRY(kdt_mk_rmsnorm(g->ctx, c.hid, nullptr, k, c.hid, g->hidden_norm, c.eps, nullptr, 0, g->chn, c.hid, g->dt, s));
        for (int32_t l = 0; l < c.L; l++) {
            const void *wkv = (const char *)g->ly[l].qkv + (size_t)g->qd * c.hid * g->es; /* the k and v rows */
            KDT_TRY(mm(g, k, 2 * (int64_t)g->kvd, c.hid, wkv, g->chn, g->kv, 0.0f));
            kv_store<<<dim3((unsigned)k, (unsigned)c.KV), 64, (size_t)c.hd * 4, s>>>(
                g->kv, g->kvd, g->d_idx + k, g->d_idx + 2 * k, c.L, l, g->max_len, c.hd, g->ly[l].k_norm, g->inv_freq, c.eps, g->kc, g->vc);
            KDT_CUDA_CHECK_LAUNCH("dflash kv_store");
        }
    }
    return KDT_OK;
}

extern "C" kdt_status dfl_dev_propose(dfl_dev *g, int32_t B, const int32_t *slot, const int32_t *root, const int32_t *n_ctx,
                                      int32_t K, float *scores, int32_t *tokens, void *stream) {
    const dfl_config &c = g->c;
    cudaStream_t s = (cudaStream_t)stream;
    const int32_t R = B * c.bs, D = g->D;
    KDT_CUBLAS_CHECK(cublasSetStream(g->blas, s));
    KDT_CUDA_CHECK(cudaStreamSynchronize(s)); /* h_idx is free */
    int32_t *tok = g->h_idx, *pos = tok + R, *sl = pos + R, *nc = sl + B, *last = nc + B;
    for (int32_t b = 0; b < B; b++) {
        for (int32_t r = 0; r < c.bs; r++) {
            tok[b * c.bs + r] = r == 0 ? root[b] : c.mask;
            pos[b * c.bs + r] = n_ctx[b] + r;
        }
        sl[b] = slot[b];
        nc[b] = n_ctx[b];
        for (int32_t d = 0; d < D; d++) last[b * D + d] = b * c.bs + 1 + d;
    }
    KDT_TRY(put_idx(g, 2 * (size_t)R + 2 * B + (size_t)B * D, s));
    const int32_t *d_tok = g->d_idx, *d_pos = d_tok + R, *d_sl = d_pos + R, *d_nc = d_sl + B, *d_last = d_nc + B;
    KDT_TRY(kdt_mk_embed(g->x, g->embed, g->dt, d_tok, R, c.hid, s));
    if (c.emb_scale != 1.0f) {
        scale<<<grid_of((int64_t)R * c.hid), 256, 0, s>>>(g->x, (int64_t)R * c.hid, c.emb_scale);
        KDT_CUDA_CHECK_LAUNCH("dflash scale");
    }
    for (int32_t l = 0; l < c.L; l++) KDT_TRY(layer(g, l, B, d_pos, d_sl, d_nc, s));
    KDT_TRY(kdt_mk_rmsnorm(g->x, c.hid, d_last, (int64_t)B * D, c.hid, g->norm, c.eps, nullptr, 0, g->hn, c.hid, g->dt, s));
    KDT_TRY(mm(g, (int64_t)B * D, c.V, c.hid, g->lm_head, g->hn, g->logits, 0.0f));
    if (c.out_mult != 1.0f) {
        scale<<<grid_of((int64_t)B * D * c.V), 256, 0, s>>>(g->logits, (int64_t)B * D * c.V, c.out_mult);
        KDT_CUDA_CHECK_LAUNCH("dflash scale");
    }
    return kdt_spec_topk_cuda(g->logits, (int64_t)B * D, c.V, K, scores, tokens, K, nullptr, stream);
}
