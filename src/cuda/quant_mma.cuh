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

/* mma_frag.cuh's nib2_bf16x2 (n - 8) with (w >> 4i) & 0x000F000F | 0x43004300 in one lop3 (ptxas splits
 * the C form into two, each taking one immediate): a shift, a lop3 and a bf16x2 subtraction. */
__device__ __forceinline__ uint32_t nib2_bf16x2_lop3(uint32_t w, int i) {
    uint32_t p;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(p) : "r"(w >> (4 * i)), "r"(0x000F000Fu), "r"(0x43004300u));
    const __nv_bfloat162 r = __hsub2(*(const __nv_bfloat162 *)&p, __float2bfloat162_rn(136.f));
    return *(const uint32_t *)&r;
}

/* What an INT4 step's lane holds of a row (int4_step_tiles' kForm): kInt4Groups, 16 bytes of group t (the
 * quad transposes them); kInt4Words, word G = bytes 4t .. 4t + 3 of group G (the checkpoint's nibble
 * order: value j of the word's 8 in nibble j); kInt4Packed, word G the same 8 values with value j in
 * nibble j / 2 (j even) or 4 + j / 2 (odd), moe_quant.h's packed layout, so that nibbles (i, i + 4) are
 * the k pair of x's word i and x needs no permute. */
constexpr int kInt4Groups = 0, kInt4Words = 1, kInt4Packed = 2;

/* One 128-k INT4 step of kA tiles of 16 rows against the same x: v0[a], v1[a] the lane's 16 bytes of tile
 * a's rows g and g + 8 (kForm above); groups from ng_left on are past K. xat(i, G): the 8 x values at k
 * kb + 32G + 8t ..; scl(a, G, h): tile a's group G scale of row g (h = 0) or g + 8. One mma's k lie in one
 * group. x's B operands are made once for the kA tiles. */
template <int kMT, int kA, int kForm, class X, class Sc>
__device__ __forceinline__ void int4_step_tiles(float (&acc)[kA][kMT][4], uint4 (&v0)[kA], uint4 (&v1)[kA], int t, int ng_left, X xat,
                                                Sc scl) {
    if constexpr (kForm == kInt4Groups) {
#pragma unroll
        for (int a = 0; a < kA; a++) {
            quad_transpose(v0[a], t); /* word G: lane t's 8 k of group G */
            quad_transpose(v1[a], t);
        }
    }
#pragma unroll
    for (int G = 0; G < 4; G++) {
        if (G >= ng_left) break;
        uint32_t b[kMT][2][2]; /* x rows of tile i, mma h: the B operand (k pairs as the A words below) */
#pragma unroll
        for (int i = 0; i < kMT; i++) {
            const uint4 xv = xat(i, G);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t lo = h ? xv.y : xv.x, hi = h ? xv.w : xv.z;
                if constexpr (kForm == kInt4Packed) b[i][h][0] = h ? xv.z : xv.x, b[i][h][1] = h ? xv.w : xv.y;
                else b[i][h][0] = __byte_perm(lo, hi, 0x5410), b[i][h][1] = __byte_perm(lo, hi, 0x7632);
            }
        }
#pragma unroll
        for (int a = 0; a < kA; a++) {
            const uint32_t w0 = G == 0 ? v0[a].x : G == 1 ? v0[a].y : G == 2 ? v0[a].z : v0[a].w;
            const uint32_t w1 = G == 0 ? v1[a].x : G == 1 ? v1[a].y : G == 2 ? v1[a].z : v1[a].w;
            float part[kMT][4] = {};
            /* mma h: nibble pairs (2h, 2h + 4) and (2h + 1, 2h + 5), x at the same k (packed: x's words 2h, 2h + 1) */
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t a0 = nib2_bf16x2_lop3(w0, 2 * h), a1 = nib2_bf16x2_lop3(w1, 2 * h);
                const uint32_t a2 = nib2_bf16x2_lop3(w0, 2 * h + 1), a3 = nib2_bf16x2_lop3(w1, 2 * h + 1);
#pragma unroll
                for (int i = 0; i < kMT; i++) mma(part[i], a0, a1, a2, a3, b[i][h][0], b[i][h][1]);
            }
            const float sa = scl(a, G, 0), sb = scl(a, G, 1);
            acc_scaled(acc[a], part, sa, sb);
        }
    }
}

/* One 128-k INT4 step of one tile (int4_step_tiles with kA = 1): v0, v1 the lane's 16 bytes (group t) of
 * rows g and g + 8; scl(G, h). */
template <int kMT, class X, class Sc>
__device__ __forceinline__ void int4_step(float (&acc)[kMT][4], uint4 v0, uint4 v1, int t, int ng_left, X xat, Sc scl) {
    uint4 a0[1] = {v0}, a1[1] = {v1};
    int4_step_tiles<kMT, 1, kInt4Groups>(*reinterpret_cast<float(*)[1][kMT][4]>(&acc), a0, a1, t, ng_left, xat,
                                          [&](int, int G, int h) { return scl(G, h); });
}

} // namespace
