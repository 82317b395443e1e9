/* verify_attn sm90: the building blocks of a segment (rows [m0, m0 + 64) of one request against a
 * range of its key tiles): tile loads (cp.async rows, TMA boxes), S = Q K^T and O += P V by
 * wgmma, the masked online softmax, the epilogue. Used by verify_attn_sm90_kernel.cu and by the
 * experiments in dev/cuda/. */
#pragma once

#include <math.h>

#include "cuda/sm90/verify_attn_sm90_sched.cuh"

namespace kdt_va_sm90 {

/* ---- tiles ---- */

/* Byte offset of 16-byte chunk c (0..71) of row r in a 64-row swizzled tile. */
__device__ __forceinline__ uint32_t sw_off(int r, int c) {
    return (uint32_t)(c >> 3) * kColBlock + (uint32_t)r * 128 + ((uint32_t)((c & 7) ^ (r & 7)) << 4);
}

/* One thread's share of a 576-wide row r: kPerRow threads per row, chunks sub, sub + kPerRow, ...;
 * src NULL: zeros (valid: any readable address, not read). */
template <int kPerRow>
__device__ __forceinline__ void load_row(uint32_t tile, int r, int sub, const bf16 *src, const void *valid) {
#pragma unroll
    for (int i = 0; i < kChunks / kPerRow; i++) {
        const int c = sub + kPerRow * i;
        cp_async16(tile + sw_off(r, c), src ? (const void *)(src + 8 * c) : valid, src ? 16 : 0);
    }
}

/* Key row r of tile kt of request b (n keys), or NULL for a zero row: past n, or in a block
 * outside [0, NB). */
__device__ __forceinline__ const bf16 *kv_row(const Args &a, int b, int n, int kt, int r) {
    const int j = kt * kBN + r;
    if (j >= n) return nullptr;
    if (!a.block_table) return a.kv + ((long long)b * a.L + j) * kDqk;
    const int blk = a.block_table[(long long)b * a.MB + j / a.BS];
    return blk >= 0 && blk < a.NB ? a.kv + ((long long)blk * a.BS + j % a.BS) * kDqk : nullptr;
}

/* ---- S = Q K^T for warpgroup 0 (wgmma): s[4 j + e] is row 16 w4 + g (+8 for e >= 2), key 8 j + 2 t4 + e % 2 ---- */

/* Descriptor offset (16-byte units) of k-step kk (16 dims) in a swizzled [rows, 576] tile. */
__device__ __forceinline__ uint32_t kstep_off(int kk) { return ((uint32_t)(kk >> 2) * kColBlock + (uint32_t)(kk & 3) * 32) >> 4; }

__device__ __forceinline__ void scores_wgmma(float (&s)[32], uint32_t sq, uint32_t sk) {
#pragma unroll
    for (int i = 0; i < 32; i++) s[i] = 0.f;
    fence_regs(s);
    const uint32_t lq = desc_lo(sq, 16), lk = desc_lo(sk, 16);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kDqk / 16; kk++) wgmma_m64n64k16_ss(s, desc_from(lq + kstep_off(kk), 1024), desc_from(lk + kstep_off(kk), 1024));
    wgmma_commit();
    wgmma_wait0();
    fence_regs(s);
}

/* ---- O += P V: o[4 j + e] is row 16 w4 + g (+8 for e >= 2), dim 256 wg + 8 j + 2 t4 + e % 2 ---- */

__device__ __forceinline__ void pv_wgmma(float (&o)[128], const uint32_t (&p)[4][4], uint32_t sp, uint32_t sk, int wg) {
    fence_regs(o);
    /* V = dims [256 wg, 256 wg + 256) of the key tile: N-major, 64-dim column blocks kColBlock
     * apart (lbo), 8-key groups 1024 bytes apart (sbo); a k16 step is 16 keys = 2048 bytes. */
    const uint32_t lv = desc_lo(sk + (uint32_t)wg * 4 * kColBlock, kColBlock), lp = desc_lo(sp, 16);
    if (wg == 0) {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBN / 16; kk++) wgmma_m64n256k16_rs(o, p[kk], desc_from(lv + kk * 128, 1024));
        wgmma_commit();
        wgmma_wait0();
    } else {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBN / 16; kk++) wgmma_m64n256k16_ss(o, desc_from(lp + kk * 2, 1024), desc_from(lv + kk * 128, 1024));
        wgmma_commit();
        wgmma_wait0();
    }
    fence_regs(o);
}

