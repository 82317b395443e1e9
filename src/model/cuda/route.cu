/* The router of a small batch (route.cuh's route_plan_block): a decode step's or a tree's MoE layer
 * queues one launch before its experts instead of four (router GEMM, route, count, fill). The
 * choice and grouping need every row's scores, so they run in one block, and batches are kept to
 * kMaxRows rows. Where the router's weights are small enough for one SM, that block computes the
 * scores too (and the layer's norm before them). Larger routers (Kimi K2's 384 x 7168 f32, 11 MB)
 * are read by the whole GPU: teams of warps score their experts for every row, and the last block
 * to finish (an integer ticket: which one does not change any result) runs the choice and
 * grouping on the scores; the norm is done in the same launch for up to 4 rows (a decode step),
 * by kdt_mk_rmsnorm's launch before it past that. */
#include <cmath>

#include "common/cuda/cuda_common.cuh"
#include "model/cuda/pdl.cuh"
#include "model/cuda/route.h"

namespace {

#include "model/cuda/norm.cuh"
#include "model/cuda/route.cuh"

/* Past 256 scores the block is as wide as its scratch allows: a warp per (row, expert) score and
 * per row's choice, so a tree of 16 rows waits for one or two of each instead of several in a row;
 * a decode step keeps 8 warps (one row's scores). */
constexpr int kThreads = 256, kMaxThreads = 1024;
constexpr int kMaxRows = 64;
constexpr int kMaxScoreWeightBytes = 64 << 10; /* router weights [E, hid] f32 read by the block */
constexpr int kMaxSmem = 44 << 10;             /* dynamic; the norm's static part fits beside it in 48 KB */
constexpr int kNormWarps = 8;                  /* kdt_mk_rmsnorm's 256 threads: its summation order */

size_t smem_bytes(int threads, int64_t R, int32_t E, int32_t G, int32_t K, int most = 0) {
    return (size_t)route_plan_smem_bytes(route_warps(threads / 32, (int)R, most), E, G, K);
}

struct NormArgs {
    const float *x, *w;          /* rows [R, hid] f32, weights [hid] */
    float eps;
    float *h;                    /* [R, hid] f32 out: the routing's h */
    void *hn;                    /* [R, hid] out, bf16 or f32 */
    int bf16;                    /* hn's type: bf16, else f32 */
};

/* inv[r] = 1 / sqrt(mean(x_r^2) + eps) of the layer's RMSNorm over rows x [R, hid] (inv: shared, R
 * floats). Each group of 256 threads sums rows as kernels.cu's rmsnorm_kernel (thread t elements t,
 * t + 256, ..., a butterfly per warp, one over the 8 warps' sums), so the bits are its. */
__device__ void norm_inv_rows(const float *x, float eps, int R, int hid, float *inv) {
    __shared__ float part[kMaxRows][kNormWarps];
    const int groups = (int)blockDim.x / 256, t = (int)threadIdx.x % 256, lane = t % 32, wg = t / 32;
    const int warp = (int)threadIdx.x / 32, warps = (int)blockDim.x / 32;
    for (int r = (int)threadIdx.x / 256; r < R; r += groups) {
        float ss = norm_sumsq_part(x + (size_t)r * hid, hid, t, 256);
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) part[r][wg] = ss;
    }
    __syncthreads();
    for (int r = warp; r < R; r += warps) {
        float v = lane < kNormWarps ? part[r][lane] : 0.f;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) inv[r] = 1.0f / sqrtf(v / (float)hid + eps);
    }
    __syncthreads();
}

/* h and hn elements i = first, first + step, ... < R * hid of the norm: w * (x * inv), as
 * kernels.cu's rmsnorm writes them. */
__device__ void norm_write(const NormArgs &n, const float *inv, int R, int hid, int first, int step) {
    for (int i = first; i < R * hid; i += step) {
        const float y = n.w[i % hid] * (n.x[i] * inv[i / hid]);
        n.h[i] = y;
        if (n.bf16) ((__nv_bfloat16 *)n.hn)[i] = __float2bfloat16_rn(y);
        else ((float *)n.hn)[i] = y;
    }
}

__global__ void __launch_bounds__(kMaxThreads) route_plan_kernel(RoutePlanArgs a, NormArgs n) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float inv[kMaxRows];
    kdt_pdl_begin();
    if (n.x) {
        norm_inv_rows(n.x, n.eps, a.R, a.hid, inv);
        norm_write(n, inv, a.R, a.hid, (int)threadIdx.x, (int)blockDim.x);
        __syncthreads(); /* h is read by the other threads' scores next */
    }
    route_plan_block(a, smem);
}

