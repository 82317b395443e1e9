/* verify_attn on Hopper (issue 6): bf16, Dv 512 / Dr 64, tree mask, paged (any block size) or
 * contiguous KV. Build: sm_90a only (the Makefile's SM90_ARCH).
 *
 * Design (FlashMLA's shape, plus the tree mask):
 * - Rows: the Q * H (tree row, head) pairs of a request, row = i * H + h, so they are contiguous in q
 *   and o. A CTA (256 threads, 2 warpgroups) owns a tile of 64 rows; each latent key tile
 *   [64 keys, 576] goes to shared memory once and serves all 64 rows (all heads of the request).
 * - Per key tile: warpgroup 0 computes S = Q K^T [64, 64] over 576 dims, applies the mask (only on
 *   tiles reaching past the prefix: tree keys and the ragged end), runs the online softmax and
 *   hands P (bf16) and the row rescale to warpgroup 1 through shared memory; then both compute
 *   O += P V, V being the first 512 dims of the same tile: warpgroup 0 output dims 0..255 with P
 *   from registers, warpgroup 1 dims 256..511 with P from shared memory. Accumulation is f32.
 * - Key tiles are double-buffered, the next tile loading while this one computes: by TMA in the
 *   default variant 6 (9 boxes a tile, one thread, an mbarrier per buffer; block-table entries
 *   read a tile ahead), by 16-byte cp.async from warpgroup 1 in variants 1..4 (any block size).
 *   Tiles use the 128-byte swizzled layout (sm90_ptx.cuh), written by TMA and cp.async alike
 *   and read by ldmatrix (mma.sync variants) and wgmma descriptors.
 * - Keys past kv_len in a request's last tile: zero rows (cp.async), or zeroed in V after the
 *   TMA load (variants 5, 6), so whatever the cache holds there (NaN included) adds 0.
 * - Split-KV: the grid is (row tiles, parts). The keys of all requests, each request's tiles plus
 *   a fixed overhead, are laid end to end and cut into `parts` equal ranges (by the real kv_len,
 *   read on the device); a CTA walks its range request by request (a "segment" each), so CTAs of
 *   one part read the same keys at the same time (L2 reuse). A request that falls in one part is
 *   written directly; one cut across parts writes normalized partials and their LSE, merged by the
 *   combine kernel. The host picks `parts` from the shape (choose_parts, a cost model); with 1
 *   (the row tiles alone fill the device) there is no combine kernel and no workspace.
 * - Variants (verify_attn_sm90.h), chosen at launch: mma.sync or wgmma per product (1..4), the two
 *   warpgroups in ping-pong (5), variant 2's schedule with TMA loads (6, the default).
 *
 * Safety without host checks: kv_len is clamped to [0, cache]; a key whose block-table entry is
 * outside [0, NB) reads as a zero row; mask reads stay inside the request's [Q, Q]. */
#include <cuda.h>         /* CUtensorMap; the encoder is reached through the runtime (no -lcuda) */
#include <cudaTypedefs.h> /* PFN_cuTensorMapEncodeTiled */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_common.cuh"
#include "cuda/sm90/sm90_ptx.cuh"
#include "cuda/sm90/verify_attn_sm90.h"

using namespace kdt_sm90;

namespace {

typedef __nv_bfloat16 bf16;

constexpr int kDv = 512, kDr = 64, kDqk = kDv + kDr;
constexpr int kBM = 64;            /* rows per tile */
constexpr int kBN = 64;            /* keys per tile */
constexpr int kThreads = 256;
constexpr int kChunks = kDqk / 8;  /* 16-byte chunks per key row: 72 */
constexpr int kOverhead = 2;       /* a segment's fixed cost (Q load, epilogue) in key tiles */
constexpr int kStride = kDv + 8;   /* output staging row stride in bf16 elements */
constexpr uint32_t kColBlock = kBM * 128;        /* one 64-dim column block of a 64-row tile */
constexpr uint32_t kTileBytes = kBM * kDqk * 2;  /* 73728 */

/* Shared memory, from a 1024-byte aligned base. The key buffers also stage the output. */
constexpr uint32_t kOffQ = 0;
constexpr uint32_t kOffK = kTileBytes;                  /* 2 buffers */
constexpr uint32_t kOffP = 3 * kTileBytes;              /* [64 rows, 64 keys] bf16, swizzled */
constexpr uint32_t kOffScale = kOffP + kBM * 128;       /* float[64]: this tile's row rescale */
constexpr uint32_t kOffM = kOffScale + kBM * 4;         /* float[64]: row max (log2 units) */
constexpr uint32_t kOffL = kOffM + kBM * 4;             /* float[64]: row sum */
constexpr uint32_t kOffSched = kOffL + kBM * 4;         /* long long[8] + long long + int */
constexpr uint32_t kSmemBytes = kOffSched + 128 + 1024; /* + alignment slack */
static_assert(kBM * kStride * 2 <= 2 * kTileBytes, "the output staging must fit the key buffers");

struct Args {
    CUtensorMap tm_q;           /* variant 5: q as [B * rows, 576]; boxes [64 rows, 64 dims], 128B swizzle */
    CUtensorMap tm_kv;          /* variant 5: the cache as [kv_rows, 576]; boxes [kv_box rows, 64 dims] */
    int kv_rows;                /* rows of tm_kv: a box starting here reads zeros */
    int kv_box;                 /* rows per box: 64, or the block size when it is 16 or 32 */
    const bf16 *q;              /* [B, Q, H, 576] */
    const bf16 *kv;             /* paged [NB, BS, 576] or contiguous [B, L, 576] */
    const int32_t *block_table; /* [B, MB]; NULL when contiguous */
    const int32_t *kv_len;      /* [B] */
    const uint8_t *tree_mask;   /* [B, Q, Q] */
    bf16 *o;                    /* [B, Q, H, 512] */
    float *lse;                 /* [B, Q, H] */
    bf16 *o_part;               /* [2 * parts, Q * H, 512] normalized partials of split requests */
    float *lse_part;            /* [2 * parts, Q * H] */
    long long L;                /* contiguous: key rows per request */
    int NB, BS, MB;
    int B, Q, H, rows;          /* rows = Q * H per request */
    int cap;                    /* keys the cache holds per request */
    int parts;                  /* gridDim.y */
    float scale_log2;           /* sm_scale * log2(e) */
};

/* ---- schedule: shared by the main and the combine kernel ---- */

__device__ __forceinline__ int req_keys(const Args &a, int b) { return min(max(a.kv_len[b], 0), a.cap); }
__device__ __forceinline__ int key_tiles(int n) { return max(1, (n + kBN - 1) / kBN); }
/* Part p covers positions [part_start(p), part_start(p + 1)) of W. */
__device__ __forceinline__ long long part_start(long long W, int P, int p) { return (long long)p * W / P; }
/* The part holding position pos: the largest p with part_start(p) <= pos. */
__device__ __forceinline__ int part_of(long long W, int P, long long pos) { return (int)(((pos + 1) * P + W - 1) / W - 1); }

/* Inclusive scan over the CTA's 256 threads; *total gets the CTA's sum. */
__device__ long long block_scan(long long v, long long *warp_sums, long long *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const long long u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += u;
    }
    if (lane == 31) warp_sums[warp] = v;
    __syncthreads();
    long long before = 0, sum = 0;
#pragma unroll
    for (int w = 0; w < kThreads / 32; w++) {
        const long long s = warp_sums[w];
        if (w < warp) before += s;
        sum += s;
    }
    __syncthreads(); /* warp_sums is reused by the next call */
    *total = sum;
    return v + before;
}

