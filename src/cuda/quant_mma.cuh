/* The tensor-core pieces of the quantized decode products, shared by src/cuda/quant_gemm.cu and
 * src/model/cuda/moe_quant.cu: exact FP8 / INT4 to bf16 conversions in registers, the bf16 mma, and
 * one 128-k step of a warp's 16 weight rows against kMT tiles of 8 x rows (scales applied to the
 * step's f32 partials, so the products are exact). See quant_gemm.cu for the fragment layouts. */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "cuda/mma_frag.cuh"

namespace {

using namespace kdt_frag;

/* Two e4m3 bytes (low first) as a bf16x2 word: exact, e4m3 values are f16 and bf16 values. */
__device__ __forceinline__ uint32_t e4m3x2_bf16x2(uint32_t v) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xFFFFu), __NV_E4M3);
    const float2 f = __half22float2(__half2(h));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
    return *(const uint32_t *)&b;
}

/* One 128-k FP8 step of a warp's 16 rows g, g + 8: q0, q1 the lane's 32 bytes of each (k kb + 32t ..),
 * xat(i, u) the 8 x values at k kb + 32t + 8u .. of the lane's x row in column tile i, sc the block scale. */
template <int kMT, class X>
__device__ __forceinline__ void fp8_step(float (&acc)[kMT][4], const uint32_t (&q0)[8], const uint32_t (&q1)[8], float sc, X xat) {
    float part[kMT][4] = {};
#pragma unroll
    for (int u = 0; u < 4; u++) { /* mmas j = 2u, 2u + 1 */
        uint4 xv[kMT];
#pragma unroll
        for (int i = 0; i < kMT; i++) xv[i] = xat(i, u);
        /* mma j: lane t's k kb + 32t + 4j .. + 3, i.e. byte word j of each row */
#pragma unroll
        for (int j = 2 * u; j < 2 * u + 2; j++) {
            const uint32_t a0 = e4m3x2_bf16x2(q0[j]), a1 = e4m3x2_bf16x2(q1[j]);
            const uint32_t a2 = e4m3x2_bf16x2(q0[j] >> 16), a3 = e4m3x2_bf16x2(q1[j] >> 16);
#pragma unroll
            for (int i = 0; i < kMT; i++) mma(part[i], a0, a1, a2, a3, j & 1 ? xv[i].z : xv[i].x, j & 1 ? xv[i].w : xv[i].y);
        }
    }
#pragma unroll
    for (int i = 0; i < kMT; i++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[i][c] = fmaf(sc, part[i][c], acc[i][c]);
}

/* One 128-k INT4 step: v0, v1 the lane's 16 bytes (group t) of rows g and g + 8; groups from ng_left
 * on are past K. xat(i, G): the 8 x values at k kb + 32G + 8t ..; scl(G, h): group G's scale of row
 * g (h = 0) or g + 8. The quad transposes its loads so that one mma's k lie in one group; kLoaded:
 * the lane loaded the transposed words itself (word G: bytes 4t .. 4t + 3 of group G). kBiased: the
 * codes enter the mma as 128 + n (the lop3 alone, exact) and each group's partial starts from an mma
 * of -136 against the same x (-136 sum x), in place of a bf16x2 subtraction per pair. */
template <int kMT, bool kLoaded = false, bool kBiased = false, class X, class Sc>
__device__ __forceinline__ void int4_step(float (&acc)[kMT][4], uint4 v0, uint4 v1, int t, int ng_left, X xat, Sc scl) {
    if constexpr (!kLoaded) {
        quad_transpose(v0, t); /* word G: lane t's 8 k of group G */
        quad_transpose(v1, t);
    }
    const uint32_t q0[4] = {v0.x, v0.y, v0.z, v0.w}, q1[4] = {v1.x, v1.y, v1.z, v1.w};
#pragma unroll
    for (int G = 0; G < 4; G++) {
        if (G >= ng_left) break;
        const float sa = scl(G, 0), sb = scl(G, 1);
        float part[kMT][4] = {};
        uint4 xv[kMT];
#pragma unroll
        for (int i = 0; i < kMT; i++) xv[i] = xat(i, G);
        /* mma h: nibble pairs (2h, 2h + 4) and (2h + 1, 2h + 5), x at the same k */
        auto cv = [](uint32_t w, int i) { return kBiased ? ((w >> (4 * i)) & 0x000F000Fu) | 0x43004300u : nib2_bf16x2(w, i); };
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t a0 = cv(q0[G], 2 * h), a1 = cv(q1[G], 2 * h), a2 = cv(q0[G], 2 * h + 1), a3 = cv(q1[G], 2 * h + 1);
#pragma unroll
            for (int i = 0; i < kMT; i++) {
                const uint32_t lo = h ? xv[i].y : xv[i].x, hi = h ? xv[i].w : xv[i].z;
                const uint32_t b0 = __byte_perm(lo, hi, 0x5410), b1 = __byte_perm(lo, hi, 0x7632);
                if constexpr (kBiased) {
                    constexpr uint32_t kM136 = 0xC308C308u; /* bf16x2 (-136, -136) */
                    mma(part[i], kM136, kM136, kM136, kM136, b0, b1);
                }
                mma(part[i], a0, a1, a2, a3, b0, b1);
            }
        }
#pragma unroll
        for (int i = 0; i < kMT; i++) {
            acc[i][0] = fmaf(sa, part[i][0], acc[i][0]);
            acc[i][1] = fmaf(sa, part[i][1], acc[i][1]);
            acc[i][2] = fmaf(sb, part[i][2], acc[i][2]);
            acc[i][3] = fmaf(sb, part[i][3], acc[i][3]);
        }
    }
}

} // namespace
