/* verify_attn on Hopper: the main kernel. bf16, Dv 512 / Dr 64, tree mask, paged (any
 * block size) or contiguous KV. Build: sm_90a only (the Makefile's SM90_ARCH).
 *
 * Design (FlashMLA's shape, plus the tree mask):
 * - Rows: the Q * H (tree row, head) pairs of a request, row = i * H + h, so they are contiguous in q
 *   and o. A CTA (256 threads, 2 warpgroups) owns a tile of 64 rows; each latent key tile
 *   [64 keys, 576] goes to shared memory once and serves all 64 rows (all heads of the request).
 * - Per key tile: warpgroup 0 computes S = Q K^T [64, 64] over 576 dims by wgmma, applies the mask
 *   (only on tiles reaching past the prefix: tree keys and the ragged end), runs the online softmax
 *   and hands P (bf16) and the row rescale to warpgroup 1 through shared memory; then both compute
 *   O += P V, V being the first 512 dims of the same tile: warpgroup 0 output dims 0..255 with P
 *   from registers, warpgroup 1 dims 256..511 with P from shared memory. Accumulation is f32.
 * - Key tiles are double-buffered, the next tile loading while this one computes. Two kernels
 *   differ only in how: the TMA kernel (the default: 9 boxes a tile issued by one thread, an
 *   mbarrier per buffer, block-table entries read a tile ahead; block size 16, 32 or a multiple
 *   of 64, or contiguous) and the cp.async kernel (16-byte cp.async from warpgroup 1, any block
 *   size: what the TMA maps cannot describe runs here). Tiles use the 128-byte swizzled layout
 *   (sm90_ptx.cuh), written by TMA and cp.async alike and read by wgmma descriptors.
 * - Keys past kv_len in a request's last tile: zero rows (cp.async), or zeroed in V after the
 *   TMA load, so whatever the cache holds there (NaN included) adds 0.
 * - Split-KV: the grid is (row tiles, parts). The keys of all requests, each request's tiles plus
 *   a fixed overhead, are laid end to end and cut into `parts` equal ranges (by the real kv_len,
 *   read on the device); a CTA walks its range request by request (a "segment" each), so CTAs of
 *   one part read the same keys at the same time (L2 reuse). A request that falls in one part is
 *   written directly; one cut across parts writes normalized partials and their LSE, merged by the
 *   combine kernel (verify_attn_sm90_combine.cu). The host picks `parts` from the shape
 *   (choose_parts in verify_attn_sm90_sched.cuh); with 1 there is no combine kernel.
 *
 * Safety without host checks: kv_len is clamped to [0, cache]; a key whose block-table entry is
 * outside [0, NB) reads as a zero row; mask reads stay inside the request's [Q, Q]. */
#include <limits.h>

#include "cuda/sm90/verify_attn_sm90_tile.cuh"

namespace kdt_va_sm90 {
namespace {

/* ---- the cp.async kernel's segment: rows [m0, m0 + 64) of request b against its key tiles [tb, te) ---- */

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
    float *s_scale = (float *)(smem + kOffScale);
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
            scores_wgmma(s, sq, sk);
            softmax_tile(s, st, alpha, p, a.scale_log2, (kt + 1) * kBN > prefix, kt * kBN, n, prefix, mrow0, mrow1, t4);
            store_p(smem + kOffP, p, r0, r1, t4); /* for warpgroup 1 */
            if (t4 == 0) {
                s_scale[r0] = alpha[0];
                s_scale[r1] = alpha[1];
            }
            fence_proxy_async(); /* P is read by warpgroup 1's wgmma */
        }
        __syncthreads(); /* P and the rescale are in shared memory */
        rescale_pv(o, alpha, p, s_scale, sp, sk, wg, r0, r1);
    }

    end_segment(a, smem, o, st, b, m0, rows_valid, slot, wg, r0, r1, t4);
}

/* ---- the TMA kernel's segment ----
 *
 * As run_segment, but a key tile is 9 TMA boxes (64 / kv_box each) issued by one thread of
 * warpgroup 1 on one mbarrier per buffer, its block-table entries read a tile earlier, so
 * warpgroup 1 no longer spends the S phase issuing 4608 cp.async and waiting on a block-table
 * read. Q comes by TMA too. Keys past kv_len in a request's last tile are zeroed in V by
 * warpgroup 1 while warpgroup 0 computes S (S only uses them under the mask). */