/* W (all positions) and the sum of the positions of requests before `upto`. */
__device__ void sched_sums(const Args &a, int upto, long long *warp_sums, long long *W, long long *before) {
    *W = 0;
    *before = 0;
    for (int base = 0; base < a.B; base += kThreads) {
        const int b = base + threadIdx.x;
        const long long w = b < a.B ? key_tiles(req_keys(a, b)) + kOverhead : 0;
        long long t, u;
        block_scan(w, warp_sums, &t);
        block_scan(b < upto ? w : 0, warp_sums, &u);
        *W += t;
        *before += u;
    }
}

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

/* ---- S = Q K^T for warpgroup 0: s[4 j + e] is row 16 w4 + g (+8 for e >= 2), key 8 j + 2 t4 + e % 2 ---- */

__device__ __forceinline__ void scores_mma(float (&s)[32], uint32_t sq, uint32_t sk, int w4, int lane) {
#pragma unroll
    for (int i = 0; i < 32; i++) s[i] = 0.f;
#pragma unroll 4
    for (int kk = 0; kk < kDqk / 16; kk++) {
        uint32_t qa[4];
        ldsm_x4(qa, sq + sw_off(16 * w4 + (lane & 15), 2 * kk + (lane >> 4)));
#pragma unroll
        for (int np = 0; np < 4; np++) {
            uint32_t kb[4];
            ldsm_x4(kb, sk + sw_off(16 * np + (lane & 7) + ((lane >> 4) << 3), 2 * kk + ((lane >> 3) & 1)));
            mma_bf16(s + 8 * np, qa, kb[0], kb[1]);
            mma_bf16(s + 8 * np + 4, qa, kb[2], kb[3]);
        }
    }
}

__device__ __forceinline__ void scores_wgmma(float (&s)[32], uint32_t sq, uint32_t sk) {
#pragma unroll
    for (int i = 0; i < 32; i++) s[i] = 0.f;
    fence_regs(s);
    const uint32_t lq = desc_lo(sq, 16), lk = desc_lo(sk, 16);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kDqk / 16; kk++) {
        const uint32_t off = ((uint32_t)(kk >> 2) * kColBlock + (uint32_t)(kk & 3) * 32) >> 4;
        wgmma_m64n64k16_ss(s, desc_from(lq + off, 1024), desc_from(lk + off, 1024));
    }
    wgmma_commit();
    wgmma_wait0();
    fence_regs(s);
}

/* ---- O += P V: o[4 j + e] is row 16 w4 + g (+8 for e >= 2), dim 256 wg + 8 j + 2 t4 + e % 2 ---- */

__device__ __forceinline__ void pv_mma(float (&o)[128], const uint32_t (&p)[4][4], uint32_t sp, uint32_t sk, int wg,
                                       int w4, int lane) {
#pragma unroll
    for (int kk = 0; kk < kBN / 16; kk++) {
        uint32_t pa[4];
        if (wg == 0) {
#pragma unroll
            for (int i = 0; i < 4; i++) pa[i] = p[kk][i];
        } else {
            ldsm_x4(pa, sp + sw_off(16 * w4 + (lane & 15), 2 * kk + (lane >> 4)));
        }
        const int key = 16 * kk + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
        for (int dp = 0; dp < 16; dp++) {
            uint32_t vb[4];
            ldsm_x4_trans(vb, sk + sw_off(key, 32 * wg + 2 * dp + (lane >> 4)));
            mma_bf16(o + 8 * dp, pa, vb[0], vb[1]);
            mma_bf16(o + 8 * dp + 4, pa, vb[2], vb[3]);
        }
    }
}

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

/* ---- one segment: rows [m0, m0 + 64) of request b against its key tiles [tb, te) ---- */

struct RowState {
    float m[2], l[2]; /* running max (log2 units, -inf until a key is seen) and this thread's partial sum */
};

/* Masks (if needed), scales to log2 units, updates the running max and sum of the thread's two
 * rows, returns their rescale factors and P as bf16 A fragments (p[kk] covers keys 16 kk ..). */
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

template <bool kWgS, bool kWgPV>
__device__ __forceinline__ void run_segment(const Args &a, uint8_t *smem, uint32_t sbase, int b, int mt, int tb, int te,
                                            int slot) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, w4 = warp & 3;
    /* The warpgroup index through a shuffle: provably warp-uniform, so ptxas keeps the wgmma of
     * each warpgroup's branch asynchronous instead of serializing it. */
    const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
    const int g = lane >> 2, t4 = lane & 3;
    const int m0 = mt * kBM, rows_valid = min(kBM, a.rows - m0);
    const int n = req_keys(a, b), prefix = n - a.Q; /* key prefix + i is tree node i */
    const int r0 = 16 * w4 + g, r1 = r0 + 8;         /* this thread's two rows in the tile */
    float *s_scale = (float *)(smem + kOffScale), *s_m = (float *)(smem + kOffM), *s_l = (float *)(smem + kOffL);
    const uint32_t sq = sbase + kOffQ, sp = sbase + kOffP;

    __syncthreads(); /* the previous segment's staging has been read */
    { /* Q and the first key tile: all threads, 4 per row */
        const int r = tid >> 2;
        load_row<4>(sq, r, tid & 3, r < rows_valid ? a.q + ((long long)b * a.rows + m0 + r) * kDqk : nullptr, a.q);
        load_row<4>(sbase + kOffK, r, tid & 3, kv_row(a, b, n, tb, r), a.kv);
        cp_async_commit();
    }
    /* Later key tiles are loaded by warpgroup 1 (2 threads per row), idle while warpgroup 0
     * computes S; its row pointer is found a tile ahead, off the load's path. */
    const int lr = (tid & 127) >> 1;
    const bf16 *next_row = wg == 1 ? kv_row(a, b, n, tb + 1, lr) : nullptr;

    /* Tree mask rows of the thread's rows (padding rows past Q * H read the last tree row). */
    const uint8_t *mrow0 = a.tree_mask + ((long long)b * a.Q + min((m0 + r0) / a.H, a.Q - 1)) * a.Q;
    const uint8_t *mrow1 = a.tree_mask + ((long long)b * a.Q + min((m0 + r1) / a.H, a.Q - 1)) * a.Q;

    float o[128];
