/* Kernels of the model's CUDA forward (see kernels.h), and the device fills of
 * src/model/cuda.h. Each step follows the CPU reference (src/model/forward_cpu.c) operation for
 * operation in f32; only reduction orders differ. Element-wise kernels use grid-stride loops over
 * int64 indices; row kernels take one block per row. */
#include "common/cuda/cuda_common.cuh"
#include "model/cuda.h"
#include "model/cuda/kernels.h"
#include "model/cuda/pdl.cuh"

namespace {

thread_local bool g_pdl = false; /* kdt_mk_set_pdl: the calling thread's forward launches with PDL */

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1 << 16;
constexpr int kMaxTopk = 64; /* CUDA_MAX_TOPK of src/model/model.c */
constexpr int kNormBlocks = 128, kNormSpan = 1024; /* kdt_mk_rmsnorm's grid for small batches */

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

unsigned grid_for(int64_t n) {
    const int64_t b = (n + kThreads - 1) / kThreads;
    return (unsigned)(b < 1 ? 1 : b > kMaxBlocks ? kMaxBlocks : b);
}

#define GRID_STRIDE(i, n) \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

#include "model/cuda/norm.cuh"
#include "model/cuda/route.cuh"

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it. */
__device__ float block_sum(float v) {
    __shared__ float part[32];
    __shared__ float total;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_sum(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x / 32) ? part[lane] : 0.f;
        v = warp_sum(v);
        if (lane == 0) total = v;
    }
    __syncthreads();
    return total;
}

/* 1 / sqrt(mean(x^2) + eps) of x [n], as the CPU writes it; the sum in norm.cuh's order for the
 * block's width. */
__device__ float rms_inv(const float *x, int n, float eps) {
    const float ss = block_sum(norm_sumsq_part(x, n, (int)threadIdx.x, (int)blockDim.x));
    return 1.0f / sqrtf(ss / (float)n + eps);
}

/* y = w[j] * (x[j] * inv) for j = j0 + threadIdx.x, + blockDim.x, ... < j1, to of[j] and oa[j] (T)
 * where given: 4 elements' loads in flight before their stores. */
template <typename T>
__device__ __forceinline__ void norm_store(const float *x, const float *w, float inv, int j0, int j1, float *of, T *oa) {
    const int bd = (int)blockDim.x;
    for (int j = j0 + (int)threadIdx.x; j < j1; j += 4 * bd) {
        float xv[4], wv[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const bool in = j + i * bd < j1;
            xv[i] = in ? x[j + i * bd] : 0.f;
            wv[i] = in ? w[j + i * bd] : 0.f;
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (j + i * bd >= j1) break;
            const float y = wv[i] * (xv[i] * inv);
            if (of) of[j + i * bd] = y;
            if (oa) oa[j + i * bd] = from_f32<T>(y);
        }
    }
}

/* Output element i (< 2 * half) of rope over k [2 * half]: pair j = i % half is (k[2j], k[2j+1])
 * interleaved or (k[j], k[j + half]) split; first elements rotated to i < half, second after. */
__device__ __forceinline__ float rope_at(const float *k, int i, int half, float c, float s, int interleave) {
    const int j = i < half ? i : i - half;
    const float a = interleave ? k[2 * j] : k[j], b = interleave ? k[2 * j + 1] : k[j + half];
    return i < half ? a * c - b * s : b * c + a * s;
}

template <typename T>
__global__ void embed_kernel(float *x, const T *table, const int32_t *tok, int64_t R, int hid) {
    GRID_STRIDE(i, R * hid) x[i] = to_f32(table[(int64_t)tok[i / hid] * hid + i % hid]);
}

/* Block (r, s) writes elements [s * span, (s + 1) * span) of output row r. A row of a small batch
 * is cut over several blocks, each summing the whole row itself (in the same order: the same bits
 * in every block and at every batch size), so that no block waits on another and a decode step's
 * norm is not one SM's work. */
template <typename T>
__global__ void rmsnorm_kernel(const float *in, int64_t in_ld, const int32_t *rows, int n, const float *w, float eps,
                               float *of, int64_t f_ld, T *oa, int64_t a_ld, int span) {
    kdt_pdl_begin();
    const int64_t r = blockIdx.x;
    const float *x = in + (rows ? (int64_t)rows[r] : r) * in_ld;
    const float inv = rms_inv(x, n, eps);
    const int j0 = (int)blockIdx.y * span;
    norm_store(x, w, inv, j0, min(n, j0 + span), of ? of + r * f_ld : nullptr, oa ? oa + r * a_ld : nullptr);
}