/* One segment (see run_segment). q_phase: parity of the Q barrier; k_phase: bit j, of buffer j. */
__device__ __forceinline__ void run_segment_tma(const Args &a, uint8_t *smem, uint32_t sbase, int b, int mt, int tb, int te,
                                                int slot, uint32_t &q_phase, uint32_t &k_phase) {
    const int tid = threadIdx.x, lane = tid & 31, w4 = (tid >> 5) & 3;
    const int wg = __shfl_sync(0xffffffffu, tid / 128, 0); /* provably warp-uniform (see run_segment) */
    const int g = lane >> 2, t4 = lane & 3;
    const int m0 = mt * kBM, rows_valid = min(kBM, a.rows - m0);
    const int n = req_keys(a, b), prefix = n - a.Q;
    const int r0 = 16 * w4 + g, r1 = r0 + 8;
    float *s_scale = (float *)(smem + kOffScale);
    const uint32_t sq = sbase + kOffQ, sp = sbase + kOffP, buf0 = sbase + kOffK;
    const uint32_t bar_q = sbase + kOffBarT, bar0 = bar_q + 8;

    int e_next[4]; /* thread 128: block-table entries of the next tile to load */
    tma_segment_start(a, b, n, m0, tb, te, sq, buf0, bar_q, bar0, e_next);

    /* Tree mask rows of the thread's rows (padding rows past Q * H read the last tree row). */
    const uint8_t *mrow0 = a.tree_mask + ((long long)b * a.Q + min((m0 + r0) / a.H, a.Q - 1)) * a.Q;
    const uint8_t *mrow1 = a.tree_mask + ((long long)b * a.Q + min((m0 + r1) / a.H, a.Q - 1)) * a.Q;
    if (wg == 0 && t4 == 0 && te * kBN > prefix) { /* the mask's bytes of the first masked tile, read after its S */
        const int k0 = min(max(tb * kBN - prefix, 0), a.Q - 1); /* inside the row even when kv_len < Q */
        prefetch_l2(mrow0 + k0);
        prefetch_l2(mrow1 + k0);
    }
    float o[128];
#pragma unroll
    for (int i = 0; i < 128; i++) o[i] = 0.f;
    RowState st = {{-INFINITY, -INFINITY}, {0.f, 0.f}};
    mbar_wait(bar_q, q_phase);
    q_phase ^= 1;

    for (int kt = tb; kt < te; kt++) {
        const uint32_t sk = tma_tile_top(a, b, n, kt, tb, te, buf0, bar0, k_phase, e_next), j = (uint32_t)(kt - tb) & 1;
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
        rescale_pv(o, alpha, p, s_scale, sp, sk, wg, r0, r1);
    }

    end_segment(a, smem, o, st, b, m0, rows_valid, slot, wg, r0, r1, t4);
}

/* kTma: the TMA kernel (run_segment_tma), else the cp.async kernel (run_segment). */
template <bool kTma>
__global__ void __launch_bounds__(kThreads, 1) va_sm90_kernel(const __grid_constant__ Args a) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    const uint32_t sbase = smem_u32(smem);
    uint32_t q_phase = 0, k_phase = 0; /* the TMA kernel's barrier parities */
    if (kTma && threadIdx.x == 0) { /* used after the segment's first __syncthreads */
        for (int i = 0; i < 3; i++) mbar_init(sbase + kOffBarT + 8 * i, 1);
        fence_mbar_init();
        prefetch_tensormap(&a.tm_q); /* the first loads wait on the descriptors otherwise */
        prefetch_tensormap(&a.tm_kv);
    }
    /* Under programmatic dependent launch this CTA may run before the kernel ahead of it in the
     * stream is done: nothing in global memory is read or written before that kernel has finished. */
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    /* Request 0's first block-table line while kv_len is read: one dependent load less on short calls
     * (part 0, and every call in one part, starts there). */
    if (kTma && threadIdx.x == 0 && a.block_table) prefetch_l2(a.block_table);
    /* Let the combine kernel (programmatic dependent launch) start as soon as every CTA runs. */
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    walk_segments(a, smem, [&](int b, int tb, int te, int slot) {
        if constexpr (kTma) run_segment_tma(a, smem, sbase, b, blockIdx.x, tb, te, slot, q_phase, k_phase);
        else run_segment(a, smem, sbase, b, blockIdx.x, tb, te, slot);
    });
}

} // namespace

cudaError_t launch_main(const Args &a, int tma, int m_tiles, int no_pdl, cudaStream_t stream, int *smem, int *pdl) {
    void (*kernel)(Args) = tma ? va_sm90_kernel<true> : va_sm90_kernel<false>;
    *smem = tma ? (int)kSmemT : (int)kSmemBytes;
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, *smem);
    if (e != cudaSuccess) return e;
    return launch_pdl(kernel, dim3((unsigned)m_tiles, (unsigned)a.parts), (size_t)*smem, a, no_pdl, stream, pdl);
}

} // namespace kdt_va_sm90