#pragma unroll
    for (int i = 0; i < 128; i++) o[i] = 0.f;
    RowState st = {{-INFINITY, -INFINITY}, {0.f, 0.f}};

    for (int kt = tb; kt < te; kt++) {
        const uint32_t sk = sbase + kOffK + (uint32_t)((kt - tb) & 1) * kTileBytes;
        cp_async_wait_all();
        fence_proxy_async();
        __syncthreads(); /* tile kt landed for all; every thread is done with tile kt - 1 */
        if (kt + 1 < te && wg == 1) {
            load_row<2>(sbase + kOffK + (uint32_t)((kt + 1 - tb) & 1) * kTileBytes, lr, tid & 1, next_row, a.kv);
            cp_async_commit();
            next_row = kv_row(a, b, n, kt + 2, lr);
        }
        uint32_t p[4][4];
        float alpha[2];
        if (wg == 0) {
            float s[32];
            if (kWgS) scores_wgmma(s, sq, sk);
            else scores_mma(s, sq, sk, w4, lane);
            softmax_tile(s, st, alpha, p, a.scale_log2, (kt + 1) * kBN > prefix, kt * kBN, n, prefix, mrow0, mrow1, t4);
#pragma unroll
            for (int j = 0; j < 8; j++) { /* P to shared memory for warpgroup 1 */
                *(uint32_t *)(smem + kOffP + r0 * 128 + ((j ^ (r0 & 7)) << 4) + t4 * 4) = p[j >> 1][(j & 1) * 2];
                *(uint32_t *)(smem + kOffP + r1 * 128 + ((j ^ (r1 & 7)) << 4) + t4 * 4) = p[j >> 1][(j & 1) * 2 + 1];
            }
            if (t4 == 0) {
                s_scale[r0] = alpha[0];
                s_scale[r1] = alpha[1];
            }
            if (kWgPV) fence_proxy_async(); /* P is read by warpgroup 1's wgmma */
        }
        __syncthreads(); /* P and the rescale are in shared memory */
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
        if (kWgPV) pv_wgmma(o, p, sp, sk, wg);
        else pv_mma(o, p, sp, sk, wg, w4, lane);
    }

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

/* ---- variant 5: two warpgroups in ping-pong, TMA loads (the schedule of FlashMLA's sm90 kernel) ----
 *
 * Tiles tb, tb + 2, ... of a segment go to key buffer 0 and warpgroup 0, tiles tb + 1, tb + 3, ...
 * to buffer 1 and warpgroup 1. Each warpgroup computes S for its own tile (so two independent
 * wgmma chains share the tensor cores and one warpgroup's softmax runs under the other's wgmma)
 * and keeps O for half of the output dims: warpgroup 0 dims 0..255, warpgroup 1 dims 256..511.
 * Per pair of tiles (t0 in buffer 0, t1 in buffer 1), with one running max per row in shared
 * memory:
 *   wg0: softmax(S0): max m_a, rescale a0          wg1: (waits for m_a)
 *        O_left += P0 V0_left (P0 in registers)         softmax(S1): max m_b, rescale a1
 *        (waits for a1) P0 * a1 -> sP0                  O_right *= a0 a1; O_right += P1 V1_right
 *        O_left *= a1; O_left += sP1 V1_left            sP1 <- P1; O_right += sP0 V0_right
 *        S0 of tile t0 + 2                              S1 of tile t1 + 2
 * Loads: TMA, one box per 64-dim column block (9 per tile) with an mbarrier each, issued as soon
 * as the readers of that part of the buffer are done: buffer 0 blocks 0..3 after O_left's P0 V0,
 * blocks 4..8 after O_right's P0 V0; buffer 1 blocks 4..7 after O_right's P1 V1, blocks 0..3
 * and 8 after O_left's P1 V1. sP0 and sP1 live in block 8 (the rope dims, read only by S) of
 * their tile's buffer. Keys past kv_len in a request's last tile are zeroed in V after S, so
 * whatever the cache holds there (NaN included) meets P = 0 as 0. */

constexpr uint32_t kPOffM = 3 * kTileBytes;     /* float[64]: running row max (log2 units) */
constexpr uint32_t kPOffSc0 = kPOffM + 256;     /* float[64]: warpgroup 0's last rescale (a0) */
constexpr uint32_t kPOffSc1 = kPOffSc0 + 256;   /* float[64]: warpgroup 1's last rescale (a1) */
constexpr uint32_t kPOffL = kPOffSc1 + 256;     /* float[2][64]: row sums per warpgroup */
constexpr uint32_t kPOffSched = kPOffL + 512;   /* long long[8] + long long + int */
constexpr uint32_t kPOffBar = kPOffSched + 128; /* mbarriers: Q, then 9 per key buffer */
constexpr uint32_t kSmemPP = kPOffBar + 19 * 8 + 1024;
enum { kBarScale0 = 1, kBarScale1, kBarP0, kBarP1, kBarWg0 /* + warpgroup */ };

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

/* TMA loads of column blocks [c0, c1) of key tile kt (block-table entries e) into buffer buf;
 * one thread. */
__device__ __forceinline__ void load_blocks(const Args &a, int b, int n, int kt, const int (&e)[4], uint32_t buf, uint32_t bars,
                                            int c0, int c1) {
    int y[4];
    tile_rows(a, b, n, kt, e, y);
    for (int c = c0; c < c1; c++) {
        mbar_arrive_expect_tx(bars + 8 * c, kColBlock);
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (k * a.kv_box < kBN)
                tma_load_2d(buf + c * kColBlock + k * a.kv_box * 128, &a.tm_kv, 64 * c, y[k], bars + 8 * c);
    }
}

/* S += Q K^T over the column blocks kFirst .. kLast - 1 of an order (kWg1Order: 4..7, 0..3, 8,
 * the order buffer 1's blocks arrive in; else 0..8), each after its load landed; one commit
 * group per block. */
template <int kFirst, int kLast, bool kWg1Order>
__device__ __forceinline__ void scores_blocks(float (&s)[32], uint32_t sq, uint32_t sk, uint32_t bars, uint32_t parity) {
    const uint32_t lq = desc_lo(sq, 16), lk = desc_lo(sk, 16);
#pragma unroll
    for (int i = kFirst; i < kLast; i++) {
        const int c = kWg1Order ? (i < 4 ? i + 4 : i < 8 ? i - 4 : 8) : i;
        mbar_wait(bars + 8 * c, parity);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint32_t off = ((uint32_t)c * kColBlock + (uint32_t)k * 32) >> 4;
            wgmma_m64n64k16_ss(s, desc_from(lq + off, 1024), desc_from(lk + off, 1024));
        }
        wgmma_commit();
    }
}

__device__ __forceinline__ void zero_s(float (&s)[32]) {
#pragma unroll
    for (int i = 0; i < 32; i++) s[i] = 0.f;
    fence_regs(s);
}

/* O += P V over a tile's 64 keys; V: the 256 dims from v0 (4 column blocks, N-major). P from
 * registers (rs) or from a swizzled [64 rows, 64 keys] bf16 tile at sp (ss). One commit group. */
