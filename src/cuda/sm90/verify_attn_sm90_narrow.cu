/* verify_attn on Hopper: the narrow kernel, for calls of at most kNarrowRows (16) rows (Q H: the small
 * model's decode at 4 heads), where the main kernel's products would be mostly padding (S = Q K^T as
 * m64n64 with M = 64 rows, 4 of them real). Here the products are swapped: S^T = K Q^T is m64n16k16
 * (M = the tile's 64 keys, N = 16 rows; A = the key tile, B = Q, both K-major) and O^T += V^T P^T four
 * m64n16k16 chains per warpgroup (M = 64 output dims each; A = V^T read M-major from the same swizzled
 * tile, imm-trans-a, as the main kernel reads V N-major; B = P^T stored [row, key] like its P tile).
 * The softmax runs in warpgroup 0 over keys spread across its 4 warps: tile maxima by shuffles over the
 * 8 lanes of a row, then through shared memory and a named barrier of its 128 threads. Loads (TMA, the
 * block table a tile ahead), the split walk, the partials and the combine are the main kernel's. Per key
 * tile ~1,750 cycles of shared-memory reads against the main kernel's ~3,830
 * (docs/perf/verify_attn_sm90.md). Not bit-identical to the main kernel: another summation order. */
#include <math.h>

#include "cuda/sm90/verify_attn_sm90_tile.cuh"

