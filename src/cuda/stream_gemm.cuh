/* The weight-streaming GEMMs' kernels and launchers (src/cuda/stream_gemm.h; design and measurements in
 * docs/perf/quant.md, "Streaming small-M GEMM"), one format a translation unit (stream_gemm_<fmt>.cu,
 * compiled in parallel) behind stream_gemm.cu's checks.
 *
 * Swap AB: a warp owns kTR tiles of 16 weight rows, the A operand of mma.sync m16n8k16 (bf16, f32
 * accumulation), and x's rows are the B operand, 8 per mma column tile, so one mma covers 16 weight
 * rows x 8 tokens and the weights are read and converted once for all M rows. Each lane streams its
 * weights kD steps ahead, straight into registers: per step, one 16-byte load (L1 bypassed) of each of its rows g and
 * g + 8 per row tile, the quad's four loads 64 contiguous bytes of the row (whole sectors). No block
 * barrier in the loop; x (small, read by every warp of the SM) comes through L1. Inside an mma the order of k is free as long as A and B agree, so lane t's k are its own
 * 16 bytes and x is read (and permuted by prmt) at the same k:
 *   bf16: 8 k a lane a step, 2 mmas; fp8: 16 k, 4 mmas, bytes converted exactly with integer ops and a
 *   bf16x2 multiply, the block scale applied to the step's f32 partial; int4: one group of 32 k a lane,
 *   the quad transposed (by shuffles, or kLdsm: through shared memory and ldmatrix) so that one mma's k
 *   lie in one group, the group scale applied
 *   to the f32 partial of its 2 mmas. Products are exact in bf16; scales never enter the operands.
 * K split: blocks y = 0 .. S-1 of a cluster take contiguous slices of K and sum their partial tiles in
 * rank order (tile_reduce); S depends on N, K, the format and the SM count only, so a row's sum runs in
 * the same order whatever M and the cfg are (no atomics: run to run, M to M and cfg to cfg bit-identical). */
#pragma once

#include "common/cuda/cuda_common.cuh"
#include "cuda/mma_frag.cuh"
#include "cuda/stream_gemm.h"