__device__ __forceinline__ void pv_rs(float (&o)[128], uint32_t (&p)[4][4], uint32_t v0) {
    fence_regs(o);
    fence_regs(p);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; kk++) wgmma_m64n256k16_rs(o, p[kk], desc_from(desc_lo(v0, kColBlock) + kk * 128, 1024));
    wgmma_commit();
}
__device__ __forceinline__ void pv_ss(float (&o)[128], uint32_t sp, uint32_t v0) {
    fence_regs(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; kk++)
        wgmma_m64n256k16_ss(o, desc_from(desc_lo(sp, 16) + kk * 2, 1024), desc_from(desc_lo(v0, kColBlock) + kk * 128, 1024));
    wgmma_commit();
}

/* P (bf16 A fragments) to a swizzled [64 rows, 64 keys] tile; generic stores. */
__device__ __forceinline__ void store_p(uint8_t *tile, const uint32_t (&p)[4][4], int r0, int r1, int t4) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        *(uint32_t *)(tile + r0 * 128 + ((j ^ (r0 & 7)) << 4) + t4 * 4) = p[j >> 1][(j & 1) * 2];
        *(uint32_t *)(tile + r1 * 128 + ((j ^ (r1 & 7)) << 4) + t4 * 4) = p[j >> 1][(j & 1) * 2 + 1];
    }
}

/* P (f32, the m64n64 accumulator layout) times the rows' factors c0 (row r0), c1 (row r1) to bf16. */
__device__ __forceinline__ void pack_p(const float (&s)[32], float c0, float c1, uint32_t (&p)[4][4]) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        p[kk][0] = pack_bf16(s[8 * kk + 0] * c0, s[8 * kk + 1] * c0);
        p[kk][1] = pack_bf16(s[8 * kk + 2] * c1, s[8 * kk + 3] * c1);
        p[kk][2] = pack_bf16(s[8 * kk + 4] * c0, s[8 * kk + 5] * c0);
        p[kk][3] = pack_bf16(s[8 * kk + 6] * c1, s[8 * kk + 7] * c1);
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

/* Softmax step of one warpgroup's tile against the shared running max s_m: masks (if needed),
 * scales to log2 units, moves s_m to the new max, leaves P = 2^(x - max) in s (f32) and p (bf16),
 * its rescale of the old max in s_sc_mine, and rescales o and l: by that factor (warpgroup 0), or
 * by it times the other warpgroup's s_sc_other (warpgroup 1, whose O last moved before the other's
 * step). present = false: no tile (P = 0, the max stays). */
template <bool kSecond>
__device__ __forceinline__ void pp_softmax(float (&s)[32], bool present, bool masked, int key0, int n, int prefix,
                                           const uint8_t *mrow0, const uint8_t *mrow1, int r0, int r1, int t4,
                                           float scale_log2, float *s_m, float *s_sc_mine, const float *s_sc_other,
                                           float (&o)[128], float (&l)[2], uint32_t (&p)[4][4]) {
    scale_mask(s, scale_log2, masked, key0, n, prefix, mrow0, mrow1, t4);
    if (!present) {
#pragma unroll
        for (int i = 0; i < 32; i++) s[i] = -INFINITY;
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = h ? r1 : r0;
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; j++) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_old = s_m[r];
        const float m_new = fmaxf(m_old, mx);
        const float base = m_new == -INFINITY ? 0.f : m_new; /* no key seen yet: P = 0, nothing to rescale */
        const float alpha = ex2(m_old - base);
        __syncwarp(); /* the quad has read s_m[r] */
        if (t4 == 0) {
            s_m[r] = m_new;
            s_sc_mine[r] = alpha;
        }
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            s[4 * j + 2 * h] = ex2(s[4 * j + 2 * h] - base);
            s[4 * j + 2 * h + 1] = ex2(s[4 * j + 2 * h + 1] - base);
            sum += s[4 * j + 2 * h] + s[4 * j + 2 * h + 1];
        }
        const float os = kSecond ? alpha * s_sc_other[r] : alpha;
        l[h] = l[h] * os + sum;
        if (os != 1.f) {
#pragma unroll
            for (int j = 0; j < 32; j++) o[4 * j + 2 * h] *= os, o[4 * j + 2 * h + 1] *= os;
        }
    }
    pack_p(s, 1.f, 1.f, p);
}

/* One segment (see run_segment). q_phase, k_phase: parities of the Q barrier and of this thread's
 * warpgroup's key buffer, carried across segments. */