/* The wide router: blocks of kWideThreads (the rows are read from L2 once per block), a team of T
 * warps per expert (T = team_warps(E): 8 for Kimi K2's 384 experts, 16 for DeepSeek-V3's 256, up to
 * 32 for a few experts, so that 2 to 4 thousand warps read the weights, a few loads each: the mid
 * run's 4-warp teams took 23 us for Kimi's 11 MB), kScoreRows rows at a time, at most kWideMaxRows rows
 * (past that the rows' reads outweigh the weights'; cuBLAS then). A row's score for expert e,
 * h_r . w_e (hid % 4 == 0): lane l of member m sums the 4-float chunks c = 32 m + l, + 32 T, ...
 * in increasing order (a chunk's 4 products in order), a butterfly over the warp, then the
 * members' sums in member order: one order per model, whatever the batch or grid. A member
 * rereads its weights (from L1) for each kScoreRows rows. The last block routes with 8 warps'
 * scratch. kNorm (at most kFoldRows rows): the layer's norm in the same launch; every block finds
 * the rows' inverse RMS itself (same order, same bits) and writes its share of h and hn, and the
 * scores take h = w * (x * inv) as they go (the bits of h), since other blocks are writing h. */
constexpr int kScoreRows = 4, kWideThreads = 1024, kWideWarps = kWideThreads / 32, kWideMaxRows = 16;
constexpr int kWideRouteWarps = kThreads / 32, kFoldRows = 4;

int team_warps(int32_t E) {
    int t = 4;
    while (t < kWideWarps && (int64_t)E * t * 2 <= 4096) t *= 2;
    return t;
}

template <bool kNorm>
__global__ void __launch_bounds__(kWideThreads) route_wide_kernel(RoutePlanArgs a, NormArgs n, int team, int *ticket) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float part[kWideWarps][kScoreRows], inv[kFoldRows];
    __shared__ bool last;
    kdt_pdl_begin();
    if (kNorm) {
        norm_inv_rows(n.x, n.eps, a.R, a.hid, inv);
        norm_write(n, inv, a.R, a.hid, (int)(blockIdx.x * blockDim.x + threadIdx.x), (int)(gridDim.x * blockDim.x));
    }
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32, m = warp % team, slot = warp / team;
    const int e = (int)blockIdx.x * (kWideWarps / team) + slot, chunks = a.hid / 4;
    const float4 *w = (const float4 *)(a.w + (size_t)(e < a.E ? e : 0) * a.hid);
    for (int r0 = 0; r0 < a.R; r0 += kScoreRows) {
        float acc[kScoreRows] = {};
#pragma unroll 4
        for (int c = m * 32 + lane; c < chunks; c += 32 * team) {
            const float4 wv = w[c], nv = kNorm ? ((const float4 *)n.w)[c] : float4{};
#pragma unroll
            for (int q = 0; q < kScoreRows; q++) {
                if (r0 + q >= a.R) break;
                float4 hv;
                if (kNorm) {
                    const float4 xv = ((const float4 *)(n.x + (size_t)(r0 + q) * a.hid))[c];
                    const float s = inv[r0 + q];
                    hv = float4{nv.x * (xv.x * s), nv.y * (xv.y * s), nv.z * (xv.z * s), nv.w * (xv.w * s)};
                } else {
                    hv = ((const float4 *)(a.h + (size_t)(r0 + q) * a.hid))[c];
                }
                acc[q] = fmaf(hv.w, wv.w, fmaf(hv.z, wv.z, fmaf(hv.y, wv.y, fmaf(hv.x, wv.x, acc[q]))));
            }
        }
#pragma unroll
        for (int q = 0; q < kScoreRows; q++) {
            for (int o = 16; o > 0; o >>= 1) acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], o);
            if (lane == 0) part[warp][q] = acc[q];
        }
        __syncthreads();
        if (m == 0 && lane < kScoreRows && r0 + lane < a.R && e < a.E) {
            float v = part[warp][lane];
            for (int k = 1; k < team; k++) v += part[warp + k][lane];
            a.logits[(size_t)(r0 + lane) * a.E + e] = v;
            __threadfence(); /* device-wide before the block's ticket (the last block reads it) */
        }
        __syncthreads(); /* part is rewritten by the next rows */
    }
    if (threadIdx.x == 0) {
        __threadfence(); /* and the block's scores, seen by this thread through the barrier, before its ticket */
        last = atomicAdd(ticket, 1) == (int)gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    RoutePlanArgs b = a;
    b.h = nullptr; /* the scores are in logits now */
    route_plan_block(b, smem);
    if (threadIdx.x == 0) *ticket = 0; /* every other block has taken its ticket */
}