namespace kdt_sgemm_impl {

using namespace kdt_frag;

constexpr int kWarps = 4, kThreads = 32 * kWarps;

/* k in a lane quad's 64 bytes of a row: one pipeline step */
template <int kFmt> constexpr int step_k() { return kFmt == KDT_SGEMM_BF16 ? 32 : kFmt == KDT_SGEMM_FP8 ? 64 : 128; }

/* cfg -> (row tiles a warp, steps in flight, int4's quad transpose through shared memory and ldmatrix
 * instead of shuffles); cfg 0 is "pick"; cfgs 3 and 4 are int4's (bf16 and fp8 run 1 and 2 for them). */
constexpr int kCfgTR[KDT_SGEMM_CFGS] = {0, 1, 2, 1, 2}, kCfgD[KDT_SGEMM_CFGS] = {0, 4, 4, 8, 4};
constexpr bool kCfgLdsm[KDT_SGEMM_CFGS] = {false, false, false, true, true};

/* 16 bytes of W, read once: L1 bypassed, L2 asked for the 256-byte span around it; zeros when !in. */
__device__ __forceinline__ uint4 ld_w(const uint8_t *p, bool in) {
    uint4 v;
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %5, 0;\n\tmov.b32 %0, 0;\n\tmov.b32 %1, 0;\n\tmov.b32 %2, 0;\n\tmov.b32 %3, 0;\n\t"
                 "@p ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "r"((int)in));
    return v;
}
/* 16 bytes of x through L1 (every warp of the SM reads the same x); zeros when !in. */
__device__ __forceinline__ uint4 ld_x(const __nv_bfloat16 *p, bool in) { return in ? __ldg((const uint4 *)p) : make_uint4(0, 0, 0, 0); }

/* e4m3 bytes 0 and 2 (even) or 1 and 3 (odd) of q as a bf16x2 word, exactly: the sign to bit 15 and the
 * exponent and mantissa bits to bits 10..4 make the bf16 of the value times 2^-120 (subnormals too),
 * and a bf16x2 multiply by 2^120 (0x7B80) restores it; no conversion-unit instructions. */
__device__ __forceinline__ uint32_t e4m3_rescale(uint32_t r) {
    const uint32_t k = 0x7B807B80u;
    const __nv_bfloat162 v = __hmul2(*(const __nv_bfloat162 *)&r, *(const __nv_bfloat162 *)&k);
    return *(const uint32_t *)&v;
}
__device__ __forceinline__ uint32_t e4m3_even(uint32_t q) { return e4m3_rescale(((q << 4) & 0x07F007F0u) | ((q << 8) & 0x80008000u)); }
__device__ __forceinline__ uint32_t e4m3_odd(uint32_t q) { return e4m3_rescale(((q >> 4) & 0x07F007F0u) | (q & 0x80008000u)); }

/* Group scale G (0..3) of a step's 4 bf16 scales as f32. */
__device__ __forceinline__ float scale_of(uint2 s, int G) {
    const uint32_t v = G < 2 ? s.x : s.y;
    return __uint_as_float(G & 1 ? v & 0xFFFF0000u : v << 16);
}

/* quad_transpose of a warp's 16-byte loads (lane 4g + t: group t of row g) through shared memory: each
 * lane stores its load, and one ldmatrix.x4 (matrix i = group i, 8 rows of 16 bytes) hands lane (g, t)
 * word t of each group of row g. buf: the warp's 32 slots of 16 bytes, row g's group i at 4g + (i ^ (g / 2
 * % 4)) (the XOR spreads both the stores and ldmatrix's row reads over all banks). */
__device__ __forceinline__ void store_for_ldsm(uint4 *buf, uint4 v, int lane) {
    const int g = lane >> 2, t = lane & 3;
    buf[4 * g + (t ^ ((g >> 1) & 3))] = v;
}
__device__ __forceinline__ uint4 ldsm_transposed(const uint4 *buf, int lane) {
    const int j = lane & 7, i = lane >> 3; /* this lane's address: row j of matrix i */
    const unsigned a = (unsigned)__cvta_generic_to_shared(buf + 4 * j + (i ^ ((j >> 1) & 3)));
    uint4 r;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "r"(a));
    return r;
}

/* x's 16 bytes of a bf16 step (32 k) for each column tile: lane t's 8 k kb + 8t .. of its row; loaded a step
 * ahead of their mmas (an x line's first reader in an SM waits on L2). */
template <int kMT>
__device__ __forceinline__ void x_bf16(uint4 (&xv)[kMT], const __nv_bfloat16 *const (&xr)[kMT], int kb, int K, int t) {
    const int k = kb + 8 * t;
#pragma unroll
    for (int i = 0; i < kMT; i++) xv[i] = ld_x(xr[i] + k, k < K);
}

/* One bf16 step (32 k): lane t's 8 k of each row and of x (x_bf16); mma j takes words 2j, 2j + 1. */
template <int kTR, int kMT>
__device__ __forceinline__ void step_bf16(float (&acc)[kTR][kMT][4], const uint4 (&v)[kTR][2], const uint4 (&xv)[kMT]) {
#pragma unroll
    for (int i = 0; i < kMT; i++)
#pragma unroll
        for (int r = 0; r < kTR; r++) {
            mma(acc[r][i], v[r][0].x, v[r][1].x, v[r][0].y, v[r][1].y, xv[i].x, xv[i].y);
            mma(acc[r][i], v[r][0].z, v[r][1].z, v[r][0].w, v[r][1].w, xv[i].z, xv[i].w);
        }
}

/* One fp8 step (64 k): lane t's 16 k kb + 16t ..; mma j takes byte word j (k + 4j ..): bytes 0, 2 in
 * the A slots of k pair 2t, bytes 1, 3 in those of 2t + 8, and x permuted to match. sc: the block scale. */
template <int kTR, int kMT>
__device__ __forceinline__ void step_fp8(float (&acc)[kTR][kMT][4], const uint4 (&v)[kTR][2], float sc,
                                         const __nv_bfloat16 *const (&xr)[kMT], int kb, int K, int t) {
    const int k = kb + 16 * t;
    uint32_t b[kMT][4][2];
#pragma unroll
    for (int i = 0; i < kMT; i++) {
        const uint4 xa = ld_x(xr[i] + k, k < K), xb = ld_x(xr[i] + k + 8, k < K);
        const uint32_t xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            b[i][j][0] = __byte_perm(xw[2 * j], xw[2 * j + 1], 0x5410); /* x k + 4j, k + 4j + 2 */
            b[i][j][1] = __byte_perm(xw[2 * j], xw[2 * j + 1], 0x7632); /* x k + 4j + 1, k + 4j + 3 */
        }
    }