__device__ __forceinline__ void run_segment_pp(const Args &a, uint8_t *smem, uint32_t sbase, int b, int mt, int tb, int te,
                                               int slot, uint32_t &q_phase, uint32_t &k_phase) {
    const int tid = threadIdx.x, lane = tid & 31, w4 = (tid >> 5) & 3;
    const int wg = __shfl_sync(0xffffffffu, tid / 128, 0); /* provably warp-uniform (see run_segment) */
    const int g = lane >> 2, t4 = lane & 3, wi = tid & 127;
    const int m0 = mt * kBM, rows_valid = min(kBM, a.rows - m0);
    const int n = req_keys(a, b), prefix = n - a.Q;
    const int r0 = 16 * w4 + g, r1 = r0 + 8;
    float *s_m = (float *)(smem + kPOffM), *s_sc0 = (float *)(smem + kPOffSc0), *s_sc1 = (float *)(smem + kPOffSc1);
    float *s_l = (float *)(smem + kPOffL);
    const uint32_t sq = sbase, buf0 = sbase + kOffK, buf1 = buf0 + kTileBytes;
    const uint32_t bar_q = sbase + kPOffBar, bars0 = bar_q + 8, bars1 = bars0 + 72;
    uint8_t *tile0 = smem + kOffK, *tile1 = tile0 + kTileBytes;

    fence_proxy_async(); /* this thread's generic accesses to the buffers (last staging) before the TMA below */
    __syncthreads();
    if (tid == 0) {
        mbar_arrive_expect_tx(bar_q, kTileBytes);
        for (int c = 0; c < kDqk / 64; c++) tma_load_2d(sq + c * kColBlock, &a.tm_q, 64 * c, b * a.rows + m0, bar_q);
        int e[4];
        tile_blocks(a, b, n, tb, e);
        load_blocks(a, b, n, tb, e, buf0, bars0, 0, 9);
        if (tb + 1 < te) {
            tile_blocks(a, b, n, tb + 1, e);
            load_blocks(a, b, n, tb + 1, e, buf1, bars1, 0, 9);
        }
    }
    if (tid < kBM) s_m[tid] = -INFINITY;
    /* Tree mask rows of the thread's rows (padding rows past Q * H read the last tree row). */
    const uint8_t *mrow0 = a.tree_mask + ((long long)b * a.Q + min((m0 + r0) / a.H, a.Q - 1)) * a.Q;
    const uint8_t *mrow1 = a.tree_mask + ((long long)b * a.Q + min((m0 + r1) / a.H, a.Q - 1)) * a.Q;
    float o[128], s[32], l[2] = {0.f, 0.f};
    uint32_t p[4][4];
#pragma unroll
    for (int i = 0; i < 128; i++) o[i] = 0.f;
    __syncthreads(); /* s_m is initialized */
    mbar_wait(bar_q, q_phase);
    q_phase ^= 1;

    if (wg == 0) {
        zero_s(s);
        scores_blocks<0, 9, false>(s, sq, buf0, bars0, k_phase);
        wgmma_wait<0>();
        fence_regs(s);
        k_phase ^= 1;
        for (int t0 = tb; t0 < te; t0 += 2) {
            const bool has1 = t0 + 1 < te, next0 = t0 + 2 < te, next1 = t0 + 3 < te;
            int e0[4], e1[4]; /* block-table entries of the next tiles (thread 0 issues their loads) */
            if (tid == 0) {
                tile_blocks(a, b, n, next0 ? t0 + 2 : t0, e0);
                tile_blocks(a, b, n, next1 ? t0 + 3 : t0, e1);
            }
            pp_softmax<false>(s, true, (t0 + 1) * kBN > prefix, t0 * kBN, n, prefix, mrow0, mrow1, r0, r1, t4, a.scale_log2,
                              s_m, s_sc0, nullptr, o, l, p);
            if ((t0 + 1) * kBN > n) { /* the request's last tile: keys past kv_len */
                zero_v_rows(tile0, max(n - t0 * kBN, 0), wi);
                fence_proxy_async();
                bar_sync(kBarWg0, 128);
            }
            bar_arrive(kBarScale0, 256);
            pv_rs(o, p, buf0); /* O_left += P0 V0_left */
            wgmma_wait<0>();
            fence_regs(o);
            fence_regs(p);
            bar_sync(kBarScale1, 256); /* warpgroup 1 has moved the max to m_b: a1 is out */
            if (tid == 0 && next0) load_blocks(a, b, n, t0 + 2, e0, buf0, bars0, 0, 4);
            const float c0 = s_sc1[r0], c1 = s_sc1[r1];
            pack_p(s, c0, c1, p);
            store_p(tile0 + 8 * kColBlock, p, r0, r1, t4);
            fence_proxy_async(); /* sP0 is read by warpgroup 1's wgmma */
            bar_arrive(kBarP0, 256);
            l[0] *= c0, l[1] *= c1;
            if (c0 != 1.f || c1 != 1.f) {
#pragma unroll
                for (int j = 0; j < 32; j++) o[4 * j] *= c0, o[4 * j + 1] *= c0, o[4 * j + 2] *= c1, o[4 * j + 3] *= c1;
            }
            if (has1) {
                bar_sync(kBarP1, 256); /* sP1 is written and V1 is zeroed past kv_len */
                pv_ss(o, buf1 + 8 * kColBlock, buf1); /* O_left += P1 V1_left */
            }
            if (next0) {
                zero_s(s);
                scores_blocks<0, 4, false>(s, sq, buf0, bars0, k_phase);
            }
            if (next1) {
                wgmma_wait<4>(); /* O_left's P1 V1 is done: buffer 1 blocks 0..3 and sP1 (block 8) are free */
                if (tid == 0) {
                    load_blocks(a, b, n, t0 + 3, e1, buf1, bars1, 0, 4);
                    load_blocks(a, b, n, t0 + 3, e1, buf1, bars1, 8, 9);
                }
            }
            if (next0) {
                scores_blocks<4, 9, false>(s, sq, buf0, bars0, k_phase);
                k_phase ^= 1;
            }
            wgmma_wait<0>();
            fence_regs(o);
            fence_regs(s);
        }
    } else {
        if (tb + 1 < te) {
            zero_s(s);
            scores_blocks<0, 9, true>(s, sq, buf1, bars1, k_phase);
            k_phase ^= 1;
        }
        wgmma_wait<0>();
        fence_regs(s);
        for (int t0 = tb; t0 < te; t0 += 2) {
            const int t1 = t0 + 1;
            const bool has1 = t1 < te, next0 = t0 + 2 < te, next1 = t1 + 2 < te;
            int e0[4], e1[4];
            if (tid == 128) {
                tile_blocks(a, b, n, next0 ? t0 + 2 : t0, e0);
                tile_blocks(a, b, n, next1 ? t1 + 2 : t0, e1);
            }
            bar_sync(kBarScale0, 256); /* warpgroup 0 has moved the max to m_a: a0 is out */
            pp_softmax<true>(s, has1, (t1 + 1) * kBN > prefix, t1 * kBN, n, prefix, mrow0, mrow1, r0, r1, t4, a.scale_log2,
                             s_m, s_sc1, s_sc0, o, l, p);
            if (has1 && (t1 + 1) * kBN > n) {
                zero_v_rows(tile1, max(n - t1 * kBN, 0), wi);
                fence_proxy_async();
                bar_sync(kBarWg0 + 1, 128);
            }
            bar_arrive(kBarScale1, 256);
            if (has1) {
                store_p(tile1 + 8 * kColBlock, p, r0, r1, t4);
                pv_rs(o, p, buf1 + 4 * kColBlock); /* O_right += P1 V1_right */
                fence_proxy_async();               /* sP1 is read by warpgroup 0's wgmma */
            }
            bar_sync(kBarP0, 256);
            pv_ss(o, buf0 + 8 * kColBlock, buf0 + 4 * kColBlock); /* O_right += P0 V0_right */
            if (has1) bar_arrive(kBarP1, 256);
            if (next1) {
                wgmma_wait<1>(); /* P1 V1_right is done: buffer 1 blocks 4..7 are free */
                if (tid == 128) load_blocks(a, b, n, t1 + 2, e1, buf1, bars1, 4, 8);
            }
            if (next0) {
                wgmma_wait<0>(); /* P0 V0_right is done: buffer 0 blocks 4..8 (sP0) are free */
                if (tid == 128) load_blocks(a, b, n, t0 + 2, e0, buf0, bars0, 4, 9);
            }
            if (next1) {
                zero_s(s);
                scores_blocks<0, 9, true>(s, sq, buf1, bars1, k_phase);
                k_phase ^= 1;
            }
            wgmma_wait<0>();
            fence_regs(o);
            fence_regs(s);
            fence_regs(p);
        }
    }

#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
    if (t4 == 0) s_l[wg * kBM + r0] = l[0], s_l[wg * kBM + r1] = l[1];
    __syncthreads(); /* row sums are out; all wgmma and loads of the segment are done */
    write_tile(a, smem, o, s_l[r0] + s_l[kBM + r0], s_l[r1] + s_l[kBM + r1], tid < kBM ? s_l[tid] + s_l[kBM + tid] : 0.f,
               s_m, b, m0, rows_valid, slot);
}

/* ---- variant 6: variant 2's schedule, loads by TMA ----
 *
 * As run_segment (warpgroup 0 computes S and the softmax, both warpgroups P V), but a key tile
 * is 9 TMA boxes (64 / kv_box each) issued by one thread of warpgroup 1 on one mbarrier per
 * buffer, its block-table entries read a tile earlier, so warpgroup 1 no longer spends the S
 * phase issuing 4608 cp.async and waiting on a block-table read. Q comes by TMA too. Keys past
 * kv_len in a request's last tile are zeroed in V by warpgroup 1 while warpgroup 0 computes S
 * (S only uses them under the mask). */