__global__ void rope_table_kernel(float *cs, float *sn, const int32_t *pos, const float *inv_freq, int64_t R, int half,
                                  float factor) {
    kdt_pdl_begin();
    GRID_STRIDE(i, R * half) {
        const float ang = (float)pos[i / half] * inv_freq[i % half];
        cs[i] = (float)cos((double)ang) * factor;
        sn[i] = (float)sin((double)ang) * factor;
    }
}

template <typename T>
__global__ void q_prep_kernel(const float *q, int64_t q_ld, const float *cs, const float *sn, int64_t R, int H, int nope,
                              int rope, int Dv, int interleave, T *qn, T *qabs) {
    const int qk = nope + rope, half = rope / 2;
    GRID_STRIDE(e, R * H * qk) {
        const int64_t rh = e / qk, r = rh / H;
        const int i = (int)(e % qk), h = (int)(rh % H);
        const float *qh = q + r * q_ld + (int64_t)h * qk;
        if (i < nope) {
            qn[rh * nope + i] = from_f32<T>(qh[i]);
        } else {
            const int k = i - nope;
            const float v = rope_at(qh + nope, k, half, cs[r * half + k % half], sn[r * half + k % half], interleave);
            qabs[rh * (Dv + rope) + Dv + k] = from_f32<T>(v);
        }
    }
}

/* Two consecutive elements at p (4-byte aligned for bf16, 8 for f32) as floats. */
__device__ __forceinline__ float2 load2(const float *p) { return *(const float2 *)p; }
__device__ __forceinline__ float2 load2(const __nv_bfloat16 *p) { return __bfloat1622float2(*(const __nv_bfloat162 *)p); }

/* q_absorb's tile: a block's 8 warps split the nope sum, each lane owns 2 adjacent of 64 columns. */
constexpr int kAbsorbWarps = 8, kAbsorbCols = 64;

/* q_prep and the W_UK absorb in one launch, for small batches. Block (h, y, r): columns
 * [64 y, 64 y + 64) of qabs[r, h, :Dv] = q_nope . W_UK_h (q_nope rounded to T first, as the GEMM of
 * the unfused path reads it), W_UK_h the first nope rows of head h of kv_b [H, nope + vd, Dv]; warp w
 * sums rows i = w, w + 8, ... in order, then the 8 partial sums are added in warp order: f32 sums in
 * an order fixed by nope, so a row has the same bits in any batch. Blocks y == 0 also write
 * rope(q_rope) from column Dv, as q_prep. Dv even. Shared: nope floats. */
template <typename T>
__global__ void __launch_bounds__(kAbsorbWarps * 32) q_absorb_kernel(const float *q, int64_t q_ld, const float *cs, const float *sn,
                                                                     int H, int nope, int rope, int Dv, int interleave, const T *kv_b,
                                                                     int vd, T *qabs) {
    kdt_pdl_begin();
    extern __shared__ float qs[];
    __shared__ float2 part[kAbsorbWarps][kAbsorbCols / 2];
    const int64_t r = blockIdx.z, rh = r * H + blockIdx.x;
    const int h = (int)blockIdx.x, half = rope / 2, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float *qh = q + r * q_ld + (int64_t)h * (nope + rope);
    for (int i = threadIdx.x; i < nope; i += blockDim.x) qs[i] = to_f32(from_f32<T>(qh[i]));
    __syncthreads();
    T *out = qabs + rh * (Dv + rope);
    const int j = blockIdx.y * kAbsorbCols + 2 * lane;
    float2 acc = {0.f, 0.f};
    if (j < Dv) {
        const T *w = kv_b + (int64_t)h * (nope + vd) * Dv + j;
#pragma unroll 4
        for (int i = warp; i < nope; i += kAbsorbWarps) {
            const float2 v = load2(w + (int64_t)i * Dv);
            acc.x = fmaf(qs[i], v.x, acc.x);
            acc.y = fmaf(qs[i], v.y, acc.y);
        }
    }
    part[warp][lane] = acc;
    __syncthreads();
    if (warp == 0 && j < Dv) {
        float2 t = part[0][lane];
        for (int k = 1; k < kAbsorbWarps; k++) t.x += part[k][lane].x, t.y += part[k][lane].y;
        out[j] = from_f32<T>(t.x);
        out[j + 1] = from_f32<T>(t.y);
    }
    if (blockIdx.y == 0)
        for (int k = threadIdx.x; k < rope; k += blockDim.x)
            out[Dv + k] = from_f32<T>(rope_at(qh + nope, k, half, cs[r * half + k % half], sn[r * half + k % half], interleave));
}

