/* verify_attn sm90: the combine kernel, which merges the normalized partials (and their LSE) of
 * requests the split-KV schedule cut across parts, and its launch. */
#include <math.h>

#include "cuda/sm90/verify_attn_sm90_sched.cuh"

namespace kdt_va_sm90 {
namespace {

/* Merges the partials of split requests: one warp per row, 16 dims per lane. Latency-bound (the
 * partials are in L2): the partials of up to kCombineParts parts are loaded before the LSEs are
 * even read (the loads do not depend on the weights), so a row costs about one L2 round trip.
 * The sums run in part order. */

__device__ __forceinline__ void add_bf16x8(float (&acc)[8], float w, uint4 v) {
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)&u[i]);
        acc[2 * i] = fmaf(w, f.x, acc[2 * i]);
        acc[2 * i + 1] = fmaf(w, f.y, acc[2 * i + 1]);
    }
}

template <int kCombineParts> /* parts loaded at once; divides 32: a chunk of 32 slots holds whole load groups */
__global__ void __launch_bounds__(kThreads) va_sm90_combine(const __grid_constant__ Args a) {
    __shared__ long long warp_sums[kThreads / 32];
    const int b = blockIdx.y;
    long long W, wb;
    sched_sums(a, b, warp_sums, &W, &wb);
    const int P = part_count(a, W);
    const long long first = wb + kOverhead;
    const int p0 = part_of(W, P, first), p1 = part_of(W, P, first + key_tiles(req_keys(a, b)) - 1);
    if (p0 == p1) return; /* written directly by the main kernel */
    asm volatile("griddepcontrol.wait;\n" ::: "memory"); /* the main kernel's partials are complete */
    const int r = blockIdx.x * (kThreads / 32) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= a.rows) return;
    /* Slot of part p for this request (its first part writes slot 2 p + 1, the others 2 p); -1 when
     * the part is empty (it wrote nothing). */
    auto slot_of = [&](int p) -> int {
        if (p > p1 || part_start(W, P, p) == part_start(W, P, p + 1)) return -1;
        return p == p0 ? 2 * p + 1 : 2 * p;
    };
    /* Lane i holds the slot (and later the weight) of part c32 + i, c32 = p0 + 32 k: slot_of's
     * divisions run once per lane and 32 parts; the loads take the slots by shuffle. */
    int slc = slot_of(p0 + lane);
    uint4 v[kCombineParts][2];
    auto load_parts = [&](int i0) { /* parts c32 + i0 .. + kCombineParts - 1 */
#pragma unroll
        for (int u = 0; u < kCombineParts; u++) {
            const int sl = __shfl_sync(0xffffffffu, slc, i0 + u);
            const uint4 *src = (const uint4 *)(a.o_part + ((long long)max(sl, 0) * a.rows + r) * kDv);
            v[u][0] = v[u][1] = make_uint4(0u, 0u, 0u, 0u);
            if (sl >= 0) v[u][0] = src[lane], v[u][1] = src[lane + 32];
        }
    };
    load_parts(0);
    auto lse_of = [&](int sl) { return sl >= 0 ? a.lse_part[(long long)sl * a.rows + r] : -INFINITY; };
    const float lse0 = lse_of(slc); /* the first 32 parts' LSEs: read once, for the max and the weights */
    float mx = -INFINITY;
    for (int c = p0; c <= p1; c += 32) mx = fmaxf(mx, c == p0 ? lse0 : lse_of(slot_of(c + lane)));
#pragma unroll
    for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float acc[2][8] = {};
    float sum = 0.f;
    if (mx != -INFINITY) {
        float wl = expf(lse0 - mx); /* 0 for an empty part: expf(-inf) */
        for (int c = p0;;) {
            const int i0 = (c - p0) & 31;
#pragma unroll
            for (int u = 0; u < kCombineParts; u++) {
                const float w = __shfl_sync(0xffffffffu, wl, i0 + u);
                if (w == 0.f) continue; /* an empty part, or a row the part never saw (NaN passes, as in the sum) */
                sum += w;
                add_bf16x8(acc[0], w, v[u][0]);
                add_bf16x8(acc[1], w, v[u][1]);
            }
            c += kCombineParts;
            if (c > p1) break;
            if (((c - p0) & 31) == 0) {
                slc = slot_of(c + lane);
                wl = expf(lse_of(slc) - mx);
            }
            load_parts((c - p0) & 31);
        }
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    const long long row = (long long)b * a.rows + r;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        uint32_t u[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const __nv_bfloat162 x = __floats2bfloat162_rn(acc[h][2 * i] * inv, acc[h][2 * i + 1] * inv);
            u[i] = *(const uint32_t *)&x;
        }
        *(uint4 *)(a.o + row * kDv + 8 * (lane + 32 * h)) = make_uint4(u[0], u[1], u[2], u[3]);
    }
    if (lane == 0) a.lse[row] = sum > 0.f ? mx + logf(sum) : -INFINITY;
}

} // namespace

cudaError_t launch_combine(const Args &a, int no_pdl, cudaStream_t stream, int *pdl) {
    /* Deep loads only where a request spans many parts: the registers they take cost occupancy. */
    void (*combine)(Args) = a.parts > 2 * a.B ? va_sm90_combine<16> : va_sm90_combine<4>;
    const dim3 grid((unsigned)((a.rows + kThreads / 32 - 1) / (kThreads / 32)), (unsigned)a.B);
    return launch_pdl(combine, grid, 0, a, no_pdl, stream, pdl);
}

} // namespace kdt_va_sm90