struct RowState {
    float m[2], l[2]; /* running max (log2 units, -inf until a key is seen) and this thread's partial sum */
};

/* S to log2 units and, on a tile that reaches past the prefix (masked), -inf for the keys the
 * thread's rows do not see (tree mask, past kv_len). One branch around the whole mask, so the
 * prefix tiles run none of it. */
__device__ __forceinline__ void scale_mask(float (&s)[32], float scale_log2, bool masked, int key0, int n, int prefix,
                                           const uint8_t *mrow0, const uint8_t *mrow1, int t4) {
#pragma unroll
    for (int i = 0; i < 32; i++) s[i] *= scale_log2;
    if (!masked) return;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const int key = key0 + 8 * (i >> 2) + 2 * t4 + (i & 1);
        const uint8_t *mrow = (i & 2) ? mrow1 : mrow0;
        const bool seen = key < n && (key < prefix || mrow[key - prefix] != 0);
        s[i] = seen ? s[i] : -INFINITY;
    }
}

/* Masks (if needed), scales to log2 units, updates the running max and sum of the thread's two
 * rows, returns their rescale factors and P as bf16 A fragments (p[kk] covers keys 16 kk ..). */
__device__ __forceinline__ void softmax_tile(float (&s)[32], RowState &st, float (&alpha)[2], uint32_t (&p)[4][4],
                                             float scale_log2, bool masked, int key0, int n, int prefix,
                                             const uint8_t *mrow0, const uint8_t *mrow1, int t4) {
    scale_mask(s, scale_log2, masked, key0, n, prefix, mrow0, mrow1, t4);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; j++) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(st.m[h], mx);
        const float base = m_new == -INFINITY ? 0.f : m_new; /* no key seen yet: P = 0, nothing to rescale */
        alpha[h] = ex2(st.m[h] - base);
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            s[4 * j + 2 * h] = ex2(s[4 * j + 2 * h] - base);
            s[4 * j + 2 * h + 1] = ex2(s[4 * j + 2 * h + 1] - base);
            sum += s[4 * j + 2 * h] + s[4 * j + 2 * h + 1];
        }
        st.l[h] = st.l[h] * alpha[h] + sum;
        st.m[h] = m_new;
    }
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        p[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
        p[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
        p[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
        p[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
    }
}

/* ---- the end of a segment: O / l to o or to the partials (slot >= 0), both bf16, and lse ---- */

/* o: this thread's accumulator (the m64n256 layout of warpgroup tid / 128); l0, l1: the row sums of
 * its rows r0, r1; l_row: the sum of row tid (tid < 64); s_m: the row maxima (log2 units). Stages
 * through the key buffers, which must be free; ends with every thread's reads of them done.
 * Partials are bf16 like o: writing them and reading them back in the combine is what a split
 * costs on small shapes (docs/perf/verify_attn_sm90.md), and their rounding is the output's. */
__device__ __forceinline__ void write_tile(const Args &a, uint8_t *smem, const float (&o)[128], float l0, float l1,
                                           float l_row, const float *s_m, int b, int m0, int rows_valid, int slot) {
    const int tid = threadIdx.x, lane = tid & 31, wg = tid / 128, t4 = lane & 3;
    const int r0 = 16 * ((tid >> 5) & 3) + (lane >> 2), r1 = r0 + 8;
    const float inv0 = l0 > 0.f ? 1.f / l0 : 0.f, inv1 = l1 > 0.f ? 1.f / l1 : 0.f; /* no key seen: o = 0 */
    const int d0 = 256 * wg + 2 * t4;
    bf16 *stage = (bf16 *)(smem + kOffK);
#pragma unroll
    for (int j = 0; j < 32; j++) {
        *(__nv_bfloat162 *)(stage + r0 * kStride + d0 + 8 * j) = __floats2bfloat162_rn(o[4 * j] * inv0, o[4 * j + 1] * inv0);
        *(__nv_bfloat162 *)(stage + r1 * kStride + d0 + 8 * j) = __floats2bfloat162_rn(o[4 * j + 2] * inv1, o[4 * j + 3] * inv1);
    }
    __syncthreads();
    const long long row0 = (slot < 0 ? (long long)b : (long long)slot) * a.rows + m0; /* first row of the tile in o / o_part */
    bf16 *dst = slot < 0 ? a.o : a.o_part;
    for (int i = tid; i < rows_valid * (kDv / 8); i += kThreads) {
        const int r = i / (kDv / 8), c = i % (kDv / 8);
        *(uint4 *)(dst + (row0 + r) * kDv + 8 * c) = *(const uint4 *)(stage + r * kStride + 8 * c);
    }
    if (tid < rows_valid) {
        const float v = l_row > 0.f ? s_m[tid] * 0.69314718055994531f + logf(l_row) : -INFINITY;
        (slot < 0 ? a.lse : a.lse_part)[row0 + tid] = v;
    }
}

/* After warpgroup 0's softmax of a tile (P and the rows' rescale in shared memory): warpgroup 1
 * takes the rescale, both rescale O (not when no row's max moved) and add P V. */
__device__ __forceinline__ void rescale_pv(float (&o)[128], float (&alpha)[2], const uint32_t (&p)[4][4], const float *s_scale,
                                           uint32_t sp, uint32_t sk, int wg, int r0, int r1) {
    if (wg == 1) {
        alpha[0] = s_scale[r0];
        alpha[1] = s_scale[r1];
    }
    if (alpha[0] != 1.f || alpha[1] != 1.f) {
#pragma unroll
        for (int j = 0; j < 32; j++) {
            o[4 * j] *= alpha[0];
            o[4 * j + 1] *= alpha[0];
            o[4 * j + 2] *= alpha[1];
            o[4 * j + 3] *= alpha[1];
        }
    }
    pv_wgmma(o, p, sp, sk, wg);
}

/* The end of a segment whose softmax ran in warpgroup 0 (st): its row sums, summed over each
 * quad, and maxima to shared memory, then write_tile once every thread's last P V is done. */
__device__ __forceinline__ void end_segment(const Args &a, uint8_t *smem, const float (&o)[128], RowState &st, int b, int m0,
                                            int rows_valid, int slot, int wg, int r0, int r1, int t4) {
    const int tid = threadIdx.x;
    float *s_m = (float *)(smem + kOffM), *s_l = (float *)(smem + kOffL);
    if (wg == 0) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], 1);
            st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], 2);
        }
        if (t4 == 0) {
            s_m[r0] = st.m[0], s_l[r0] = st.l[0];
            s_m[r1] = st.m[1], s_l[r1] = st.l[1];
        }
    }
    __syncthreads(); /* row sums are out; every thread's last P V is done, so the key buffers are free */
    write_tile(a, smem, o, s_l[r0], s_l[r1], tid < kBM ? s_l[tid] : 0.f, s_m, b, m0, rows_valid, slot);
}