/* Block (r, 0): row r's latent cache row. Block (r, 1), with q_in: the q_a norm of the same
 * projection's row, so that both norms of [q_a | kv_a] are one launch. 256 threads: the q_a norm
 * has the bits of kdt_mk_rmsnorm's (the unfused path). */
template <typename T>
__global__ void kv_append_kernel(const float *ckv, int64_t ld, const float *w, float eps, const float *cs, const float *sn,
                                 const int64_t *slot_rows, int Dv, int rope, int interleave, T *pool, const float *q_in,
                                 const float *q_w, int ql, T *qa) {
    kdt_pdl_begin();
    const int64_t r = blockIdx.x;
    if (blockIdx.y == 1) {
        const float *x = q_in + r * ld;
        norm_store(x, q_w, rms_inv(x, ql, eps), 0, ql, (float *)nullptr, qa + r * ql);
        return;
    }
    const float *x = ckv + r * ld;
    T *dst = pool + slot_rows[r] * (Dv + rope);
    norm_store(x, w, rms_inv(x, Dv, eps), 0, Dv, (float *)nullptr, dst);
    const int half = rope / 2;
    for (int k = threadIdx.x; k < rope; k += blockDim.x)
        dst[Dv + k] = from_f32<T>(rope_at(x + Dv, k, half, cs[r * half + k % half], sn[r * half + k % half], interleave));
}

template <typename T>
__global__ void silu_mul_kernel(const float *gu, int64_t n, int I, T *out) {
    GRID_STRIDE(e, n * I) {
        const int64_t j = e / I;
        const int i = (int)(e % I);
        const float g = gu[j * 2 * I + i], u = gu[j * 2 * I + I + i];
        out[e] = from_f32<T>(g / (1.0f + expf(-g)) * u);
    }
}

/* One warp per row (route.cuh's route_row); shared: route_scratch_bytes. */
__global__ void route_kernel(const float *logits, const float *bias, int E, int G, int topk_group, int K, int norm,
                             float scale, int32_t *idx, float *wt) {
    extern __shared__ float sm[];
    const int64_t r = blockIdx.x;
    route_row(logits + r * E, bias, E, G, topk_group, K, norm, scale, idx + r * K, wt + r * K, sm);
}

/* Block e counts the assignments of expert e. */
__global__ void moe_count_kernel(const int32_t *idx, int64_t n, int32_t *counts) {
    const int e = blockIdx.x;
    int c = 0;
    for (int64_t b0 = 0; b0 < n; b0 += blockDim.x) {
        const int64_t j = b0 + threadIdx.x;
        c += __syncthreads_count(j < n && idx[j] == e);
    }
    if (threadIdx.x == 0) counts[e] = c;
}

/* Block e writes the assignments of expert e, in order, after those of experts 0 .. e-1. */
__global__ void moe_fill_kernel(const int32_t *idx, int64_t n, const int32_t *counts, int32_t *offs, int32_t *perm,
                                int32_t *pos) {
    __shared__ int warp_n[kThreads / 32];
    __shared__ int base;
    const int e = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (threadIdx.x == 0) {
        int off = 0;
        for (int i = 0; i < e; i++) off += counts[i];
        base = off;
        if (offs) offs[e] = off;
    }
    __syncthreads();
    int run = base;
    for (int64_t b0 = 0; b0 < n; b0 += blockDim.x) {
        const int64_t j = b0 + threadIdx.x;
        const bool mine = j < n && idx[j] == e;
        const unsigned ballot = __ballot_sync(0xffffffffu, mine);
        if (lane == 0) warp_n[warp] = __popc(ballot);
        __syncthreads();
        int before = 0, total = 0;
        for (int w = 0; w < (int)(blockDim.x / 32); w++) {
            before += w < warp ? warp_n[w] : 0;
            total += warp_n[w];
        }
        if (mine) {
            const int p = run + before + __popc(ballot & ((1u << lane) - 1u));
            perm[p] = (int32_t)j;
            pos[j] = p;
        }
        run += total;
        __syncthreads(); /* warp_n is rewritten by the next chunk */
    }
}

