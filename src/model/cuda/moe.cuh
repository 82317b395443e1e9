/* The device code of moe.cu's kernel, with no includes of its own, so that
 * tests/test_model_moe_emu.cc runs it on CPU threads. The CUDA subset it uses: blockIdx, threadIdx,
 * gridDim, __shared__, __syncthreads, __shfl_xor_sync, uint2 / uint4 / float4 loads, bf16
 * conversions, __uint_as_float, and pdl.cuh's kdt_pdl_begin (nothing on CPU threads). See moe.cu
 * for the design. */
#pragma once

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kW = 4;              /* weight rows per warp: loads in flight per lane */
constexpr int kMaxRows = 16;       /* input rows per pass, at most */
constexpr int kChunkBytes = 2048;  /* of each staged input row */
constexpr int kSliceRows = 64;     /* an expert's rows per block (blockIdx.z: which slice); a multiple of kRows */

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

/* 8 consecutive elements at p (16-byte aligned for bf16, 32 for f32) as floats. */
__device__ __forceinline__ void load8(const __nv_bfloat16 *p, float (&f)[8]) {
    const uint4 v = *(const uint4 *)p;
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 t = __bfloat1622float2(*(const __nv_bfloat162 *)&w[i]);
        f[2 * i] = t.x, f[2 * i + 1] = t.y;
    }
}
__device__ __forceinline__ void load8(const float *p, float (&f)[8]) {
    const float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
template <typename T> __device__ __forceinline__ void store8(T *dst, const T *src) {
    if (sizeof(T) == 2) {
        *(uint4 *)dst = *(const uint4 *)src;
    } else {
        ((float4 *)dst)[0] = ((const float4 *)src)[0];
        ((float4 *)dst)[1] = ((const float4 *)src)[1];
    }
}
/* The weights as the kernel reads them: a row handle per weight row, and 8 consecutive values of
 * a row (from a multiple of 8) as floats. WPlain: [E, rows, n_in] in the activations' type. */
template <typename T> struct WPlain {
    const T *w;
    typedef const T *Row;
    __device__ __forceinline__ Row row(int e, size_t rows_w, size_t r, int n_in) const { return w + ((size_t)e * rows_w + r) * n_in; }
    __device__ __forceinline__ void load(Row r, int k, float (&f)[8]) const { load8(r + k, f); }
};

/* WPlain's experts [E, rows, n_in] and, as expert E, a MoE layer's shared expert [rows, n_in] (same
 * rows and width), so that one launch runs both (moe_small_kernel's shared_off). */
template <typename T> struct WShared {
    const T *w, *ws;
    int E;
    typedef const T *Row;
    __device__ __forceinline__ Row row(int e, size_t rows_w, size_t r, int n_in) const {
        return e < E ? w + ((size_t)e * rows_w + r) * n_in : ws + r * n_in;
    }
    __device__ __forceinline__ void load(Row r, int k, float (&f)[8]) const { load8(r + k, f); }
};

/* e4m3 (torch.float8_e4m3fn) to f32 by its bits, exact; the NaN codes 0x7f / 0xff (never in a
 * checkpoint) read as 480. */
__device__ __forceinline__ float e4m3_to_f32(uint32_t b) {
    const uint32_t e = (b >> 3) & 15u, m = b & 7u;
    const float mag = e ? __uint_as_float((e + 120u) << 23 | m << 20) : (float)m * 0.001953125f;
    return (b & 0x80u) ? -mag : mag;
}

/* Quantized experts (kdt_dlin: FP8 128x128 blocks, INT4 groups of 32): each 8-value slice is
 * dequantized to f32 in registers, code times its scale (exact, as the CPU's dequantizers), so the
 * weights stream at their stored size. Part p holds rows [0, N0) (p = 0) or [N0, N) (p = 1) of
 * each of the E matrices [N, K], matrix e of a part at e times its size. */
template <bool kInt4> struct WQuant {
    const uint8_t *w[2], *s[2];
    int N, N0, K;
    struct Row {
        const uint8_t *w, *s;
    };
    __device__ __forceinline__ Row row(int e, size_t, size_t r, int) const {
        const int p = r >= (size_t)N0;
        const size_t pr = p ? N - N0 : N0, lr = r - (p ? N0 : 0);
        if (kInt4) return {w[p] + ((size_t)e * pr + lr) * (K / 2), s[p] + ((size_t)e * pr + lr) * (K / 32) * 2};
        const size_t kb = (K + 127) / 128;
        return {w[p] + ((size_t)e * pr + lr) * K, s[p] + ((size_t)e * ((pr + 127) / 128) + lr / 128) * kb * 4};
    }
    __device__ __forceinline__ void load(const Row &r, int k, float (&f)[8]) const {
        if (kInt4) {
            const uint32_t v = *(const uint32_t *)(r.w + k / 2); /* value k + j in bits 4j .. 4j + 3, plus 8 */
            const float sc = __uint_as_float((uint32_t)((const uint16_t *)r.s)[k / 32] << 16); /* bf16 */
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] = (float)((int)((v >> (4 * j)) & 15u) - 8) * sc;
        } else {
            const uint2 v = *(const uint2 *)(r.w + k);
            const float sc = ((const float *)r.s)[k / 128];
#pragma unroll
            for (int j = 0; j < 4; j++) f[j] = e4m3_to_f32(v.x >> (8 * j) & 255u) * sc, f[4 + j] = e4m3_to_f32(v.y >> (8 * j) & 255u) * sc;
        }
    }
};