constexpr uint32_t kOffBarT = kOffSched + 128; /* mbarriers: Q, buffer 0, buffer 1 */
constexpr uint32_t kSmemT = kOffBarT + 3 * 8 + 1024;

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

/* One segment (see run_segment). q_phase: parity of the Q barrier; k_phase: bit j, of buffer j. */
__device__ __forceinline__ void run_segment_tma(const Args &a, uint8_t *smem, uint32_t sbase, int b, int mt, int tb, int te,
                                                int slot, uint32_t &q_phase, uint32_t &k_phase) {
    const int tid = threadIdx.x, lane = tid & 31, w4 = (tid >> 5) & 3;
    const int wg = __shfl_sync(0xffffffffu, tid / 128, 0); /* provably warp-uniform (see run_segment) */
    const int g = lane >> 2, t4 = lane & 3;
    const int m0 = mt * kBM, rows_valid = min(kBM, a.rows - m0);
    const int n = req_keys(a, b), prefix = n - a.Q;
    const int r0 = 16 * w4 + g, r1 = r0 + 8;
    float *s_scale = (float *)(smem + kOffScale), *s_m = (float *)(smem + kOffM), *s_l = (float *)(smem + kOffL);
    const uint32_t sq = sbase + kOffQ, sp = sbase + kOffP, buf0 = sbase + kOffK;
    const uint32_t bar_q = sbase + kOffBarT, bar0 = bar_q + 8;

    fence_proxy_async(); /* this thread's generic accesses to the buffers (last staging) before the TMA below */
    __syncthreads();
    if (tid == 0) {
        mbar_arrive_expect_tx(bar_q, kTileBytes);
        for (int c = 0; c < kDqk / 64; c++) tma_load_2d(sq + c * kColBlock, &a.tm_q, 64 * c, b * a.rows + m0, bar_q);
        int e[4];
        tile_blocks(a, b, n, tb, e);
        load_tile(a, b, n, tb, e, buf0, bar0);
    }
    int e_next[4]; /* thread 128: block-table entries of the next tile to load */
    if (tid == 128) tile_blocks(a, b, n, tb + 1 < te ? tb + 1 : tb, e_next);

    /* Tree mask rows of the thread's rows (padding rows past Q * H read the last tree row). */
    const uint8_t *mrow0 = a.tree_mask + ((long long)b * a.Q + min((m0 + r0) / a.H, a.Q - 1)) * a.Q;
    const uint8_t *mrow1 = a.tree_mask + ((long long)b * a.Q + min((m0 + r1) / a.H, a.Q - 1)) * a.Q;
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; i++) o[i] = 0.f;
    RowState st = {{-INFINITY, -INFINITY}, {0.f, 0.f}};
    mbar_wait(bar_q, q_phase);
    q_phase ^= 1;

    for (int kt = tb; kt < te; kt++) {
        const uint32_t j = (uint32_t)(kt - tb) & 1, sk = buf0 + j * kTileBytes;
        mbar_wait(bar0 + 8 * j, (k_phase >> j) & 1);
        k_phase ^= 1u << j;
        __syncthreads(); /* every thread is done with tile kt - 1: its buffer takes tile kt + 1 */
        if (tid == 128 && kt + 1 < te) {
            load_tile(a, b, n, kt + 1, e_next, buf0 + (j ^ 1) * kTileBytes, bar0 + 8 * (j ^ 1));
            tile_blocks(a, b, n, kt + 2 < te ? kt + 2 : kt, e_next);
        }
        uint32_t p[4][4];
        float alpha[2];
        if (wg == 0) {
            float s[32];
            scores_wgmma(s, sq, sk);
            softmax_tile(s, st, alpha, p, a.scale_log2, (kt + 1) * kBN > prefix, kt * kBN, n, prefix, mrow0, mrow1, t4);
            store_p(smem + kOffP, p, r0, r1, t4);
            if (t4 == 0) {
                s_scale[r0] = alpha[0];
                s_scale[r1] = alpha[1];
            }
            fence_proxy_async(); /* P is read by warpgroup 1's wgmma */
        } else if ((kt + 1) * kBN > n) { /* the request's last tile: keys past kv_len */
            zero_v_rows(smem + kOffK + j * kTileBytes, max(n - kt * kBN, 0), tid & 127);
            fence_proxy_async();
        }
        __syncthreads(); /* P, the rescale and the zeroed keys are in shared memory */
        if (wg == 1) {
            alpha[0] = s_scale[r0];
            alpha[1] = s_scale[r1];
        }
        if (alpha[0] != 1.f || alpha[1] != 1.f) {
#pragma unroll
            for (int i = 0; i < 32; i++) {
                o[4 * i] *= alpha[0];
                o[4 * i + 1] *= alpha[0];
                o[4 * i + 2] *= alpha[1];
                o[4 * i + 3] *= alpha[1];
            }
        }
        pv_wgmma(o, p, sp, sk, wg);
    }

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

/* Variant kV (verify_attn_sm90.h): run_segment with mma.sync or wgmma per product (1..4),
 * run_segment_pp (5), run_segment_tma (6). */
template <int kV>
__global__ void __launch_bounds__(kThreads, 1) va_sm90_kernel(const __grid_constant__ Args a) {
    constexpr bool kWgS = kV == 2 || kV == 3, kWgPV = kV == 2 || kV == 4;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    const uint32_t sbase = smem_u32(smem);
    long long *warp_sums = (long long *)(smem + (kV == 5 ? kPOffSched : kOffSched));
    long long *found_w = warp_sums + 8;
    int *found_b = (int *)(found_w + 1);
    uint32_t q_phase = 0, k_phase = 0; /* variants 5 and 6: barrier parities */
    if (kV >= 5 && threadIdx.x == 0) { /* used after the segment's first __syncthreads */
        const int nbar = kV == 5 ? 19 : 3;
        for (int i = 0; i < nbar; i++) mbar_init(sbase + (kV == 5 ? kPOffBar : kOffBarT) + 8 * i, 1);
        fence_mbar_init();
    }
    /* Let the combine kernel (programmatic dependent launch) start as soon as every CTA runs. */
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    const int mt = blockIdx.x, part = blockIdx.y, P = a.parts;
    long long W = 0, s_p = 0, e_p = LLONG_MAX, wb = 0; /* wb: position of request b */
    int b = 0;
    if (P > 1) {
        long long unused;
        sched_sums(a, 0, warp_sums, &W, &unused);
        s_p = part_start(W, P, part);
        e_p = part_start(W, P, part + 1);
        if (threadIdx.x == 0) *found_b = -1;
        long long run = 0;
        for (int base = 0; base < a.B; base += kThreads) { /* the request holding position s_p */
            const int bb = base + threadIdx.x;
            const long long w = bb < a.B ? key_tiles(req_keys(a, bb)) + kOverhead : 0;
            long long t;
            const long long incl = block_scan(w, warp_sums, &t);
            if (bb < a.B && run + incl - w <= s_p && s_p < run + incl) {
                *found_b = bb;
                *found_w = run + incl - w;
            }
            run += t;
            __syncthreads();
            if (*found_b >= 0) break;
        }
        b = *found_b;
        wb = *found_w;
        if (b < 0) return; /* only when the parts outnumber W: nothing here (uniform) */
    }
    for (; b < a.B; b++) {
        const int nt = key_tiles(req_keys(a, b));
        const long long first = wb + kOverhead; /* position of the request's first key tile */
        if (first >= e_p) break;
        const long long tb = (s_p > first ? s_p : first) - first, te = (e_p < first + nt ? e_p : first + nt) - first;
        if (tb < te) {
            int slot = -1; /* direct output */
            if (P > 1) {
                const int p0 = part_of(W, P, first), p1 = part_of(W, P, first + nt - 1);
                if (p0 != p1) slot = part == p0 ? 2 * part + 1 : 2 * part;
            }
            if constexpr (kV == 5) run_segment_pp(a, smem, sbase, b, mt, (int)tb, (int)te, slot, q_phase, k_phase);
            else if constexpr (kV == 6) run_segment_tma(a, smem, sbase, b, mt, (int)tb, (int)te, slot, q_phase, k_phase);
            else run_segment<kWgS, kWgPV>(a, smem, sbase, b, mt, (int)tb, (int)te, slot);
        }
        wb += nt + kOverhead;
    }
}

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
    const int b = blockIdx.y, P = a.parts;
    long long W, wb;
    sched_sums(a, b, warp_sums, &W, &wb);
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

