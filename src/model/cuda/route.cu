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

/* The block is as wide as its scratch allows: a warp per (row, expert) score and per row's choice,
 * so a tree of 16 rows waits for one or two of each instead of several in a row. */
constexpr int kThreads = 256, kMaxThreads = 1024;
constexpr int kMaxRows = 64;
constexpr int kMaxScoreWeightBytes = 64 << 10; /* router weights [E, hid] f32 read by the block */
constexpr int kMaxSmem = 48 << 10;

size_t smem_bytes(int threads, int32_t E, int32_t G, int32_t K) {
    return (size_t)(threads / 32) * route_scratch_bytes(E, G, K) + (size_t)E * sizeof(int);
}

__global__ void __launch_bounds__(kMaxThreads) route_plan_kernel(RoutePlanArgs a) {
    extern __shared__ __align__(16) unsigned char smem[];
    kdt_pdl_begin();
    route_plan_block(a, smem);
}

} // namespace

extern "C" int kdt_mk_route_plan_fits(int64_t R, int32_t E, int32_t G, int32_t K, int32_t hid, int with_scores) {
    if (R < 1 || R > kMaxRows || E < 1 || G < 1 || K < 1 || E % G != 0 || smem_bytes(kThreads, E, G, K) > (size_t)kMaxSmem) return 0;
    return !with_scores || (int64_t)E * hid * (int64_t)sizeof(float) <= kMaxScoreWeightBytes;
}

extern "C" kdt_status kdt_mk_route_plan(const float *h, const float *w, int32_t hid, float *logits, const float *bias, int64_t R,
                                        int32_t E, int32_t G, int32_t topk_group, int32_t K, int norm, float scale, int32_t *idx,
                                        float *wt, int32_t *counts, int32_t *offs, int32_t *perm, int32_t *pos, cudaStream_t s) {
    if (!kdt_mk_route_plan_fits(R, E, G, K, hid, h != nullptr))
        return kdt_fail(KDT_ERR_UNSUPPORTED, "model cuda: one-block router of %lld rows, %d experts in %d groups, top %d, hidden %d",
                        (long long)R, E, G, K, hid);
    RoutePlanArgs a = {h, w, logits, bias, (int)R, E, G, topk_group, K, hid, norm, scale, idx, wt, counts, offs, perm, pos};
    const int threads = smem_bytes(kMaxThreads, E, G, K) <= (size_t)kMaxSmem ? kMaxThreads : kThreads;
    KDT_CUDA_CHECK(kdt_pdl_launch(route_plan_kernel, dim3(1), dim3(threads), smem_bytes(threads, E, G, K), s, a));
    KDT_CUDA_CHECK_LAUNCH("route_plan");
    return KDT_OK;
}