bool small_router(int32_t E, int32_t hid) { return (int64_t)E * hid * (int64_t)sizeof(float) <= kMaxScoreWeightBytes; }

} // namespace

extern "C" int kdt_mk_route_plan_fits(int64_t R, int32_t E, int32_t G, int32_t K, int32_t hid, int with_scores) {
    if (R < 1 || R > kMaxRows || E < 1 || G < 1 || K < 1 || E % G != 0) return 0;
    if (smem_bytes(kThreads, R, E, G, K) > (size_t)kMaxSmem) return 0;
    return !with_scores || small_router(E, hid) || (hid % 4 == 0 && hid > 0 && R <= kWideMaxRows);
}

extern "C" kdt_status kdt_mk_route_plan(const float *h, const float *w, int32_t hid, float *logits, const float *bias, int64_t R,
                                        int32_t E, int32_t G, int32_t topk_group, int32_t K, int norm, float scale, int32_t *idx,
                                        float *wt, int32_t *counts, int32_t *offs, int32_t *perm, int32_t *pos,
                                        const kdt_mk_norm *in_norm, void *hn, kdt_dtype dt, int32_t *ticket, cudaStream_t s) {
    if (!kdt_mk_route_plan_fits(R, E, G, K, hid, h != nullptr))
        return kdt_fail(KDT_ERR_UNSUPPORTED, "model cuda: one-block router of %lld rows, %d experts in %d groups, top %d, hidden %d",
                        (long long)R, E, G, K, hid);
    if (in_norm && (!h || in_norm->rows || (dt != KDT_BF16 && dt != KDT_F32)))
        return kdt_fail(KDT_ERR_UNSUPPORTED, "model cuda: the router's norm needs its output rows h, all rows, bf16 or f32");
    RoutePlanArgs a = {h, w, logits, bias, (int)R, E, G, topk_group, K, hid, norm, scale, idx, wt, counts, offs, perm, pos, 0};
    if (h && !small_router(E, hid)) {
        if (!ticket) return kdt_fail(KDT_ERR_INVALID_ARG, "model cuda: the wide router (%d experts of %d) needs its ticket", E, hid);
        const bool fold = in_norm && R <= kFoldRows;
        if (in_norm && !fold)
            KDT_TRY(kdt_mk_rmsnorm(in_norm->x, hid, nullptr, R, hid, in_norm->w, in_norm->eps, (float *)h, hid, hn, hid, dt, s));
        const NormArgs na = fold ? NormArgs{in_norm->x, in_norm->w, in_norm->eps, (float *)h, hn, dt == KDT_BF16} : NormArgs{};
        const int team = team_warps(E), per_block = kWideWarps / team;
        a.most_route_warps = kWideRouteWarps;
        KDT_CUDA_CHECK(kdt_pdl_launch(fold ? route_wide_kernel<true> : route_wide_kernel<false>,
                                      dim3((unsigned)((E + per_block - 1) / per_block)), dim3(kWideThreads),
                                      smem_bytes(kWideThreads, R, E, G, K, kWideRouteWarps), s, a, na, team, (int *)ticket));
        KDT_CUDA_CHECK_LAUNCH("route_wide");
        return KDT_OK;
    }
    const NormArgs n = in_norm ? NormArgs{in_norm->x, in_norm->w, in_norm->eps, (float *)h, hn, dt == KDT_BF16} : NormArgs{};
    int threads = kThreads;
    while (R * E > kThreads && threads < kMaxThreads && smem_bytes(threads + 256, R, E, G, K) <= (size_t)kMaxSmem) threads += 256;
    KDT_CUDA_CHECK(kdt_pdl_launch(route_plan_kernel, dim3(1), dim3(threads), smem_bytes(threads, R, E, G, K), s, a, n));
    KDT_CUDA_CHECK_LAUNCH("route_plan");
    return KDT_OK;
}