template <typename T>
__global__ void gather_rows_kernel(const T *x, const int32_t *perm, int64_t n, int K, int hid, T *xe) {
    GRID_STRIDE(e, n * hid) xe[e] = x[(int64_t)(perm[e / hid] / K) * hid + e % hid];
}

/* V consecutive floats at p (16-byte aligned for V = 4). */
template <int V> __device__ __forceinline__ void loadv(const float *p, float (&v)[V]) {
    if (V == 4) {
        const float4 t = *(const float4 *)p;
        v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
    } else {
#pragma unroll
        for (int i = 0; i < V; i++) v[i] = p[i];
    }
}

/* Block (r, s): elements [s * blockDim.x * V, ...) of row r, V a thread (V = 4 where hid % 4 == 0),
 * so that a decode step's row is spread over hid / 1024 SMs. Warp 0 first puts the row's valid
 * choices in increasing expert order (equal ids by k, as an insertion sort) in shared memory, each
 * lane ranking its own; then every element adds them in that order, then the shared expert: one
 * order, whatever the grid. */
template <int V>
__global__ void moe_combine_kernel(float *x, const float *ye, const int32_t *idx, const float *wt, const int32_t *pos, int64_t R,
                                   int K, int E, int hid, int shared) {
    kdt_pdl_begin();
    __shared__ int sidx[kMaxTopk];
    __shared__ float swt[kMaxTopk];
    __shared__ const float *src[kMaxTopk];
    __shared__ int cnt;
    const int64_t r = blockIdx.x;
    if (threadIdx.x < 32) {
        const int lane = (int)threadIdx.x;
        for (int k = lane; k < K; k += 32) sidx[k] = idx[r * K + k];
        __syncwarp();
        int c = 0;
        for (int k0 = 0; k0 < K; k0 += 32) {
            const int k = k0 + lane, e = k < K ? sidx[k] : -1;
            const bool ok = e >= 0 && e < E;
            if (ok) {
                int rank = 0;
                for (int q = 0; q < K; q++) {
                    const int f = sidx[q];
                    rank += f >= 0 && f < E && (f < e || (f == e && q < k));
                }
                swt[rank] = wt[r * K + k];
                src[rank] = ye + (int64_t)pos[r * K + k] * hid;
            }
            c += __popc(__ballot_sync(0xffffffffu, ok));
        }
        if (lane == 0) cnt = c;
    }
    __syncthreads();
    const int i = ((int)blockIdx.y * (int)blockDim.x + (int)threadIdx.x) * V;
    if (i >= hid) return;
    float acc[V], y[V];
    loadv<V>(x + r * hid + i, acc);
#pragma unroll 4
    for (int t = 0; t < cnt; t++) {
        const float w = swt[t];
        loadv<V>(src[t] + i, y);
#pragma unroll
        for (int v = 0; v < V; v++) acc[v] += w * y[v];
    }
    if (shared) {
        loadv<V>(ye + (R * K + r) * hid + i, y);
#pragma unroll
        for (int v = 0; v < V; v++) acc[v] += y[v];
    }
#pragma unroll
    for (int v = 0; v < V; v++) x[r * hid + i + v] = acc[v];
}

/* splitmix64's output for state seed after c steps. */
__device__ __forceinline__ uint64_t splitmix64_at(uint64_t seed, uint64_t c) {
    uint64_t z = seed + c * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* splitmix64 of (seed, i): uniform in [center - scale, center + scale). */
template <typename T>
__global__ void fill_uniform_kernel(T *dst, size_t n, uint64_t seed, float center, float scale) {
    GRID_STRIDE(i, (int64_t)n) {
        const uint64_t z = splitmix64_at(seed, (uint64_t)i + 1);
        const float u = (float)((double)(z >> 11) * 0x1.0p-53 * 2.0 - 1.0);
        dst[i] = from_f32<T>(center + scale * u);
    }
}

/* Random bytes (quantized codes): the top byte of splitmix64 of (seed, i), masked. */
__global__ void fill_codes_kernel(uint8_t *dst, size_t n, uint64_t seed, uint8_t mask) {
    GRID_STRIDE(i, (int64_t)n) dst[i] = (uint8_t)(splitmix64_at(seed, (uint64_t)i) >> 56) & mask;
}

/* Runs F<float> or F<__nv_bfloat16> as dt says. */
#define BY_DTYPE(dt, CALL_F32, CALL_BF16)                                                                       \
    do {                                                                                                      \
        if ((dt) == KDT_F32) {                                                                                \
            CALL_F32;                                                                                         \
        } else if ((dt) == KDT_BF16) {                                                                        \
            CALL_BF16;                                                                                        \
        } else {                                                                                              \
            return kdt_fail(KDT_ERR_DTYPE, "model cuda: activation dtype %s, expected f32 or bf16",            \
                            kdt_dtype_name(dt));                                                              \
        }                                                                                                     \
    } while (0)

typedef __nv_bfloat16 bf16;

} // namespace