/* ---- host ---- */

typedef void (*kernel_fn)(Args);
const kernel_fn kKernels[KDT_VA_SM90_VARIANTS] = {va_sm90_kernel<1>, va_sm90_kernel<2>, va_sm90_kernel<3>, va_sm90_kernel<4>,
                                                  va_sm90_kernel<5>, va_sm90_kernel<6>};

/* Scheduler constants: a key tile's time, the combine kernel's fixed cost, and the rate at which
 * partials are written and read back (mostly L2). Only their ratios matter. */
constexpr double kTileUs = 2.0, kCombineUs = 3.0, kPartialBytesPerUs = 5e6;
constexpr int kStartTiles = 3; /* a CTA's start (schedule, first loads) and end, in key tiles */

/* Parts per row tile: the split with the least estimated time, counting waves of CTAs (one CTA
 * per SM), the longest part's tiles and the partials' traffic; up to 4 waves. nt: key tiles per
 * request as the host sees it (the cache's capacity). */
int choose_parts(int B, int m_tiles, long long nt, int sms, int rows) {
    int best = 1;
    double best_us = 0;
    for (int P = 1; P <= 65535 && (P == 1 || (long long)m_tiles * P <= 4LL * sms); P++) {
        const double waves = (double)(((long long)m_tiles * P + sms - 1) / sms);
        double us = waves * ((double)B * (double)(nt + kOverhead) / P + kStartTiles) * kTileUs;
        if (P > 1) us += kCombineUs + 1.5 * (P - 1) * rows * (kDv * 2.0 + 4.0) * 2.0 / kPartialBytesPerUs;
        if (P == 1 || us < 0.97 * best_us) best = P, best_us = us; /* more parts only for a clear gain */
    }
    return best;
}

/* Workspace comes from a pool of our own that keeps freed memory (up to kPoolKeep), so a call per
 * layer does not map and unmap device memory each time; stream-ordered, so concurrent calls on
 * different streams are safe. */
constexpr int kMaxDevices = 64;
constexpr uint64_t kPoolKeep = 512ull << 20;
pthread_mutex_t g_pool_mu = PTHREAD_MUTEX_INITIALIZER;
cudaMemPool_t g_pool[kMaxDevices];

kdt_status workspace_pool(int dev, cudaMemPool_t *pool) {
    if (dev < 0 || dev >= kMaxDevices) {
        KDT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(pool, dev));
        return KDT_OK;
    }
    pthread_mutex_lock(&g_pool_mu);
    cudaError_t e = cudaSuccess;
    if (!g_pool[dev]) {
        cudaMemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = dev;
        cudaMemPool_t p = nullptr;
        e = cudaMemPoolCreate(&p, &props);
        uint64_t keep = kPoolKeep;
        if (e == cudaSuccess) e = cudaMemPoolSetAttribute(p, cudaMemPoolAttrReleaseThreshold, &keep);
        if (e == cudaSuccess) g_pool[dev] = p;
        else if (p) (void)cudaMemPoolDestroy(p);
    }
    *pool = g_pool[dev];
    pthread_mutex_unlock(&g_pool_mu);
    KDT_CUDA_CHECK(e);
    return KDT_OK;
}

/* cuTensorMapEncodeTiled, reached through the runtime's driver entry point (no -lcuda). */
pthread_once_t g_encode_once = PTHREAD_ONCE_INIT;
PFN_cuTensorMapEncodeTiled_v12000 g_encode;

void find_encode(void) {
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
        g_encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    else
        (void)cudaGetLastError();
}

/* A bf16 map over `rows` rows of 576 elements: boxes [box_rows, 64 elements] with the 128-byte
 * swizzle (the tiles' shared layout); reads outside the rows give zeros. */
int encode_rows(CUtensorMap *m, const void *base, long long rows, int box_rows) {
    const cuuint64_t dim[2] = {(cuuint64_t)kDqk, (cuuint64_t)rows};
    const cuuint64_t stride[1] = {(cuuint64_t)kDqk * 2};
    const cuuint32_t box[2] = {64, (cuuint32_t)box_rows};
    const cuuint32_t estride[2] = {1, 1};
    return g_encode(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)base, dim, stride, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
                    CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* Variant 5's tensor maps; 0 when the call does not fit them (block size not 16, 32 or a multiple
 * of 64, row coordinates past int32, no encoder): the caller runs variant 2 instead. */
int setup_tma(const kdt_verify_attn_params *p, Args *a) {
    pthread_once(&g_encode_once, find_encode);
    if (!g_encode) return 0;
    const long long lim = INT_MAX - 64; /* a box starting at kv_rows stays in int32 */
    int box = 64;
    long long kv_rows = (long long)p->B * p->L;
    if (p->kv_cache) {
        if (p->BS % 64 != 0 && p->BS != 16 && p->BS != 32) return 0;
        box = p->BS % 64 == 0 ? 64 : p->BS;
        kv_rows = (long long)p->NB * p->BS;
    }
    const long long q_rows = (long long)p->B * p->Q * p->H;
    if (kv_rows < 1 || kv_rows > lim || q_rows > lim) return 0;
    if (!encode_rows(&a->tm_q, p->q, q_rows, 64) || !encode_rows(&a->tm_kv, a->kv, kv_rows, box)) return 0;
    a->kv_rows = (int)kv_rows;
    a->kv_box = box;
    return 1;
}