namespace kdt_va_sm90 {
namespace {

enum { kBarWg0 = 1 }; /* named barrier of warpgroup 0's 128 threads */


/* Accumulator element i of an m64n16 product (thread of warp w4, lane g * 4 + t4): M index
 * 16 w4 + g + 8 ((i & 3) >> 1), N index 8 (i >> 2) + 2 t4 + (i & 1). Here N is the row (query)
 * and M the key (S^T) or the output dim (O^T); a thread's rows are qr(i) = 8 (i >> 2) + 2 t4 + (i & 1),
 * four of them: slot qs(i) = 2 (i >> 2) + (i & 1). */
__device__ __forceinline__ int row_of(int i, int t4) { return 8 * (i >> 2) + 2 * t4 + (i & 1); }
__device__ __forceinline__ int slot_of(int i) { return 2 * (i >> 2) + (i & 1); }
__device__ __forceinline__ int slot_row(int k, int t4) { return 8 * (k >> 1) + 2 * t4 + (k & 1); } /* row of slot k */

/* One segment: the call's rows (<= 16) of request b against its key tiles [tb, te). */
__device__ __forceinline__ void run_segment_narrow(const Args &a, uint8_t *smem, uint32_t sbase, int b, int tb, int te, int slot,
                                                   uint32_t &q_phase, uint32_t &k_phase) {
    const int tid = threadIdx.x, lane = tid & 31, w4 = (tid >> 5) & 3;
    const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
    const int g = lane >> 2, t4 = lane & 3;
    const int rows_valid = a.rows;
    const int n = req_keys(a, b), prefix = n - a.Q;
    float *s_alpha = (float *)(smem + kOffScale);         /* [16] this tile's rescale per row */
    float *s_red = (float *)(smem + kOffM);               /* [4 warps][16] tile maxima, then row sums */
    float *s_fin = (float *)(smem + kOffL);               /* [16] max (log2), [16..31] sum */
    const uint32_t sq = sbase + kOffQ, sp = sbase + kOffP, buf0 = sbase + kOffK;
    const uint32_t bar_q = sbase + kOffBarT, bar0 = bar_q + 8;

    int e_next[4];
    tma_segment_start(a, b, n, 0, tb, te, sq, buf0, bar_q, bar0, e_next);

    const uint8_t *mrow[4]; /* mask rows of the thread's 4 rows (padding rows read the last tree row) */
#pragma unroll
    for (int k = 0; k < 4; k++)
        mrow[k] = a.tree_mask + ((long long)b * a.Q + min(slot_row(k, t4) / a.H, a.Q - 1)) * a.Q;
    float o[32]; /* O^T: 4 column blocks of 64 dims (256 wg + 64 mb ..) x the 16 rows */
#pragma unroll
    for (int i = 0; i < 32; i++) o[i] = 0.f;
    float m[4], l[4]; /* per row slot: running max (log2 units), this thread's partial sum */
#pragma unroll
    for (int k = 0; k < 4; k++) m[k] = -INFINITY, l[k] = 0.f;
    mbar_wait(bar_q, q_phase);
    q_phase ^= 1;

    for (int kt = tb; kt < te; kt++) {
        const uint32_t sk = tma_tile_top(a, b, n, kt, tb, te, buf0, bar0, k_phase, e_next), j = (uint32_t)(kt - tb) & 1;
        if (wg == 0) {
            float s[8];
#pragma unroll
            for (int i = 0; i < 8; i++) s[i] = 0.f;
            fence_regs(s);
            const uint32_t lq = desc_lo(sq, 16), lk = desc_lo(sk, 16);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kDqk / 16; kk++) wgmma_m64n16k16_ss<0>(s, desc_from(lk + kstep_off(kk), 1024), desc_from(lq + kstep_off(kk), 1024));
            wgmma_commit();
            wgmma_wait0();
            fence_regs(s);
            const bool masked = (kt + 1) * kBN > prefix;
            float tmax[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int key = kt * kBN + 16 * w4 + g + 8 * ((i & 3) >> 1), k = slot_of(i);
                float v = s[i] * a.scale_log2;
                if (masked && !(key < n && (key < prefix || mrow[k][key - prefix] != 0))) v = -INFINITY;
                s[i] = v;
                tmax[k] = fmaxf(tmax[k], v);
            }
#pragma unroll
            for (int k = 0; k < 4; k++) { /* over the 8 lanes of a row slot (g), then the 4 warps */
                tmax[k] = fmaxf(tmax[k], __shfl_xor_sync(0xffffffffu, tmax[k], 4));
                tmax[k] = fmaxf(tmax[k], __shfl_xor_sync(0xffffffffu, tmax[k], 8));
                tmax[k] = fmaxf(tmax[k], __shfl_xor_sync(0xffffffffu, tmax[k], 16));
                if (g == 0) s_red[16 * w4 + slot_row(k, t4)] = tmax[k];
            }
            bar_sync(kBarWg0, 128);
            float alpha[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int r = slot_row(k, t4);
                const float mx = fmaxf(fmaxf(s_red[r], s_red[16 + r]), fmaxf(s_red[32 + r], s_red[48 + r]));
                const float m_new = fmaxf(m[k], mx), base = m_new == -INFINITY ? 0.f : m_new;
                alpha[k] = ex2(m[k] - base);
                m[k] = m_new;
                l[k] *= alpha[k];
                tmax[k] = base;
            }
#pragma unroll
            for (int i = 0; i < 8; i++) { /* P^T to shared memory as [row, key]: the B operand, K-major */
                const int k = slot_of(i), r = row_of(i, t4), key = 16 * w4 + g + 8 * ((i & 3) >> 1);
                const float p = ex2(s[i] - tmax[k]);
                l[k] += p;
                *(bf16 *)(smem + kOffP + r * 128 + (((key >> 3) ^ (r & 7)) << 4) + (key & 7) * 2) = __float2bfloat16_rn(p);
            }
            if (w4 == 0 && g == 0)
#pragma unroll
                for (int k = 0; k < 4; k++) s_alpha[slot_row(k, t4)] = alpha[k];
            fence_proxy_async();
        } else if ((kt + 1) * kBN > n) {
            zero_v_rows(smem + kOffK + j * kTileBytes, max(n - kt * kBN, 0), tid & 127);
            fence_proxy_async();
        }
        __syncthreads(); /* P^T, the rescale and the zeroed keys are in shared memory; s_red is read */
#pragma unroll
        for (int i = 0; i < 32; i++) o[i] *= s_alpha[row_of(i & 7, t4)];
        fence_regs(o);
        wgmma_fence();
        const uint32_t lp = desc_lo(sp, 16);
#pragma unroll
        for (int mb = 0; mb < 4; mb++) {
            const uint32_t lv = desc_lo(sk + (uint32_t)(4 * wg + mb) * kColBlock, kColBlock);
            float(&d)[8] = *reinterpret_cast<float(*)[8]>(o + 8 * mb);
#pragma unroll
            for (int kk = 0; kk < kBN / 16; kk++)
                wgmma_m64n16k16_ss<1>(d, desc_from(lv + kk * 128, 1024), desc_from(lp + kk * 2, 1024));
        }
        wgmma_commit();
        wgmma_wait0();
        fence_regs(o);
    }