#pragma unroll
    for (int r = 0; r < kTR; r++) {
        const uint32_t q0[4] = {v[r][0].x, v[r][0].y, v[r][0].z, v[r][0].w}, q1[4] = {v[r][1].x, v[r][1].y, v[r][1].z, v[r][1].w};
        float part[kMT][4] = {};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t a0 = e4m3_even(q0[j]), a1 = e4m3_even(q1[j]), a2 = e4m3_odd(q0[j]), a3 = e4m3_odd(q1[j]);
#pragma unroll
            for (int i = 0; i < kMT; i++) mma(part[i], a0, a1, a2, a3, b[i][j][0], b[i][j][1]);
        }
#pragma unroll
        for (int i = 0; i < kMT; i++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[r][i][c] = fmaf(sc, part[i][c], acc[r][i][c]);
    }
}

/* One int4 step (128 k, 4 groups): lane t loaded group t of rows g, g + 8; after the quad's transpose
 * its word G is k kb + 32G + 8t .. of group G; mma h of a group takes nibble pairs (2h, 2h + 4) and
 * (2h + 1, 2h + 5), x permuted to match. sc [r][h]: the step's 4 group scales of row g (h = 0), g + 8. */
template <int kTR, int kMT, bool kLdsm>
__device__ __forceinline__ void step_int4(float (&acc)[kTR][kMT][4], const uint4 (&v)[kTR][2], const uint2 (&sc)[kTR][2],
                                          const __nv_bfloat16 *const (&xr)[kMT], int kb, int K, int t, uint4 *tbuf) {
    uint32_t q[kTR][2][4];
    if constexpr (kLdsm) {
        const int lane = threadIdx.x & 31;
#pragma unroll
        for (int r = 0; r < kTR; r++)
#pragma unroll
            for (int h = 0; h < 2; h++) store_for_ldsm(tbuf + 32 * (2 * r + h), v[r][h], lane);
        __syncwarp();
#pragma unroll
        for (int r = 0; r < kTR; r++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint4 u = ldsm_transposed(tbuf + 32 * (2 * r + h), lane);
                q[r][h][0] = u.x, q[r][h][1] = u.y, q[r][h][2] = u.z, q[r][h][3] = u.w;
            }
        __syncwarp(); /* the slots are free for the next step's stores */
    } else {
#pragma unroll
        for (int r = 0; r < kTR; r++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                uint4 u = v[r][h];
                quad_transpose(u, t);
                q[r][h][0] = u.x, q[r][h][1] = u.y, q[r][h][2] = u.z, q[r][h][3] = u.w;
            }
    }
#pragma unroll
    for (int G = 0; G < 4; G++) {
        const int k = kb + 32 * G + 8 * t;
        uint32_t b[kMT][2][2];
#pragma unroll
        for (int i = 0; i < kMT; i++) {
            const uint4 xv = ld_x(xr[i] + k, k < K);
            b[i][0][0] = __byte_perm(xv.x, xv.z, 0x5410), b[i][0][1] = __byte_perm(xv.x, xv.z, 0x7632);
            b[i][1][0] = __byte_perm(xv.y, xv.w, 0x5410), b[i][1][1] = __byte_perm(xv.y, xv.w, 0x7632);
        }
#pragma unroll
        for (int r = 0; r < kTR; r++) {
            float part[kMT][4] = {};
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint32_t a0 = nib2_bf16x2(q[r][0][G], 2 * h), a1 = nib2_bf16x2(q[r][1][G], 2 * h);
                const uint32_t a2 = nib2_bf16x2(q[r][0][G], 2 * h + 1), a3 = nib2_bf16x2(q[r][1][G], 2 * h + 1);
#pragma unroll
                for (int i = 0; i < kMT; i++) mma(part[i], a0, a1, a2, a3, b[i][h][0], b[i][h][1]);
            }
            const float sa = scale_of(sc[r][0], G), sb = scale_of(sc[r][1], G);
            acc_scaled(acc[r], part, sa, sb);
        }
    }
}

