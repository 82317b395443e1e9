/* The greedy pick of logits rows on the device: the argmax launcher (pick.cu), which the forward
 * runs inside its own work (kdt_batch.argmax) and the speculative loop over its target_pred, and
 * the block-wide "best of" reduction it shares with the loop's top-K and sampling kernels
 * (src/spec/cuda/rows.cu). Argmax order: larger value first, NaN after every number, then the
 * lower index; a total order, so the result does not depend on the reduction's shape. */
#pragma once

#include <cuda_runtime.h>

#include "kdt/kdt.h"

struct kdt_best {
    float v;
    int i;
};

/* 1 when (bv, bi) comes before (av, ai) in argmax order. */
static __device__ __forceinline__ bool kdt_argmax_before(float bv, int bi, float av, int ai) {
    if (isnan(bv) != isnan(av)) return !isnan(bv);
    if (isnan(bv) || bv == av) return bi < ai;
    return bv > av;
}

/* Block-wide reduction of one kdt_best per thread (kN threads, a multiple of 32) in the order
 * `before`; the result lands in every thread. */
template <int kN, typename Before>
static __device__ kdt_best kdt_block_best(kdt_best b, Before before) {
    __shared__ float sv[kN / 32];
    __shared__ int si[kN / 32];
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_down_sync(0xffffffffu, b.v, o);
        const int oi = __shfl_down_sync(0xffffffffu, b.i, o);
        if (before(ov, oi, b.v, b.i)) b = {ov, oi};
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads(); /* the shared slots may still be read by a previous call */
    if (lane == 0) sv[warp] = b.v, si[warp] = b.i;
    __syncthreads();
    b = {sv[0], si[0]};
    for (int w = 1; w < kN / 32; w++)
        if (before(sv[w], si[w], b.v, b.i)) b = {sv[w], si[w]};
    return b;
}

/* pred [Ba, Q]: pred[a * Q + i] = the argmax of logits row rows[a] + i of x [*, V] for
 * i < rows[Ba + a], -1 past them (rows [2, Ba] device); rows NULL: row a * Q + i, Q rows per
 * request back to back. Queued on s. */
kdt_status kdt_mk_argmax(const float *x, int32_t V, int32_t Ba, int32_t Q, const int32_t *rows, int32_t *pred, cudaStream_t s);