extern "C" kdt_status kdt_mk_embed(float *x, const void *embed, kdt_dtype dt, const int32_t *tokens, int64_t R, int32_t hid,
                                   cudaStream_t s) {
    const unsigned g = grid_for(R * hid);
    BY_DTYPE(dt, (embed_kernel<<<g, kThreads, 0, s>>>(x, (const float *)embed, tokens, R, hid)),
             (embed_kernel<<<g, kThreads, 0, s>>>(x, (const bf16 *)embed, tokens, R, hid)));
    KDT_CUDA_CHECK_LAUNCH("embed");
    return KDT_OK;
}

extern "C" kdt_status kdt_mk_rmsnorm(const float *in, int64_t in_ld, const int32_t *rows, int64_t R, int32_t n, const float *w,
                                     float eps, float *out_f32, int64_t f32_ld, void *out_act, int64_t act_ld, kdt_dtype dt,
                                     cudaStream_t s) {
    if (R == 0) return KDT_OK;
    /* Slices of at least kNormSpan elements, as many as bring the grid to kNormBlocks. */
    const int64_t want = R >= kNormBlocks ? 1 : (kNormBlocks + R - 1) / R, most = (n + kNormSpan - 1) / kNormSpan;
    const int64_t g = want < most ? want : most;
    const int span = (int)(((n + g - 1) / g + kThreads - 1) / kThreads * kThreads);
    const dim3 grid((unsigned)R, (unsigned)((n + span - 1) / span));
    BY_DTYPE(dt,
             KDT_CUDA_CHECK(kdt_pdl_launch(rmsnorm_kernel<float>, grid, dim3(kThreads), 0, s, in, in_ld, rows, n, w, eps, out_f32,
                                           f32_ld, (float *)out_act, act_ld, span)),
             KDT_CUDA_CHECK(kdt_pdl_launch(rmsnorm_kernel<bf16>, grid, dim3(kThreads), 0, s, in, in_ld, rows, n, w, eps, out_f32,
                                           f32_ld, (bf16 *)out_act, act_ld, span)));
    KDT_CUDA_CHECK_LAUNCH("rmsnorm");
    return KDT_OK;
}

extern "C" kdt_status kdt_mk_rope_table(float *cs, float *sn, const int32_t *pos, const float *inv_freq, int64_t R, int32_t half,
                                        float factor, cudaStream_t s) {
    KDT_CUDA_CHECK(kdt_pdl_launch(rope_table_kernel, dim3(grid_for(R * half)), dim3(kThreads), 0, s, cs, sn, pos, inv_freq, R, half,
                                  factor));
    KDT_CUDA_CHECK_LAUNCH("rope_table");
    return KDT_OK;
}

extern "C" kdt_status kdt_mk_q_prep(const float *q, int64_t q_ld, const float *cs, const float *sn, int64_t R, int32_t H,
                                    int32_t nope, int32_t rope, int32_t Dv, int interleave, void *qn, void *qabs, kdt_dtype dt,
                                    cudaStream_t s) {
    const unsigned g = grid_for(R * H * (nope + rope));
    BY_DTYPE(dt,
             (q_prep_kernel<<<g, kThreads, 0, s>>>(q, q_ld, cs, sn, R, H, nope, rope, Dv, interleave, (float *)qn,
                                                   (float *)qabs)),
             (q_prep_kernel<<<g, kThreads, 0, s>>>(q, q_ld, cs, sn, R, H, nope, rope, Dv, interleave, (bf16 *)qn,
                                                   (bf16 *)qabs)));
    KDT_CUDA_CHECK_LAUNCH("q_prep");
    return KDT_OK;
}