/* The WQuant view of a quantized linear (D: kdt_dlin; a template, so that this file needs no include). */
template <bool kInt4, typename D> WQuant<kInt4> wquant(const D *d) {
    return {{(const uint8_t *)d->w[0], (const uint8_t *)d->w[1]}, {(const uint8_t *)d->scale[0], (const uint8_t *)d->scale[1]},
            d->N, d->N0, d->K};
}

/* The input rows as an RMSNorm of f32 rows, made while staging (the dense products whose input is a
 * norm's output alone: the attention's first projection, the dense MLP, the LM head), so that the
 * norm needs no launch of its own: row p is w * (x_r * rsqrt(mean(x_r^2) + eps)) rounded to T,
 * x_r = x[rows ? rows[p] : p] [n_in] f32, with the sum of squares in kernels.cu's rmsnorm order
 * (256 threads, lane-strided, two butterflies): the same bits as that kernel. x NULL: off. */
struct NormIn {
    const float *x, *w;
    const int32_t *rows;
    float eps;
};

/* inv[r] = 1 / sqrt(mean(x_r^2) + eps) for the nr rows of the pass from r0, each sum in kernels.cu's
 * rmsnorm order (thread t sums elements t, t + kThreads, ..., a butterfly per warp, then one over the
 * warps' sums), all rows in one round of barriers. part: [kRows][kWarps]. */
template <int kRows>
__device__ __forceinline__ void norm_inv(const NormIn &nin, int r0, int nr, int n_in, float (*part)[kWarps], float *inv) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float ss[kRows];
#pragma unroll
    for (int r = 0; r < kRows; r++) {
        ss[r] = 0.f;
        if (r < nr) {
            const float *xr = nin.x + (size_t)(nin.rows ? nin.rows[r0 + r] : r0 + r) * n_in;
            for (int j = threadIdx.x; j < n_in; j += kThreads) ss[r] = fmaf(xr[j], xr[j], ss[r]);
        }
        for (int o = 16; o > 0; o >>= 1) ss[r] += __shfl_xor_sync(0xffffffffu, ss[r], o);
    }
    __syncthreads(); /* part and inv are no longer read by the previous pass */
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < kRows; r++) part[r][warp] = ss[r];
    __syncthreads();
    if (warp != 0) return;
    for (int r = 0; r < nr; r++) {
        float v = lane < kWarps ? part[r][lane] : 0.f;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) inv[r] = 1.0f / sqrtf(v / (float)n_in + nin.eps);
    }
}

/* kGateUp: w [E, 2I, n_in] (gate rows, then up rows), input rows x[perm[p] / K] of x [*, n_in]
 * (row p without perm), out act [n, I] (T) = silu(gate) * up at each assignment's place p;
 * columns I, a warp computes gate and up of kW / 2 columns. Else: w [E, n_out, n_in], input rows
 * in[p] of [n, n_in], out [n, n_out] f32 (added to when accumulate); a warp computes kW columns.
 * counts NULL: one expert of dense_rows rows at offset 0. n_in % 8 == 0. w: WPlain<T>, or WQuant with
 * T bf16. Rows are cut in slices of kSliceRows, one per blockIdx.z (gridDim.z covers the most rows an
 * expert can have): the sums' order does not depend on the slicing. nin.x: the input rows are
 * NormIn's (dense products only, counts NULL). shared_off >= 0 (with counts): the grid's last
 * expert (blockIdx.y == gridDim.y - 1) is the MoE layer's shared one, over every row: its
 * dense_rows rows sit at places shared_off + r, input row r (gate/up), no perm. */
