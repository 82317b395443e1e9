/* Quantized-weight matrix products for decode and verify sizes (src/cuda/quant_gemm.h).
 *
 * A block of kWarps warps owns kRows output columns (rows of W) and splits K among its threads in
 * 16-byte chunks of W (16 e4m3 values, or 32 int4 values = one group, so one scale per chunk).
 * Each thread dequantizes its chunk in registers, 8 inputs at a time, and multiplies them by kMT
 * rows of x;
 * partial sums are reduced by warp shuffles and then across the block's warps in warp order, so
 * results do not depend on scheduling. Every weight byte is read from DRAM once per block; for
 * M > kMT the block re-reads its rows (kRows * K bytes, resident in L1/L2) per tile of x rows. */
#include <cuda_fp8.h>

#include "common/cuda/cuda_common.cuh"
#include "cuda/quant_gemm.h"

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 2;   /* output columns per block */
constexpr int kMT = 8;     /* x rows per pass */

/* The 8 values of a chunk's 8-input slice q, as floats times s: two e4m3 words (exact: e4m3
 * values are f16 values), or one int4 word (low nibble first, offset 8). */
template <bool kInt4>
__device__ __forceinline__ void slice8(const uint4 &v, int q, float s, float *out) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    if constexpr (kInt4) {
#pragma unroll
        for (int j = 0; j < 8; j++) out[j] = (float)((int)((w[q] >> (4 * j)) & 15u) - 8) * s;
    } else {
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[2 * q + i] >> (16 * j)), __NV_E4M3);
                const float2 f = __half22float2(__half2(h));
                out[4 * i + 2 * j] = f.x * s;
                out[4 * i + 2 * j + 1] = f.y * s;
            }
    }
}