    /* The end: row sums over the keys of all 4 warps, then O^T / l staged as [row, 512] and written. */
    if (wg == 0) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float v = l[k];
            v += __shfl_xor_sync(0xffffffffu, v, 4);
            v += __shfl_xor_sync(0xffffffffu, v, 8);
            v += __shfl_xor_sync(0xffffffffu, v, 16);
            l[k] = v;
        }
    }
    __syncthreads(); /* every thread's last P V is done, s_red's maxima read: the buffers are free */
    if (wg == 0 && g == 0)
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int r = slot_row(k, t4);
            s_red[16 * w4 + r] = l[k];
            if (w4 == 0) s_fin[r] = m[k];
        }
    __syncthreads();
    if (tid < kNarrowRows) s_fin[16 + tid] = s_red[tid] + s_red[16 + tid] + s_red[32 + tid] + s_red[48 + tid];
    __syncthreads();
    bf16 *stage = (bf16 *)(smem + kOffK);
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const int r = row_of(i & 7, t4), dim = 256 * wg + 64 * (i >> 3) + 16 * w4 + g + 8 * ((i & 3) >> 1);
        const float lr = s_fin[16 + r];
        stage[r * kStride + dim] = __float2bfloat16_rn(lr > 0.f ? o[i] / lr : 0.f);
    }
    __syncthreads();
    const long long row0 = (slot < 0 ? (long long)b : (long long)slot) * a.rows;
    bf16 *dst = slot < 0 ? a.o : a.o_part;
    for (int i = tid; i < rows_valid * (kDv / 8); i += kThreads) {
        const int r = i / (kDv / 8), c = i % (kDv / 8);
        *(uint4 *)(dst + (row0 + r) * kDv + 8 * c) = *(const uint4 *)(stage + r * kStride + 8 * c);
    }
    if (tid < rows_valid) {
        const float lr = s_fin[16 + tid];
        (slot < 0 ? a.lse : a.lse_part)[row0 + tid] = lr > 0.f ? s_fin[tid] * 0.69314718055994531f + logf(lr) : -INFINITY;
    }
}

__global__ void __launch_bounds__(kThreads, 1) va_sm90_narrow_kernel(const __grid_constant__ Args a) {
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    const uint32_t sbase = smem_u32(smem);
    uint32_t q_phase = 0, k_phase = 0;
    if (threadIdx.x == 0) {
        for (int i = 0; i < 3; i++) mbar_init(sbase + kOffBarT + 8 * i, 1);
        fence_mbar_init();
    }
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    walk_segments(a, smem, [&](int b, int tb, int te, int slot) { run_segment_narrow(a, smem, sbase, b, tb, te, slot, q_phase, k_phase); });
}

} // namespace

cudaError_t launch_narrow(const Args &a, int no_pdl, cudaStream_t stream, int *smem, int *pdl) {
    *smem = (int)kSmemT;
    const cudaError_t e = cudaFuncSetAttribute(va_sm90_narrow_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, *smem);
    if (e != cudaSuccess) return e;
    return launch_pdl(va_sm90_narrow_kernel, dim3(1, (unsigned)a.parts), (size_t)*smem, a, no_pdl, stream, pdl);
}

} // namespace kdt_va_sm90