extern "C" kdt_status kdt_mk_q_absorb(const float *q, int64_t q_ld, const float *cs, const float *sn, int64_t R, int32_t H,
                                      int32_t nope, int32_t rope, int32_t Dv, int interleave, const void *kv_b, int32_t vd, void *qabs,
                                      kdt_dtype dt, cudaStream_t s) {
    if (R == 0) return KDT_OK;
    const dim3 grid((unsigned)H, (unsigned)((Dv + kAbsorbCols - 1) / kAbsorbCols), (unsigned)R);
    const size_t smem = (size_t)nope * sizeof(float);
    if (smem > 32 * 1024 || Dv % 2 || R > 65535)
        return kdt_fail(KDT_ERR_UNSUPPORTED, "model cuda: absorb of %lld rows, qk_nope_head_dim %d, kv_lora_rank %d (needs an even "
                        "rank, at most 8192 nope dims and 65535 rows)", (long long)R, nope, Dv);
    BY_DTYPE(dt,
             KDT_CUDA_CHECK(kdt_pdl_launch(q_absorb_kernel<float>, grid, dim3(kAbsorbWarps * 32), smem, s, q, q_ld, cs, sn, H, nope,
                                           rope, Dv, interleave, (const float *)kv_b, vd, (float *)qabs)),
             KDT_CUDA_CHECK(kdt_pdl_launch(q_absorb_kernel<bf16>, grid, dim3(kAbsorbWarps * 32), smem, s, q, q_ld, cs, sn, H, nope,
                                           rope, Dv, interleave, (const bf16 *)kv_b, vd, (bf16 *)qabs)));
    KDT_CUDA_CHECK_LAUNCH("q_absorb");
    return KDT_OK;
}

extern "C" kdt_status kdt_mk_kv_append_qa(const float *ckv, int64_t ld, const float *w, float eps, const float *cs,
                                          const float *sn, const int64_t *slot_rows, int64_t R, int32_t Dv, int32_t rope,
                                          int interleave, void *pool, const float *q_in, const float *q_w, int32_t ql, void *qa,
                                          kdt_dtype dt, cudaStream_t s) {
    if (R == 0) return KDT_OK;
    const dim3 grid((unsigned)R, q_in ? 2u : 1u);
    BY_DTYPE(dt,
             KDT_CUDA_CHECK(kdt_pdl_launch(kv_append_kernel<float>, grid, dim3(kThreads), 0, s, ckv, ld, w, eps, cs, sn, slot_rows, Dv,
                                           rope, interleave, (float *)pool, q_in, q_w, ql, (float *)qa)),
             KDT_CUDA_CHECK(kdt_pdl_launch(kv_append_kernel<bf16>, grid, dim3(kThreads), 0, s, ckv, ld, w, eps, cs, sn, slot_rows, Dv,
                                           rope, interleave, (bf16 *)pool, q_in, q_w, ql, (bf16 *)qa)));
    KDT_CUDA_CHECK_LAUNCH("kv_append");
    return KDT_OK;
}

extern "C" kdt_status kdt_mk_kv_append(const float *ckv, int64_t ld, const float *w, float eps, const float *cs, const float *sn,
                                       const int64_t *slot_rows, int64_t R, int32_t Dv, int32_t rope, int interleave, void *pool,
                                       kdt_dtype dt, cudaStream_t s) {
    return kdt_mk_kv_append_qa(ckv, ld, w, eps, cs, sn, slot_rows, R, Dv, rope, interleave, pool, nullptr, nullptr, 0, nullptr,
                               dt, s);
}

extern "C" kdt_status kdt_mk_silu_mul(const float *gu, int64_t n, int32_t I, void *out, kdt_dtype dt, cudaStream_t s) {
    if (n == 0) return KDT_OK;
    const unsigned g = grid_for(n * I);
    BY_DTYPE(dt, (silu_mul_kernel<<<g, kThreads, 0, s>>>(gu, n, I, (float *)out)),
             (silu_mul_kernel<<<g, kThreads, 0, s>>>(gu, n, I, (bf16 *)out)));
    KDT_CUDA_CHECK_LAUNCH("silu_mul");
    return KDT_OK;
}