/* The step's 4 bf16 group scales (groups 4c .. 4c + 3) of row `row`: one 8-byte load where aligned
 * (K % 128 == 0 and the array 8-byte aligned), else one 2-byte load each; zero past K. */
__device__ __forceinline__ uint2 int4_scales(const uint16_t *__restrict__ s16, int row, int c, int ng, bool vec) {
    const size_t e = (size_t)row * ng + 4 * c;
    if (vec) return __ldg((const uint2 *)(s16 + e));
    uint32_t h[4];
#pragma unroll
    for (int G = 0; G < 4; G++) h[G] = 4 * c + G < ng ? __ldg(s16 + e + G) : 0u;
    return make_uint2(h[0] | h[1] << 16, h[2] | h[3] << 16);
}

/* Programmatic dependent launch (KDT_SGEMM_PDL): wait for the previous grid (complete, its writes visible),
 * then let the next kernel be scheduled; both do nothing in a plain launch. */
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* kdt_mk_silu_mul's silu(g) * u, rounded to bf16. */
__device__ __forceinline__ __nv_bfloat16 silu_mul(float g, float u) { return __float2bfloat16_rn(g / (1.0f + expf(-g)) * u); }

/* KDT_SGEMM_GLU with a K split: the cluster's partial tiles summed in rank order as tile_reduce does, a gate
 * row (row tile 0 of its warp) with its up row (row tile 1) by the same thread, out bf16 [M, I]. */
template <int kMT>
__device__ __forceinline__ void glu_reduce(float *red, const float (&acc)[2][kMT][4], __nv_bfloat16 *__restrict__ out, int M, int I,
                                           int j0) {
    constexpr int kRows = 32 * kWarps, kPitch = kRows + 4, kOut = 16 * kWarps;
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    tile_stash<2, kMT, kWarps>(red, acc);
    cluster.sync();
    const int S = gridDim.y, rank = blockIdx.y, total = min(M, kMT * 8) * kOut;
    for (int e = rank * total / S + threadIdx.x; e < (rank + 1) * total / S; e += kThreads) {
        const int m = e / kOut, j = e % kOut, rg = 32 * (j / 16) + j % 16; /* red's gate row; its up row is rg + 16 */
        float gv = 0, uv = 0;
        for (int q = 0; q < S; q++) {
            const float *r = cluster.map_shared_rank(red, q) + m * kPitch + rg;
            gv += r[0];
            uv += r[16];
        }
        if (j0 + j < I) out[(size_t)m * I + j0 + j] = silu_mul(gv, uv);
    }
    cluster.sync(); /* no block leaves while another reads its partials */
}

/* y [M, N] (+)= x [M, K] . dequant(w)^T. Grid (ceil(N / (64 kTR)), S), clusters of (1, S, 1) when S > 1:
 * block y = rank = slice of K. Rows past N and x rows past M are read clamped and never written.
 * kGlu (kTR 2): warp row tile 0 holds gate rows, tile 1 the up rows I = N / 2 further, 64 outputs a block.
 * The ring's first kD steps (weights only) load before pdl_wait. */
