/* verify_attn sm90 split-KV scheduler: how the keys of all requests are cut into `parts` equal
 * ranges (device side, the same walk in the main and the combine kernel) and how many parts a
 * call gets (host side, choose_parts). */
#pragma once

#include <limits.h>

#include "cuda/sm90/verify_attn_sm90_traits.cuh"

namespace kdt_va_sm90 {

__device__ __forceinline__ int req_keys(const Args &a, int b) { return min(max(a.kv_len[b], 0), a.cap); }
__device__ __forceinline__ int key_tiles(int n) { return max(1, (n + kBN - 1) / kBN); }
/* Part p covers positions [part_start(p), part_start(p + 1)) of W. */
__device__ __forceinline__ long long part_start(long long W, int P, int p) { return (long long)p * W / P; }
/* The part holding position pos: the largest p with part_start(p) <= pos. */
__device__ __forceinline__ int part_of(long long W, int P, long long pos) { return (int)(((pos + 1) * P + W - 1) / W - 1); }

/* Inclusive scan over the CTA's 256 threads; *total gets the CTA's sum. */
static __device__ long long block_scan(long long v, long long *warp_sums, long long *total) {
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
static __device__ void sched_sums(const Args &a, int upto, long long *warp_sums, long long *W, long long *before) {
    *W = 0;
    *before = 0;
    for (int base = 0; base < a.B; base += kThreads) {
        const int b = base + threadIdx.x;
        const long long w = b < a.B ? key_tiles(req_keys(a, b)) + kOverhead : 0;
        long long t, u = 0;
        block_scan(w, warp_sums, &t);
        if (base < upto) block_scan(b < upto ? w : 0, warp_sums, &u); /* uniform: upto and base are */
        *W += t;
        *before += u;
    }
}

/* Scheduler constants, fitted to the H200's split sweep (docs/perf/verify_attn_sm90.md): a key tile's
 * time, the combine's fixed cost (its launch and the partials' round trip), the rate at which partials
 * are written and read back (mostly L2); only their ratios matter. */
constexpr double kTileUs = 2.0, kCombineUs = 8.0, kPartialBytesPerUs = 5e6;
constexpr int kStartTiles = 4; /* a CTA's start (schedule, first loads) and end, in key tiles */

/* The parts a call really uses, from W (all positions, by the real kv_len): the host chose a.parts
 * for full caches (it does not see kv_len), so a call whose requests hold fewer keys keeps the
 * host's grid (its waves) with no more parts than positions, and none of them when the split cannot
 * pay for the combine (W (1 - 1/P) tiles saved against kCombineUs): a decode step over a few keys of
 * a large cache runs in one part and its combine has nothing to merge. Forced splits (exact_parts)
 * are kept as asked. The main and combine kernels agree on it. */
__device__ __forceinline__ int part_count(const Args &a, long long W) {
    if (a.exact_parts || a.parts <= 1) return a.parts;
    const int p = (int)min((long long)a.parts, W);
    return (double)W * (1.0 - 1.0 / p) * kTileUs > kCombineUs ? p : 1;
}

/* The segments of this CTA (row tile blockIdx.x, part blockIdx.y of a.parts), in order: for each
 * request with key tiles in the part's range, seg(b, tb, te, slot) runs tiles [tb, te) of request b;
 * slot -1 writes o directly, else the partial slot of a request cut across parts. Every thread
 * calls it (the scans are CTA-wide); the scratch is at kOffSched of smem. */
template <typename Seg>
__device__ __forceinline__ void walk_segments(const Args &a, uint8_t *smem, Seg &&seg) {
    long long *warp_sums = (long long *)(smem + kOffSched);
    long long *found_w = warp_sums + 8;
    int *found_b = (int *)(found_w + 1);
    const int part = blockIdx.y;
    int P = a.parts;
    long long W = 0, s_p = 0, e_p = LLONG_MAX, wb = 0; /* wb: position of request b */
    int b = 0;
    if (P > 1) {
        long long unused;
        sched_sums(a, 0, warp_sums, &W, &unused);
        P = part_count(a, W);
        if (part >= P) return; /* a part this call does not use (uniform) */
        s_p = part_start(W, P, part);
        e_p = part_start(W, P, part + 1);
    }
    if (s_p > 0) { /* the request holding position s_p (part 0 starts at request 0) */
        if (threadIdx.x == 0) *found_b = -1;
        long long run = 0;
        for (int base = 0; base < a.B; base += kThreads) {
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
            seg(b, (int)tb, (int)te, slot);
        }
        wb += nt + kOverhead;
    }
}

/* Parts per row tile: the split with the least estimated time, counting waves of CTAs (one CTA
 * per SM), the longest part's whole tiles and the partials' traffic; up to 4 waves, and no more parts
 * than positions. nt: key tiles per request as the host sees it (the cache's capacity; part_count
 * scales the split down on the device when the requests hold fewer keys). */
inline int choose_parts(int B, int m_tiles, long long nt, int sms, int rows) {
    int best = 1;
    double best_us = 0;
    const long long w_cap = (long long)B * (nt + kOverhead);
    for (int P = 1; P <= 65535 && P <= w_cap && (P == 1 || (long long)m_tiles * P <= 4LL * sms); P++) {
        const double waves = (double)(((long long)m_tiles * P + sms - 1) / sms);
        /* The longest part's tiles: whole work units, ceil(W / P) (2,16,17,2048: W = 70 is 4 units a part
         * at 23 parts, 3 at 24; the sweep measured 24.7-25.0 against 22.8 us). */
        double us = waves * ((double)((w_cap + P - 1) / P) + kStartTiles) * kTileUs;
        if (P > 1) us += kCombineUs + 1.5 * (P - 1) * rows * (kDv * 2.0 + 4.0) * 2.0 / kPartialBytesPerUs;
        if (P == 1 || us < 0.97 * best_us) best = P, best_us = us; /* more parts only for a clear gain */
    }
    return best;
}

} // namespace kdt_va_sm90