extern "C" kdt_status kdt_mk_route(const float *logits, const float *bias, int64_t R, int32_t E, int32_t G, int32_t topk_group,
                                   int32_t K, int norm, float scale, int32_t *idx, float *wt, cudaStream_t s) {
    if (R == 0) return KDT_OK;
    if (K > kMaxTopk) return kdt_fail(KDT_ERR_UNSUPPORTED, "model cuda: %d experts per token, at most %d", K, kMaxTopk);
    const size_t smem = (size_t)route_scratch_bytes(E, G, K);
    if (smem > 48 * 1024) return kdt_fail(KDT_ERR_UNSUPPORTED, "model cuda: %d experts need %zu bytes of shared memory", E, smem);
    route_kernel<<<(unsigned)R, 32, smem, s>>>(logits, bias, E, G, topk_group, K, norm, scale, idx, wt);
    KDT_CUDA_CHECK_LAUNCH("route");
    return KDT_OK;
}

extern "C" kdt_status kdt_mk_moe_plan(const int32_t *idx, int64_t n, int32_t E, int32_t *counts, int32_t *offs, int32_t *perm,
                                      int32_t *pos, cudaStream_t s) {
    moe_count_kernel<<<(unsigned)E, kThreads, 0, s>>>(idx, n, counts);
    KDT_CUDA_CHECK_LAUNCH("moe_count");
    moe_fill_kernel<<<(unsigned)E, kThreads, 0, s>>>(idx, n, counts, offs, perm, pos);
    KDT_CUDA_CHECK_LAUNCH("moe_fill");
    return KDT_OK;
}

extern "C" kdt_status kdt_mk_gather_rows(const void *x, const int32_t *perm, int64_t n, int32_t K, int32_t hid, void *xe,
                                         kdt_dtype dt, cudaStream_t s) {
    if (n == 0) return KDT_OK;
    const unsigned g = grid_for(n * hid);
    BY_DTYPE(dt, (gather_rows_kernel<<<g, kThreads, 0, s>>>((const float *)x, perm, n, K, hid, (float *)xe)),
             (gather_rows_kernel<<<g, kThreads, 0, s>>>((const bf16 *)x, perm, n, K, hid, (bf16 *)xe)));
    KDT_CUDA_CHECK_LAUNCH("gather_rows");
    return KDT_OK;
}

extern "C" kdt_status kdt_mk_moe_combine(float *x, const float *ye, const int32_t *idx, const float *wt, const int32_t *pos,
                                         int64_t R, int32_t K, int32_t E, int32_t hid, int shared, cudaStream_t s) {
    if (R == 0) return KDT_OK;
    if (K > kMaxTopk) return kdt_fail(KDT_ERR_UNSUPPORTED, "model cuda: %d experts per token, at most %d", K, kMaxTopk);
    const int V = hid % 4 == 0 ? 4 : 1;
    const dim3 grid((unsigned)R, (unsigned)((hid + kThreads * V - 1) / (kThreads * V)));
    KDT_CUDA_CHECK(kdt_pdl_launch(V == 4 ? moe_combine_kernel<4> : moe_combine_kernel<1>, grid, dim3(kThreads), 0, s, x, ye, idx, wt, pos,
                                  R, K, E, hid, shared));
    KDT_CUDA_CHECK_LAUNCH("moe_combine");
    return KDT_OK;
}

extern "C" void kdt_mk_set_pdl(int on) { g_pdl = on != 0; }
extern "C" int kdt_mk_pdl(void) { return g_pdl; }

extern "C" kdt_status kdt_cuda_fill_uniform(void *dst, kdt_dtype dt, size_t n, uint64_t seed, float center, float scale) {
    const unsigned g = grid_for((int64_t)n);
    BY_DTYPE(dt, (fill_uniform_kernel<<<g, kThreads>>>((float *)dst, n, seed, center, scale)),
             (fill_uniform_kernel<<<g, kThreads>>>((bf16 *)dst, n, seed, center, scale)));
    KDT_CUDA_CHECK_LAUNCH("fill_uniform");
    return KDT_OK;
}

extern "C" kdt_status kdt_cuda_fill_codes(void *dst, size_t n, uint64_t seed, uint8_t mask) {
    fill_codes_kernel<<<grid_for((int64_t)n), kThreads>>>((uint8_t *)dst, n, seed, mask);
    KDT_CUDA_CHECK_LAUNCH("fill_codes");
    return KDT_OK;
}

extern "C" kdt_status kdt_cuda_fill_bytes(void *dst, int byte, size_t n) {
    KDT_CUDA_CHECK(cudaMemset(dst, byte, n));
    KDT_CUDA_CHECK(cudaDeviceSynchronize()); /* the forward may run on a stream that does not wait for this one */
    return KDT_OK;
}