template <int kFmt, int kTR, int kMT, int kD, bool kLdsm, bool kGlu>
__global__ void __launch_bounds__(kThreads) sgemm_kernel(const __nv_bfloat16 *__restrict__ x, const uint8_t *__restrict__ w,
                                                      const void *__restrict__ scale, void *__restrict__ yv, int M, int N, int K,
                                                      unsigned flags) {
    constexpr int kK = step_k<kFmt>(), kRows = 16 * kTR * kWarps;
    static_assert(128 % (16 * kTR) == 0, "a warp's rows in one FP8 block row");
    static_assert(!kGlu || (kTR == 2 && kFmt == KDT_SGEMM_BF16), "GLU: bf16, a gate and an up row tile a warp");
    __shared__ float red[8 * kMT * (kRows + 4)];
    __shared__ uint4 tbuf[kLdsm ? kWarps * kTR * 2 * 32 : 1]; /* int4's transposes, 2 kTR slots of 32 a warp */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int I = N / 2, nr = kGlu ? 16 : 16 * kTR; /* rows of output a warp */
    const int n0 = blockIdx.x * nr * kWarps, nw = n0 + warp * nr, S = gridDim.y, rank = blockIdx.y;
    float *y = (float *)yv;
    const int steps = (K + kK - 1) / kK, c0 = rank * steps / S, c1 = (rank + 1) * steps / S;
    const long long ldw = kFmt == KDT_SGEMM_BF16 ? 2ll * K : kFmt == KDT_SGEMM_FP8 ? (long long)K : K / 2; /* bytes a row */
    const int ng = K / 32;
    const uint16_t *s16 = (const uint16_t *)scale;
    const bool svec = kFmt == KDT_SGEMM_INT4 && ng % 4 == 0 && (uintptr_t)scale % 8 == 0;
    const float *sf = (const float *)scale + (size_t)(min(nw, N - 1) / 128) * ((K + 127) / 128); /* fp8: the warp's block row */

    int row[kTR][2];
    const uint8_t *wr[kTR][2];
#pragma unroll
    for (int r = 0; r < kTR; r++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            row[r][h] = kGlu ? r * I + min(nw + 8 * h + g, I - 1) : min(nw + 16 * r + 8 * h + g, N - 1);
            wr[r][h] = w + row[r][h] * ldw + 16 * t;
        }
    const __nv_bfloat16 *xr[kMT];
#pragma unroll
    for (int i = 0; i < kMT; i++) xr[i] = x + (size_t)min(8 * i + g, M - 1) * K;

    uint4 wv[kD][kTR][2];
    float fs[kD];
    uint2 is[kD][kTR][2];
    auto load = [&](int c, int d) { /* step c into ring slot d */
        const bool live = c < c1, in = live && 64ll * c + 16 * t < ldw;
#pragma unroll
        for (int r = 0; r < kTR; r++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                wv[d][r][h] = ld_w(wr[r][h] + 64ll * c, in);
                if constexpr (kFmt == KDT_SGEMM_INT4) is[d][r][h] = live ? int4_scales(s16, row[r][h], c, ng, svec) : make_uint2(0, 0);
            }
        if constexpr (kFmt == KDT_SGEMM_FP8) fs[d] = live ? __ldg(sf + c / 2) : 0.f;
    };

    float acc[kTR][kMT][4] = {};
#pragma unroll
    for (int d = 0; d < kD; d++) load(c0 + d, d);
    pdl_wait();
    uint4 xn[kMT]; /* bf16: x of the next step */
    if constexpr (kFmt == KDT_SGEMM_BF16) x_bf16<kMT>(xn, xr, c0 * kK, K, t);
    for (int c = c0; c < c1; c += kD) {
#pragma unroll
        for (int d = 0; d < kD; d++) {
            if (c + d < c1) {
                uint4 v[kTR][2];
#pragma unroll
                for (int r = 0; r < kTR; r++)
#pragma unroll
                    for (int h = 0; h < 2; h++) v[r][h] = wv[d][r][h];
                if constexpr (kFmt == KDT_SGEMM_BF16) {
                    uint4 xv[kMT];
#pragma unroll
                    for (int i = 0; i < kMT; i++) xv[i] = xn[i];
                    if (c + d + 1 < c1) x_bf16<kMT>(xn, xr, (c + d + 1) * kK, K, t);
                    step_bf16<kTR, kMT>(acc, v, xv);
                }
                else if constexpr (kFmt == KDT_SGEMM_FP8) step_fp8<kTR, kMT>(acc, v, fs[d], xr, (c + d) * kK, K, t);
                else step_int4<kTR, kMT, kLdsm>(acc, v, is[d], xr, (c + d) * kK, K, t, tbuf + (warp * kTR * 2) * 32);
            }
            load(c + d + kD, d);
        }
    }

    const bool accumulate = flags & KDT_SGEMM_ACCUMULATE;
    if constexpr (kGlu) {
        if (S > 1) return glu_reduce<kMT>(red, acc, (__nv_bfloat16 *)yv, M, I, n0);
#pragma unroll
        for (int i = 0; i < kMT; i++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int n = nw + g + 8 * (c >> 1), m = 8 * i + 2 * t + (c & 1);
                if (n < I && m < M) ((__nv_bfloat16 *)yv)[(size_t)m * I + n] = silu_mul(acc[0][i][c], acc[1][i][c]);
            }
        return;
    }
    if (S > 1) {
        tile_reduce<kTR, kMT, kWarps>(red, acc, y, M, N, 0, n0, accumulate);
        return;
    }
#pragma unroll
    for (int r = 0; r < kTR; r++)
#pragma unroll
        for (int i = 0; i < kMT; i++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int n = nw + 16 * r + g + 8 * (c >> 1), m = 8 * i + 2 * t + (c & 1);
                if (n >= N || m >= M) continue;
                float *o = y + (size_t)m * N + n;
                *o = accumulate ? *o + acc[r][i][c] : acc[r][i][c];
            }
}