int env_variant(void) { /* $KDT_VA_SM90: 0 off, 1..5 a variant; unset or unparsable: the default */
    const char *s = getenv("KDT_VA_SM90");
    if (!s || !*s) return KDT_VA_SM90_DEFAULT;
    char *end = nullptr;
    const long v = strtol(s, &end, 10);
    return (*end == 0 && v >= 0 && v <= KDT_VA_SM90_VARIANTS) ? (int)v : KDT_VA_SM90_DEFAULT;
}

int aligned(const void *p, uintptr_t n) { return ((uintptr_t)p % n) == 0; }

kdt_status launch(const kdt_verify_attn_params *p, cudaStream_t stream, int variant, int parts_req, int no_pdl,
                  kdt_va_sm90_info *info, int *handled) {
    int dev = 0, major = 0, sms = 0, max_smem = 0;
    KDT_CUDA_CHECK(cudaGetDevice(&dev));
    KDT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major != 9) return KDT_OK;
    KDT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    KDT_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if ((int)kSmemT > max_smem) return KDT_OK; /* the largest of the variants */

    const int paged = p->kv_cache != NULL;
    const long long rows = (long long)p->Q * p->H, cap = paged ? (long long)p->MB * p->BS : p->L;
    if (rows > INT_MAX / 2) return KDT_OK;
    Args a;
    memset(&a, 0, sizeof a);
    a.q = (const bf16 *)p->q;
    a.kv = (const bf16 *)(paged ? p->kv_cache : p->kv);
    a.block_table = paged ? p->block_table : nullptr;
    a.kv_len = p->kv_len;
    a.tree_mask = p->tree_mask;
    a.o = (bf16 *)p->o;
    a.lse = p->lse;
    a.L = p->L;
    a.NB = p->NB, a.BS = p->BS, a.MB = p->MB;
    a.B = p->B, a.Q = p->Q, a.H = p->H, a.rows = (int)rows;
    a.cap = (int)(cap < INT_MAX ? cap : INT_MAX);
    a.scale_log2 = p->sm_scale * 1.4426950408889634f;

    const int m_tiles = (int)((rows + kBM - 1) / kBM);
    const long long nt = (a.cap + kBN - 1) / kBN > 0 ? (a.cap + kBN - 1) / kBN : 1;
    int parts = parts_req > 0 ? parts_req : choose_parts(a.B, m_tiles, nt, sms, a.rows);
    if (parts > 65535) parts = 65535;
    if (a.B > 65535) parts = 1; /* the combine grid's y dimension */
    a.parts = parts;

    size_t ws_bytes = 0;
    void *ws = nullptr;
    if (parts > 1) {
        const size_t slot_rows = (size_t)2 * parts * (size_t)rows;
        ws_bytes = slot_rows * (kDv * sizeof(bf16) + sizeof(float));
        cudaMemPool_t pool;
        kdt_status s = workspace_pool(dev, &pool);
        if (s != KDT_OK) return s;
        KDT_CUDA_CHECK(cudaMallocFromPoolAsync(&ws, ws_bytes, pool, stream));
        a.o_part = (bf16 *)ws;
        a.lse_part = (float *)(a.o_part + slot_rows * kDv);
    }

    if (variant >= 5 && !setup_tma(p, &a)) variant = 2;
    const kernel_fn kernel = kKernels[variant - 1];
    const int smem = variant == 5 ? (int)kSmemPP : variant == 6 ? (int)kSmemT : (int)kSmemBytes;
    int pdl = 0;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e == cudaSuccess) {
        kernel<<<dim3((unsigned)m_tiles, (unsigned)parts), kThreads, (size_t)smem, stream>>>(a);
        e = cudaPeekAtLastError();
    }
    if (e == cudaSuccess && parts > 1) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3((unsigned)((rows + kThreads / 32 - 1) / (kThreads / 32)), (unsigned)a.B);
        cfg.blockDim = dim3(kThreads);
        cfg.stream = stream;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = no_pdl ? 0 : 1;
        /* Deep loads only where a request spans many parts: the registers they take cost occupancy. */
        void (*combine)(Args) = parts > 2 * a.B ? va_sm90_combine<16> : va_sm90_combine<4>;
        e = cudaLaunchKernelEx(&cfg, combine, a);
        if (e != cudaSuccess && cfg.numAttrs) { /* programmatic launch refused here: a plain launch */
            (void)cudaGetLastError();
            cfg.numAttrs = 0;
            e = cudaLaunchKernelEx(&cfg, combine, a);
        }
        pdl = cfg.numAttrs;
    }
    if (ws) {
        const cudaError_t ef = cudaFreeAsync(ws, stream);
        if (e == cudaSuccess) e = ef;
    }
    if (e != cudaSuccess)
        return kdt_fail(KDT_ERR_CUDA, "verify_attn sm90 (variant %d, %d x %d CTAs): %s", variant, m_tiles, parts,
                        cudaGetErrorString(e));
    if (info) {
        info->variant = variant;
        info->m_tiles = m_tiles;
        info->parts = parts;
        info->grid = m_tiles * parts;
        info->smem_bytes = smem;
        info->workspace_bytes = ws_bytes;
        info->pdl = pdl;
    }
    *handled = 1;
    return KDT_OK;
}

} // namespace

extern "C" kdt_status kdt_verify_attn_sm90_ex(const kdt_verify_attn_params *p, void *stream, const kdt_va_sm90_config *cfg,
                                              kdt_va_sm90_info *info, int *handled) {
    *handled = 0;
    if (!p || p->dtype != KDT_BF16 || p->Dv != kDv || p->Dr != kDr || p->B < 1 || p->Q < 1 || p->H < 1) return KDT_OK;
    const void *kv = p->kv_cache ? p->kv_cache : p->kv;
    if (!aligned(p->q, 16) || !aligned(kv, 16) || !aligned(p->o, 16) || !aligned(p->lse, 4)) return KDT_OK;
    int variant = cfg && cfg->variant ? cfg->variant : env_variant();
    if (variant == 0) variant = KDT_VA_SM90_DEFAULT; /* $KDT_VA_SM90=0 switches the hook off, not this entry */
    if (variant < 1 || variant > KDT_VA_SM90_VARIANTS)
        return kdt_fail(KDT_ERR_INVALID_ARG, "verify_attn sm90: variant %d outside 1 .. %d", variant, KDT_VA_SM90_VARIANTS);
    if (cfg && cfg->parts < 0) return kdt_fail(KDT_ERR_INVALID_ARG, "verify_attn sm90: parts %d is negative", cfg->parts);
    return launch(p, (cudaStream_t)stream, variant, cfg ? cfg->parts : 0, cfg ? cfg->no_pdl : 0, info, handled);
}

extern "C" kdt_status kdt_verify_attn_sm90(const kdt_verify_attn_params *p, void *stream, int *handled) {
    *handled = 0;
    if (env_variant() == 0) return KDT_OK;
    return kdt_verify_attn_sm90_ex(p, stream, NULL, NULL, handled);
}
