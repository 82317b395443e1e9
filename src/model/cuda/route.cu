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

size_t smem_bytes(int threads, int64_t R, int32_t E, int32_t G, int32_t K, int most = 0) {
    return (size_t)route_plan_smem_bytes(route_warps(threads / 32, (int)R, most), E, G, K);
}

__global__ void __launch_bounds__(kMaxThreads) route_plan_kernel(RoutePlanArgs a, RouteNorm n) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float part[kMaxRows][8], inv[kMaxRows];
    kdt_pdl_begin();
    if (n.x) {
        norm_inv_rows(n.x, n.eps, a.R, a.hid, part, inv);
        norm_write(n, inv, a.R, a.hid, (int)threadIdx.x, (int)blockDim.x);
        __syncthreads(); /* h is read by the other threads' scores next */
    }
    route_plan_block(a, smem);
}

/* The wide router (route.cuh's route_wide_block): blocks of kWideThreads (the rows are read from L2
 * once per block), a team of team_warps(E) warps per expert: 8 for Kimi K2's 384 experts, 16 for
 * DeepSeek-V3's 256, up to 32 for a few experts, so that 2 to 4 thousand warps read the weights, a
 * few loads each (the mid run's 4-warp teams in 256-thread blocks took 23 us for Kimi's 11 MB); for
 * every batch the one-block router takes (kMaxRows), so that a decode step and a speculative tree give
 * a row the same scores: with this router up to 16 rows and cuBLAS's f32 GEMM past them, bench_spec's
 * oracle (random Kimi-dims weights, a 17-row tree) parted from plain greedy at token 34 on a router
 * near-tie (H200, 2026-12-02); the layer's norm in the launch up to kFoldRows rows. The last block
 * routes with 8 warps' scratch. */
constexpr int kWideThreads = 1024, kWideWarps = kWideThreads / 32, kWideMaxRows = kMaxRows, kFoldRows = 4;
constexpr int kWideRouteWarps = kThreads / 32;

int team_warps(int32_t E) {
    int t = 4;
    while (t < kWideWarps && (int64_t)E * t * 2 <= 4096) t *= 2;
    return t;
}

template <bool kNorm>
__global__ void __launch_bounds__(kWideThreads) route_wide_kernel(RoutePlanArgs a, RouteNorm n, int team, int *ticket) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ RouteWideShared sh;
    kdt_pdl_begin();
    route_wide_block<kNorm>(a, n, team, ticket, smem, sh);
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
        const RouteNorm na = fold ? RouteNorm{in_norm->x, in_norm->w, in_norm->eps, (float *)h, hn, dt == KDT_BF16} : RouteNorm{};
        const int team = team_warps(E), per_block = kWideWarps / team;
        a.most_route_warps = kWideRouteWarps;
        KDT_CUDA_CHECK(kdt_pdl_launch(fold ? route_wide_kernel<true> : route_wide_kernel<false>,
                                      dim3((unsigned)((E + per_block - 1) / per_block)), dim3(kWideThreads),
                                      smem_bytes(kWideThreads, R, E, G, K, kWideRouteWarps), s, a, na, team, (int *)ticket));
        KDT_CUDA_CHECK_LAUNCH("route_wide");
        return KDT_OK;
    }
    const RouteNorm n = in_norm ? RouteNorm{in_norm->x, in_norm->w, in_norm->eps, (float *)h, hn, dt == KDT_BF16} : RouteNorm{};
    int threads = kThreads;
    while (R * E > kThreads && threads < kMaxThreads && smem_bytes(threads + 256, R, E, G, K) <= (size_t)kMaxSmem) threads += 256;
    KDT_CUDA_CHECK(kdt_pdl_launch(route_plan_kernel, dim3(1), dim3(threads), smem_bytes(threads, R, E, G, K), s, a, n));
    KDT_CUDA_CHECK_LAUNCH("route_plan");
    return KDT_OK;
}