/* Grid (tiles, S) in clusters of (1, S, 1) (past 8 a non-portable size, allowed once a kernel), with
 * programmatic stream serialization when flags ask. */
template <int kFmt, int kTR, int kMT, int kD, bool kLdsm, bool kGlu>
cudaError_t launch_kernel(int tiles, int S, cudaStream_t st, const void *x, const void *w, const void *scale, void *y, int M, int N,
                          int K, unsigned flags) {
    static bool large;
    if (S > 8 && !large) {
        const cudaError_t e = cudaFuncSetAttribute(sgemm_kernel<kFmt, kTR, kMT, kD, kLdsm, kGlu>,
                                                   cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        if (e != cudaSuccess) return e;
        large = true;
    }
    cudaLaunchAttribute at[2];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 1;
    at[0].val.clusterDim.y = S;
    at[0].val.clusterDim.z = 1;
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[1].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t c = {};
    c.gridDim = dim3(tiles, S);
    c.blockDim = dim3(kThreads);
    c.stream = st;
    c.attrs = at;
    c.numAttrs = flags & KDT_SGEMM_PDL ? 2 : 1;
    return cudaLaunchKernelEx(&c, sgemm_kernel<kFmt, kTR, kMT, kD, kLdsm, kGlu>, (const __nv_bfloat16 *)x, (const uint8_t *)w, scale,
                              y, M, N, K, flags);
}

template <int kFmt, int kTR, int kMT, int kD, bool kLdsm>
kdt_status launch_mt(const void *x, const void *w, const void *scale, void *y, int M, int N, int K, unsigned flags, int S,
                     cudaStream_t st, const char *what) {
    const bool glu = kTR == 2 && kFmt == KDT_SGEMM_BF16 && (flags & KDT_SGEMM_GLU);
    const int tiles = glu ? (N / 2 + 16 * kWarps - 1) / (16 * kWarps) : (N + 64 * kTR - 1) / (64 * kTR);
    const cudaError_t e = glu ? launch_kernel<kFmt, kTR, kMT, kD, kLdsm, kTR == 2 && kFmt == KDT_SGEMM_BF16>(tiles, S, st, x, w, scale,
                                                                                                            y, M, N, K, flags)
                              : launch_kernel<kFmt, kTR, kMT, kD, kLdsm, false>(tiles, S, st, x, w, scale, y, M, N, K, flags);
    if (e != cudaSuccess)
        return kdt_fail(KDT_ERR_CUDA, "%s: launch of %d x %d blocks in clusters of %d: %s", what, tiles, S, S, cudaGetErrorString(e));
    KDT_CUDA_CHECK_LAUNCH(what);
    return KDT_OK;
}

/* K split S: as many slices (at most 8, each at least 4 steps) as let every block of the reference kernel
 * (2 row tiles a warp, 4 steps in flight, 16 rows of x; int4's transpose through shared memory) run at
 * once over 128-row tiles. bf16: where that wave would fill less than 3/4 of the resident blocks, about 1.5
 * waves instead (gemv_split_bench, Kimi's dense gate/up [36864, 7168]: S 1 190 us, 2 (1.09 waves) 168, 3 134);
 * where 16 slices would all fit, 12 (a non-portable cluster: q_a+kv_a [2112, 7168] 16.2 -> 13.1 us, shared
 * gate/up [4096, 7168] 23.3 -> 19.3 against S 8; 16 slower than 12 on both).
 * It depends on the format, N, K and the SM count alone, not on the cfg or M, so every cfg and every M sums
 * a row's k in the same order (bit-identical rows). */
template <int kFmt>
kdt_status k_split(int N, int K, int *S) {
    static int resident;
    if (!resident) {
        int dev = 0, sms = 0, per_sm = 0;
        KDT_CUDA_CHECK(cudaGetDevice(&dev));
        KDT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        KDT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, sgemm_kernel<kFmt, 2, 2, 4, kFmt == KDT_SGEMM_INT4, false>,
                                                                     kThreads, 0));
        resident = sms * max(per_sm, 1);
    }
    const int tiles = (N + 127) / 128, steps = (K + step_k<kFmt>() - 1) / step_k<kFmt>();
    int s = resident / tiles;
    if (kFmt == KDT_SGEMM_BF16 && 4 * tiles * s < 3 * resident) s = (3 * resident + 2 * tiles - 1) / (2 * tiles);
    *S = max(1, min(min(kFmt == KDT_SGEMM_BF16 && s >= 16 ? 12 : 8, steps / 4), s));
    return KDT_OK;
}