/* The block-table entries of the 64 / kv_box boxes of key tile kt of request b (n keys); -1 for
 * a box past n or a contiguous cache. Read a while before tile_rows uses them: nothing here
 * waits for the loads. */
__device__ __forceinline__ void tile_blocks(const Args &a, int b, int n, int kt, int (&e)[4]) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int j = kt * kBN + k * a.kv_box;
        e[k] = a.block_table && k * a.kv_box < kBN && j < n ? a.block_table[(long long)b * a.MB + j / a.BS] : -1;
    }
}

/* Row coordinates in tm_kv of those boxes; a box past n, or in a block outside [0, NB), gets
 * kv_rows (out of the map: it reads zeros). */
__device__ __forceinline__ void tile_rows(const Args &a, int b, int n, int kt, const int (&e)[4], int (&y)[4]) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int j = kt * kBN + k * a.kv_box;
        int v = a.kv_rows;
        if (k * a.kv_box < kBN && j < n) {
            if (!a.block_table) v = (int)((long long)b * a.L + j); /* the host checked B L < 2^31 */
            else if (e[k] >= 0 && e[k] < a.NB) v = e[k] * a.BS + j % a.BS;
        }
        y[k] = v;
    }
}

/* One key tile (block-table entries e) into buffer buf on barrier bar; one thread. */
__device__ __forceinline__ void load_tile(const Args &a, int b, int n, int kt, const int (&e)[4], uint32_t buf, uint32_t bar) {
    int y[4];
    tile_rows(a, b, n, kt, e, y);
    mbar_arrive_expect_tx(bar, kTileBytes);
    for (int c = 0; c < kDqk / 64; c++)
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (k * a.kv_box < kBN) tma_load_2d(buf + c * kColBlock + k * a.kv_box * 128, &a.tm_kv, 64 * c, y[k], bar);
}