template <typename T, bool kGateUp, int kRows, typename WF>
__global__ void __launch_bounds__(kThreads, kRows == 1 ? 3 : kRows <= 4 ? 2 : 1) moe_small_kernel(const T *__restrict__ in, const int32_t *__restrict__ perm, int K,
                                                             const int32_t *__restrict__ counts, const int32_t *__restrict__ offs,
                                                             const WF w, int n_in, int n_out, void *out,
                                                             int dense_rows, bool accumulate, NormIn nin = NormIn{},
                                                             int shared_off = -1) {
    kdt_pdl_begin();
    constexpr int kChunk = kChunkBytes / (int)sizeof(T); /* elements of a staged row */
    constexpr int kColsPerWarp = kGateUp ? kW / 2 : kW;
    __shared__ __align__(16) T xs[kRows * kChunk];
    __shared__ float inv[kRows], part[kRows][kWarps];
    const int e = blockIdx.y, r_beg = (int)blockIdx.z * kSliceRows;
    const bool shared = shared_off >= 0 && e == (int)gridDim.y - 1;
    const int cnt = counts && !shared ? counts[e] : dense_rows;
    if (cnt <= r_beg) return;
    const int r_end = min(cnt, r_beg + kSliceRows);
    const int off = shared ? shared_off : counts ? offs[e] : 0, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int col0 = (blockIdx.x * kWarps + warp) * kColsPerWarp;
    const size_t rows_w = kGateUp ? 2 * (size_t)n_out : (size_t)n_out;
    typename WF::Row wr[kW];
    bool ok[kW];
#pragma unroll
    for (int q = 0; q < kW; q++) {
        const int c = col0 + (kGateUp ? q / 2 : q);
        ok[q] = c < n_out;
        const size_t row = kGateUp && (q & 1) ? (size_t)n_out + c : (size_t)c;
        wr[q] = w.row(e, rows_w, ok[q] ? row : 0, n_in);
    }
    for (int r0 = r_beg; r0 < r_end; r0 += kRows) {
        const int nr = min(kRows, r_end - r0);
        if (nin.x) norm_inv<kRows>(nin, r0, nr, n_in, part, inv);
        float acc[kW][kRows];
#pragma unroll
        for (int q = 0; q < kW; q++)
#pragma unroll
            for (int r = 0; r < kRows; r++) acc[q][r] = 0.f;
        for (int c0 = 0; c0 < n_in; c0 += kChunk) {
            const int len = min(kChunk, n_in - c0); /* a multiple of 8 */
            __syncthreads(); /* the previous chunk is read */
            for (int v = threadIdx.x; v < nr * (kChunk / 8); v += kThreads) { /* rows past nr are never read */
                const int r = v / (kChunk / 8), i = (v % (kChunk / 8)) * 8;
                if (i >= len) continue;
                const int p = off + r0 + r;
                const size_t src_row =
                    kGateUp && shared ? (size_t)(p - off) : kGateUp && perm ? (size_t)(perm[p] / K) : (size_t)p;
                if (nin.x) {
                    const float *xr = nin.x + (size_t)(nin.rows ? nin.rows[r0 + r] : r0 + r) * n_in + c0 + i;
#pragma unroll
                    for (int k = 0; k < 8; k++) xs[r * kChunk + i + k] = from_f32<T>(nin.w[c0 + i + k] * (xr[k] * inv[r]));
                } else {
                    store8(xs + r * kChunk + i, in + src_row * n_in + c0 + i);
                }
            }
            __syncthreads();
#pragma unroll 2
            for (int i = lane * 8; i < len; i += 32 * 8) {
                float wv[kW][8];
#pragma unroll
                for (int q = 0; q < kW; q++) w.load(wr[q], c0 + i, wv[q]);
#pragma unroll
                for (int r = 0; r < kRows; r++) {
                    if (r >= nr) break;
                    float xv[8];
                    load8(xs + r * kChunk + i, xv);
#pragma unroll
                    for (int q = 0; q < kW; q++)
#pragma unroll
                        for (int j = 0; j < 8; j++) acc[q][r] = fmaf(wv[q][j], xv[j], acc[q][r]);
                }
            }
        }
        /* The warp's sums, value v = r * kW + q: a butterfly over the lanes whose steps each halve
         * the values a lane keeps (the half its partner sends it, added to its own) while more than
         * 2 remain, then plain butterfly steps on the last 2. Every output gets the plain
         * butterfly's additions, so its bits, in a fifth of the shuffles at 16 rows; and each lane
         * then writes the 2 outputs it holds (indices base, base + 1: one column pair of a row). */
        constexpr int kV = kRows * kW;
        float val[kV];
#pragma unroll
        for (int r = 0; r < kRows; r++)
#pragma unroll
            for (int q = 0; q < kW; q++) val[r * kW + q] = acc[q][r];
        int base = 0, owner = 31; /* lanes (lane & owner) == 0 hold distinct values */
#pragma unroll
        for (int st = 0; st < 5; st++) {
            const int o = 16 >> st, n = kV >> st;
            if (n > 2) {
                const int h = n / 2;
                const bool up = (lane & o) != 0;
#pragma unroll
                for (int k = 0; k < h; k++) {
                    const float send = up ? val[k] : val[k + h], keep = up ? val[k + h] : val[k];
                    val[k] = keep + __shfl_xor_sync(0xffffffffu, send, o);
                }
                base += up ? h : 0;
                owner = o - 1;
            } else {
#pragma unroll
                for (int k = 0; k < 2; k++) val[k] += __shfl_xor_sync(0xffffffffu, val[k], o);
            }
        }
        const int r = base / kW, q = base % kW, c = col0 + (kGateUp ? q / 2 : q);
        if ((lane & owner) || r >= nr || c >= n_out) continue;
        const size_t p = (size_t)off + r0 + r;
        if (kGateUp) {
            ((T *)out)[p * n_out + c] = from_f32<T>(silu(val[0]) * val[1]);
        } else {
#pragma unroll
            for (int k = 0; k < 2; k++) {
                if (c + k >= n_out) break;
                float *o = (float *)out + p * n_out + c + k;
                *o = accumulate ? *o + val[k] : val[k];
            }
        }
    }
}