template <int kFmt, int kTR, int kD, bool kLdsm>
kdt_status launch_cfg(const void *x, const void *w, const void *scale, void *y, int M, int N, int K, unsigned flags, cudaStream_t st,
                      const char *what) {
    int S = 1;
    KDT_TRY(k_split<kFmt>(N, K, &S));
    switch ((M + 7) / 8) {
    case 1: return launch_mt<kFmt, kTR, 1, kD, kLdsm>(x, w, scale, y, M, N, K, flags, S, st, what);
    case 2: return launch_mt<kFmt, kTR, 2, kD, kLdsm>(x, w, scale, y, M, N, K, flags, S, st, what);
    case 3: return launch_mt<kFmt, kTR, 3, kD, kLdsm>(x, w, scale, y, M, N, K, flags, S, st, what);
    default: return launch_mt<kFmt, kTR, 4, kD, kLdsm>(x, w, scale, y, M, N, K, flags, S, st, what);
    }
}

template <int kFmt>
kdt_status launch_fmt(int cfg, const void *x, const void *w, const void *scale, void *y, int M, int N, int K, unsigned flags,
                      cudaStream_t st, const char *what) {
#define KDT_SGEMM_CFG(c) launch_cfg<kFmt, kCfgTR[c], kCfgD[c], kCfgLdsm[c]>
    if constexpr (kFmt != KDT_SGEMM_INT4) { /* cfgs 3 and 4 are 1 and 2: the transpose is int4's alone */
        if (cfg % 2) return KDT_SGEMM_CFG(1)(x, w, scale, y, M, N, K, flags, st, what);
        return KDT_SGEMM_CFG(2)(x, w, scale, y, M, N, K, flags, st, what);
    } else {
        switch (cfg) {
        case 1: return KDT_SGEMM_CFG(1)(x, w, scale, y, M, N, K, flags, st, what);
        case 2: return KDT_SGEMM_CFG(2)(x, w, scale, y, M, N, K, flags, st, what);
        case 3: return KDT_SGEMM_CFG(3)(x, w, scale, y, M, N, K, flags, st, what);
        default: return KDT_SGEMM_CFG(4)(x, w, scale, y, M, N, K, flags, st, what);
        }
    }
#undef KDT_SGEMM_CFG
}

} // namespace kdt_sgemm_impl

/* The launch of one format, cfg 1 .. KDT_SGEMM_CFGS - 1, arguments checked (stream_gemm_<fmt>.cu). */
#define KDT_SGEMM_LAUNCH_ARGS                                                                                            \
    int cfg, const void *x, const void *w, const void *scale, void *y, int M, int N, int K, unsigned flags, cudaStream_t st, \
        const char *what
kdt_status kdt_sgemm_launch_bf16(KDT_SGEMM_LAUNCH_ARGS);
kdt_status kdt_sgemm_launch_fp8(KDT_SGEMM_LAUNCH_ARGS);
kdt_status kdt_sgemm_launch_int4(KDT_SGEMM_LAUNCH_ARGS);