/* The start of a TMA segment (rows m0.. of request b, n keys, its key tiles [tb, te)): once every thread's
 * generic accesses to the buffers (the last staging) are fenced and done, thread 0 loads Q into sq on
 * bar_q and tile tb into buffer 0 on bar0; thread 128's e_next gets the block-table entries of tile tb + 1. */
__device__ __forceinline__ void tma_segment_start(const Args &a, int b, int n, int m0, int tb, int te, uint32_t sq, uint32_t buf0,
                                                  uint32_t bar_q, uint32_t bar0, int (&e_next)[4]) {
    fence_proxy_async();
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(bar_q, kTileBytes);
        for (int c = 0; c < kDqk / 64; c++) tma_load_2d(sq + c * kColBlock, &a.tm_q, 64 * c, b * a.rows + m0, bar_q);
        int e[4];
        tile_blocks(a, b, n, tb, e);
        load_tile(a, b, n, tb, e, buf0, bar0);
    }
    if (threadIdx.x == 128) tile_blocks(a, b, n, tb + 1 < te ? tb + 1 : tb, e_next);
}

/* The top of a TMA segment's tile loop: waits for tile kt (buffer (kt - tb) & 1; k_phase: bit j, the
 * parity of buffer j), then a CTA barrier: every thread is done with tile kt - 1, so its buffer takes
 * tile kt + 1, which thread 128 loads (reading tile kt + 2's block-table entries). Returns tile kt's
 * shared address. */
__device__ __forceinline__ uint32_t tma_tile_top(const Args &a, int b, int n, int kt, int tb, int te, uint32_t buf0, uint32_t bar0,
                                                 uint32_t &k_phase, int (&e_next)[4]) {
    const uint32_t j = (uint32_t)(kt - tb) & 1;
    mbar_wait(bar0 + 8 * j, (k_phase >> j) & 1);
    k_phase ^= 1u << j;
    __syncthreads();
    if (threadIdx.x == 128 && kt + 1 < te) {
        load_tile(a, b, n, kt + 1, e_next, buf0 + (j ^ 1) * kTileBytes, bar0 + 8 * (j ^ 1));
        tile_blocks(a, b, n, kt + 2 < te ? kt + 2 : kt, e_next);
    }
    return buf0 + j * kTileBytes;
}

/* P (bf16 A fragments) to a swizzled [64 rows, 64 keys] tile; generic stores. */
__device__ __forceinline__ void store_p(uint8_t *tile, const uint32_t (&p)[4][4], int r0, int r1, int t4) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        *(uint32_t *)(tile + r0 * 128 + ((j ^ (r0 & 7)) << 4) + t4 * 4) = p[j >> 1][(j & 1) * 2];
        *(uint32_t *)(tile + r1 * 128 + ((j ^ (r1 & 7)) << 4) + t4 * 4) = p[j >> 1][(j & 1) * 2 + 1];
    }
}

/* Zeroes key rows [z0, 64) of V (column blocks 0..7) of a tile; i: the thread's index in its
 * warpgroup. Generic stores: the caller fences them for the async proxy. */
__device__ __forceinline__ void zero_v_rows(uint8_t *tile, int z0, int i) {
    for (int k = i; k < (kBN - z0) * 64; k += 128) {
        const int r = z0 + (k >> 6), c = k & 63; /* 64 chunks of 16 bytes per row over blocks 0..7 */
        *(uint4 *)(tile + (c >> 3) * kColBlock + r * 128 + (c & 7) * 16) = make_uint4(0u, 0u, 0u, 0u);
    }
}

} // namespace kdt_va_sm90
