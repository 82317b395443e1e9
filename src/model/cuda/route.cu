/* The router of a small batch in one block (route.cuh's route_plan_block): a decode step's or a
 * tree's MoE layer queues one launch before its experts instead of four (router GEMM, route,
 * count, fill). One block, because the grouping needs every row's choice; so it is kept to
 * batches of at most kMaxRows rows, and it computes the scores itself only when the router's
 * weights are small enough to be read by one SM at little cost (else they come from cuBLAS). */
#include <cmath>

#include "common/cuda/cuda_common.cuh"
#include "model/cuda/pdl.cuh"
#include "model/cuda/route.h"

namespace {

#include "model/cuda/route.cuh"

/* Past 256 scores the block is as wide as its scratch allows: a warp per (row, expert) score and
 * per row's choice, so a tree of 16 rows waits for one or two of each instead of several in a row;
 * a decode step keeps 8 warps (one row's scores). */
constexpr int kThreads = 256, kMaxThreads = 1024;
constexpr int kMaxRows = 64;
constexpr int kMaxScoreWeightBytes = 64 << 10; /* router weights [E, hid] f32 read by the block */
constexpr int kMaxSmem = 44 << 10;             /* dynamic; the norm's static part fits beside it in 48 KB */
constexpr int kNormWarps = 8;                  /* kdt_mk_rmsnorm's 256 threads: its summation order */

size_t smem_bytes(int threads, int32_t E, int32_t G, int32_t K) {
    return (size_t)(threads / 32) * route_scratch_bytes(E, G, K) + (size_t)E * sizeof(int);
}

/* The layer's RMSNorm before the routing: rows x [R, hid] f32, weights w [hid]; out h [R, hid] f32
 * and hn [R, hid] (T). Each group of 256 threads sums rows as kernels.cu's rmsnorm_kernel (thread t
 * elements t, t + 256, ..., a butterfly per warp, one over the 8 warps' sums), so the bits are its. */
template <typename T>
__device__ void norm_rows(const float *x, const float *w, float eps, int R, int hid, float *h, T *hn) {
    __shared__ float part[kMaxRows][kNormWarps], inv[kMaxRows];
    const int groups = (int)blockDim.x / 256, t = (int)threadIdx.x % 256, lane = t % 32, wg = t / 32;
    const int warp = (int)threadIdx.x / 32, warps = (int)blockDim.x / 32;
    for (int r = (int)threadIdx.x / 256; r < R; r += groups) {
        float ss = 0.f;
        for (int j = t; j < hid; j += 256) ss = fmaf(x[(size_t)r * hid + j], x[(size_t)r * hid + j], ss);
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
    for (int i = (int)threadIdx.x; i < R * hid; i += (int)blockDim.x) {
        const float y = w[i % hid] * (x[i] * inv[i / hid]);
        h[i] = y;
        if (sizeof(T) == 2) hn[i] = __float2bfloat16_rn(y);
        else ((float *)hn)[i] = y;
    }
    __syncthreads(); /* h is read by the other threads' scores next */
}

struct NormArgs {
    const float *x, *w;
    float eps;
    float *h;                    /* = the routing's h */
    void *hn;
    int bf16;                    /* hn's type: bf16, else f32 */
};

__global__ void __launch_bounds__(kMaxThreads) route_plan_kernel(RoutePlanArgs a, NormArgs n) {
    extern __shared__ __align__(16) unsigned char smem[];
    kdt_pdl_begin();
    if (n.x && n.bf16) norm_rows(n.x, n.w, n.eps, a.R, a.hid, n.h, (__nv_bfloat16 *)n.hn);
    else if (n.x) norm_rows(n.x, n.w, n.eps, a.R, a.hid, n.h, (float *)n.hn);
    route_plan_block(a, smem);
}

} // namespace

extern "C" int kdt_mk_route_plan_fits(int64_t R, int32_t E, int32_t G, int32_t K, int32_t hid, int with_scores) {
    if (R < 1 || R > kMaxRows || E < 1 || G < 1 || K < 1 || E % G != 0 || smem_bytes(kThreads, E, G, K) > (size_t)kMaxSmem) return 0;
    return !with_scores || (int64_t)E * hid * (int64_t)sizeof(float) <= kMaxScoreWeightBytes;
}

extern "C" kdt_status kdt_mk_route_plan(const float *h, const float *w, int32_t hid, float *logits, const float *bias, int64_t R,
                                        int32_t E, int32_t G, int32_t topk_group, int32_t K, int norm, float scale, int32_t *idx,
                                        float *wt, int32_t *counts, int32_t *offs, int32_t *perm, int32_t *pos,
                                        const kdt_mk_norm *in_norm, void *hn, kdt_dtype dt, cudaStream_t s) {
    if (!kdt_mk_route_plan_fits(R, E, G, K, hid, h != nullptr))
        return kdt_fail(KDT_ERR_UNSUPPORTED, "model cuda: one-block router of %lld rows, %d experts in %d groups, top %d, hidden %d",
                        (long long)R, E, G, K, hid);
    if (in_norm && (!h || in_norm->rows || (dt != KDT_BF16 && dt != KDT_F32)))
        return kdt_fail(KDT_ERR_UNSUPPORTED, "model cuda: the router's norm needs its output rows h, all rows, bf16 or f32");
    RoutePlanArgs a = {h, w, logits, bias, (int)R, E, G, topk_group, K, hid, norm, scale, idx, wt, counts, offs, perm, pos};
    const NormArgs n = in_norm ? NormArgs{in_norm->x, in_norm->w, in_norm->eps, (float *)h, hn, dt == KDT_BF16} : NormArgs{};
    const int threads = R * E > 256 && smem_bytes(kMaxThreads, E, G, K) <= (size_t)kMaxSmem ? kMaxThreads : kThreads;
    KDT_CUDA_CHECK(kdt_pdl_launch(route_plan_kernel, dim3(1), dim3(threads), smem_bytes(threads, E, G, K), s, a, n));
    KDT_CUDA_CHECK_LAUNCH("route_plan");
    return KDT_OK;
}