__device__ __forceinline__ float bf16_bits(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

/* x [M, K] bf16, w [N, K] (fp8 bytes or int4 words) as uint4 chunks, y [M, N] f32. */
template <bool kInt4>
__global__ void __launch_bounds__(kThreads) qgemm_kernel(const __nv_bfloat16 *__restrict__ x, const uint4 *__restrict__ w,
                                                         const void *__restrict__ scale, float *__restrict__ y, int M, int N,
                                                         int K) {
    constexpr int kVals = kInt4 ? 32 : 16; /* inputs per chunk */
    __shared__ float red[kWarps][kRows][kMT];
    const int n0 = blockIdx.x * kRows, t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int chunks = K / kVals, sk = (K + KDT_QGEMM_FP8_BLOCK - 1) / KDT_QGEMM_FP8_BLOCK;
    for (int m0 = 0; m0 < M; m0 += kMT) {
        float acc[kRows][kMT] = {};
        /* The next chunk's weights and scales are loaded before this one is used: two in flight. */
        uint4 v[kRows], vn[kRows] = {};
        float s[kRows], sn[kRows] = {};
        auto load = [&](int c, uint4 *vv, float *ss) {
#pragma unroll
            for (int r = 0; r < kRows; r++) {
                const int n = min(n0 + r, N - 1); /* a missing last row repeats one; it is not written */
                vv[r] = __ldg(&w[(size_t)n * chunks + c]);
                if constexpr (kInt4) ss[r] = bf16_bits(__ldg((const uint16_t *)scale + (size_t)n * chunks + c));
                else ss[r] = __ldg((const float *)scale + (size_t)(n / KDT_QGEMM_FP8_BLOCK) * sk + c * kVals / KDT_QGEMM_FP8_BLOCK);
            }
        };
        if (t < chunks) load(t, v, s);
        for (int c = t; c < chunks; c += kThreads) {
            if (c + kThreads < chunks) load(c + kThreads, vn, sn);
#pragma unroll
            for (int q = 0; q < kVals / 8; q++) {
                float wf[kRows][8];
#pragma unroll
                for (int r = 0; r < kRows; r++) slice8<kInt4>(v[r], q, s[r], wf[r]);
#pragma unroll
                for (int mm = 0; mm < kMT; mm++) {
                    if (m0 + mm >= M) break;
                    const uint4 xv = __ldg((const uint4 *)(x + (size_t)(m0 + mm) * K + (size_t)c * kVals) + q);
                    const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const float lo = __uint_as_float(xw[i] << 16), hi = __uint_as_float(xw[i] & 0xFFFF0000u);
#pragma unroll
                        for (int r = 0; r < kRows; r++)
                            acc[r][mm] = fmaf(hi, wf[r][2 * i + 1], fmaf(lo, wf[r][2 * i], acc[r][mm]));
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < kRows; r++) {
                v[r] = vn[r];
                s[r] = sn[r];
            }
        }
#pragma unroll
        for (int r = 0; r < kRows; r++)
#pragma unroll
            for (int mm = 0; mm < kMT; mm++) {
                float v = acc[r][mm];
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
                if (lane == 0) red[warp][r][mm] = v;
            }
        __syncthreads();
        if (t < kRows * kMT) {
            const int r = t / kMT, mm = t % kMT;
            if (n0 + r < N && m0 + mm < M) {
                float v = 0;
#pragma unroll
                for (int i = 0; i < kWarps; i++) v += red[i][r][mm];
                y[(size_t)(m0 + mm) * N + n0 + r] = v;
            }
        }
        __syncthreads();
    }
}

/* One thread per 16-byte chunk of w: out [N, K] bf16. */
template <bool kInt4>
__global__ void dequant_kernel(const uint4 *__restrict__ w, const void *__restrict__ scale, __nv_bfloat16 *__restrict__ out,
                               int N, int K) {
    constexpr int kVals = kInt4 ? 32 : 16;
    const int chunks = K / kVals, sk = (K + KDT_QGEMM_FP8_BLOCK - 1) / KDT_QGEMM_FP8_BLOCK;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * chunks) return;
    const int n = (int)(i / chunks), c = (int)(i % chunks);
    float s, f[kVals];
    if constexpr (kInt4) s = bf16_bits(((const uint16_t *)scale)[i]);
    else s = ((const float *)scale)[(size_t)(n / KDT_QGEMM_FP8_BLOCK) * sk + c * kVals / KDT_QGEMM_FP8_BLOCK];
    const uint4 v = w[i];
#pragma unroll
    for (int q = 0; q < kVals / 8; q++) slice8<kInt4>(v, q, s, f + 8 * q); /* already scaled: value * s */
    __nv_bfloat162 *o = (__nv_bfloat162 *)(out + (size_t)n * K + (size_t)c * kVals);
#pragma unroll
    for (int j = 0; j < kVals / 2; j++) o[j] = __floats2bfloat162_rn(f[2 * j], f[2 * j + 1]);
}

kdt_status check(const char *what, const void *x, const void *w, int32_t M, int32_t N, int32_t K, int32_t k_mult) {
    if (M < 0 || N < 1 || K < 1 || K % k_mult)
        return kdt_fail(KDT_ERR_SHAPE, "%s: M %d, N %d, K %d: K must be a positive multiple of %d", what, M, N, K, k_mult);
    if (((uintptr_t)x | (uintptr_t)w) % 16)
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: x and w must be 16-byte aligned", what);
    return KDT_OK;
}

template <bool kInt4>
kdt_status launch(const void *x, const void *w, const void *scale, float *y, int32_t M, int32_t N, int32_t K, void *stream,
                  const char *what) {
    kdt_status s = check(what, x, w, M, N, K, kInt4 ? 32 : 16);
    if (s != KDT_OK || M == 0) return s;
    qgemm_kernel<kInt4><<<(N + kRows - 1) / kRows, kThreads, 0, (cudaStream_t)stream>>>(
        (const __nv_bfloat16 *)x, (const uint4 *)w, scale, y, M, N, K);
    KDT_CUDA_CHECK_LAUNCH(what);
    return KDT_OK;
}

template <bool kInt4>
kdt_status launch_dequant(const void *w, const void *scale, void *out, int32_t N, int32_t K, void *stream, const char *what) {
    kdt_status s = check(what, out, w, 0, N, K, kInt4 ? 32 : 16);
    if (s != KDT_OK) return s;
    const size_t n = (size_t)N * (K / (kInt4 ? 32 : 16));
    dequant_kernel<kInt4><<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>((const uint4 *)w, scale,
                                                                                        (__nv_bfloat16 *)out, N, K);
    KDT_CUDA_CHECK_LAUNCH(what);
    return KDT_OK;
}

} // namespace

extern "C" kdt_status kdt_qgemm_fp8(const void *x, const void *w, const float *scale, float *y, int32_t M, int32_t N, int32_t K,
                                    void *stream) {
    return launch<false>(x, w, scale, y, M, N, K, stream, "qgemm_fp8");
}

extern "C" kdt_status kdt_qgemm_int4(const void *x, const void *w, const void *scale, float *y, int32_t M, int32_t N, int32_t K,
                                     void *stream) {
    return launch<true>(x, w, scale, y, M, N, K, stream, "qgemm_int4");
}

extern "C" kdt_status kdt_dequant_fp8_bf16(const void *w, const float *scale, void *out, int32_t N, int32_t K, void *stream) {
    return launch_dequant<false>(w, scale, out, N, K, stream, "dequant_fp8_bf16");
}

extern "C" kdt_status kdt_dequant_int4_bf16(const void *w, const void *scale, void *out, int32_t N, int32_t K, void *stream) {
    return launch_dequant<true>(w, scale, out, N, K, stream, "dequant_int4_bf16");
}
