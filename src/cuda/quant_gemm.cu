/* Quantized-weight matrix products for decode and verify sizes (src/cuda/quant_gemm.h).
 *
 * Decode GEMM: each weight tile is read from DRAM and dequantized once for all (up to 32) rows of
 * x, on the tensor cores (mma.sync m16n8k16 bf16, f32 accumulation). A warp owns 16 rows of W (the
 * mma's A operand) and a block's warps one slice of K; x rows are the B operand, 8 per mma. K runs
 * in steps of 128: per step and lane, 16-byte cp.async copies of its own 32 fp8 values (or 32 int4
 * values) of rows g and g + 8. Inside an mma the order of k is free as long as A and B agree, so
 * lane t's k16 slices are its own contiguous bytes, and x is read at the same k. Scales stay out of
 * the bf16 operands (so the products are exact): an FP8 block scale multiplies the f32 partial of
 * its 128-k step, an INT4 group scale the partial of its 2 mmas (the quad transposes its 16-byte
 * loads so that one mma's k are all in one group). When N has few tiles, a cluster of up to 8
 * blocks splits K and sums the partials through distributed shared memory in rank order:
 * deterministic. Two kernels share those pieces (fp8_step, int4_step, mma_frag.cuh's tile_reduce):
 * - qgemm_ring_kernel (M <= 32, docs/perf/quant.md): 4 or 8 warps a block stream the weights, the
 *   step's x chunk and its scales through one ring in shared memory, 3 to 8 steps ahead, one
 *   barrier a step: no global load between a step's wait and its mmas.
 * - qgemm_kernel (the baseline; M > 32, INT4 scales not 4-byte aligned): each lane's weights
 *   through its own ring, x and the scales read from global memory inside the step.
 *
 * Dequantize kernels (prefill path): one thread per 16-byte chunk of W, 16-byte stores. */
#include <cuda_fp8.h>

#include "common/cuda/cuda_common.cuh"
#include "cuda/mma_frag.cuh"
#include "cuda/quant_gemm.h"
#include "cuda/quant_gemm_variant.h"
#include "cuda/quant_mma.cuh"

namespace {

using namespace kdt_frag;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTileN = 16 * kWarps; /* rows of W per block */
constexpr int kStep = 128;          /* k per step: one FP8 scale block, four INT4 groups */
constexpr int kMaxM = 32;           /* x rows per block (4 mma column tiles) */
/* A tile's rows share one FP8 block row of scales; a step is one FP8 block column. */
static_assert(KDT_QGEMM_FP8_BLOCK % kTileN == 0 && kStep == KDT_QGEMM_FP8_BLOCK, "tile and step vs the FP8 block");

__device__ __forceinline__ void cp4(void *dst, const void *src, int bytes) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src), "r"(bytes) : "memory");
}

/* Baseline decode kernel (bench_quant_gemm's "old" column; the path past 32 rows): x and the
 * scales are read from global memory inside each step, the weights through a per-lane ring.
 * x [M, K] bf16, w [N, K] (e4m3 bytes or int4 words), scale (see quant_gemm.h), y [M, N] f32.
 * Grid (ceil(N / 64), S, ceil(M / 32)), clusters of (1, S, 1): block y = rank = K slice. kMT
 * column tiles of 8 x rows (rows past M are read clamped and never written). */
template <bool kInt4, int kMT>
__global__ void __launch_bounds__(kThreads, 4) qgemm_kernel(const __nv_bfloat16 *__restrict__ x, const uint8_t *__restrict__ w,
                                                         const void *__restrict__ scale, float *__restrict__ y, int M, int N,
                                                         int K) {
    constexpr int kLd = kInt4 ? 1 : 2;          /* 16-byte loads per row and step */
    constexpr int kRowBytes = kInt4 ? 64 : 128; /* bytes of one row in one step */
    constexpr int kStages = kInt4 ? 8 : 4;      /* 1 KB or 2 KB steps a warp: 7 or 3 in flight while 1 computes */
    __shared__ float red[kMaxM * (kTileN + 4)];
    __shared__ uint4 stage[kWarps][kStages][2 * kLd][32]; /* each lane's own loads, kStages - 1 steps ahead */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * kTileN, m0 = blockIdx.z * kMaxM, S = gridDim.y, rank = blockIdx.y;
    const int steps = (K + kStep - 1) / kStep, s0 = rank * steps / S, s1 = (rank + 1) * steps / S;
    const size_t ldw = kInt4 ? (size_t)K / 2 : (size_t)K; /* bytes per row of W */
    const int r0 = min(n0 + warp * 16 + g, N - 1), r1 = min(n0 + warp * 16 + g + 8, N - 1);
    const uint8_t *wr[2] = {w + r0 * ldw, w + r1 * ldw};
    const __nv_bfloat16 *xr[kMT];
#pragma unroll
    for (int i = 0; i < kMT; i++) xr[i] = x + (size_t)min(m0 + 8 * i + g, M - 1) * K;

    float acc[kMT][4] = {};
    /* Lane t's bytes of step s: [32t, 32t + 32) for fp8, [16t, 16t + 16) (group t) for int4, copied
     * into the lane's own slots of stage s % kStages (so only the lane's wait orders them); past K
     * (a partial last step) or past the slice they are zero-filled, and x there is zero too. */
    auto issue = [&](int s) {
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int l = 0; l < kLd; l++) {
                const int off = s * kRowBytes + (kInt4 ? 16 * t : 32 * t + 16 * l);
                const bool in = s < s1 && off < (int)ldw;
                cp16<false>(&stage[warp][(s - s0) % kStages][r * kLd + l][lane], in ? wr[r] + off : wr[r], in);
            }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
#pragma unroll
    for (int i = 0; i < kStages - 1; i++) issue(s0 + i);
    for (int s = s0; s < s1; s++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 2) : "memory"); /* step s has landed */
        uint4 v[2][kLd];
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int l = 0; l < kLd; l++) v[r][l] = stage[warp][(s - s0) % kStages][r * kLd + l][lane];
        issue(s + kStages - 1); /* into the stage read one step ago, already in registers */
        const int kb = s * kStep;
        if constexpr (kInt4) {
            const int ng = K / 32;
            int4_step<kMT>(acc, v[0][0], v[1][0], t, ng - kb / 32,
                           [&](int i, int G) { return __ldg((const uint4 *)(xr[i] + kb + 32 * G + 8 * t)); },
                           [&](int G, int h) {
                               return bf16_bits(__ldg((const uint16_t *)scale + (size_t)(h ? r1 : r0) * ng + kb / 32 + G));
                           });
        } else {
            const uint32_t q0[8] = {v[0][0].x, v[0][0].y, v[0][0].z, v[0][0].w, v[0][1].x, v[0][1].y, v[0][1].z, v[0][1].w};
            const uint32_t q1[8] = {v[1][0].x, v[1][0].y, v[1][0].z, v[1][0].w, v[1][1].x, v[1][1].y, v[1][1].z, v[1][1].w};
            const float sc = __ldg((const float *)scale + (size_t)(n0 / KDT_QGEMM_FP8_BLOCK) * steps + kb / KDT_QGEMM_FP8_BLOCK);
            const bool in1 = kb + 32 * t + 16 < K; /* K % 16 == 0: each 8-k half of x is all in or out */
            fp8_step<kMT>(acc, q0, q1, sc, [&](int i, int u) {
                return (u < 2 ? kb + 32 * t < K : in1) ? __ldg((const uint4 *)(xr[i] + kb + 32 * t) + u) : make_uint4(0, 0, 0, 0);
            });
        }
    }
    asm volatile("cp.async.wait_all;" ::: "memory"); /* the zero-filled copies past the slice, before the block ends */
    tile_reduce<1, kMT, kWarps>(red, reinterpret_cast<const float(&)[1][kMT][4]>(acc), y, M, N, m0, n0, false);
}

/* One step of the streaming kernel's ring (kW warps, 16 kW rows): everything a step computes on is
 * copied ahead, so no global load sits between a step's wait and its mmas. */
template <bool kInt4, int kMT, int kW>
struct RingStage {
    uint4 w[kW][kInt4 ? 2 : 4][32]; /* each lane's own weight bytes, [row r * loads + load l] */
    uint4 x[kMT][4][32];            /* [tile i][chunk u][lane]: x row 8i + g at k_u (below) .. + 7 */
    uint32_t s[kInt4 ? 48 * kW : 4]; /* int4: each tile row's 4 group scales inside 3 aligned words; fp8: the block scale */
};
/* About 14 KB of ring a warp (4 warps a block: 4 blocks an SM): 3 to 8 steps. */
template <bool kInt4, int kMT, int kW>
__host__ __device__ constexpr int ring_stages() {
    return 14336 * kW / (int)sizeof(RingStage<kInt4, kMT, kW>) < 3   ? 3
         : 14336 * kW / (int)sizeof(RingStage<kInt4, kMT, kW>) > 8 ? 8
                                                                     : 14336 * kW / (int)sizeof(RingStage<kInt4, kMT, kW>);
}
template <bool kInt4, int kMT, int kW>
__host__ __device__ constexpr size_t ring_bytes() { return ring_stages<kInt4, kMT, kW>() * sizeof(RingStage<kInt4, kMT, kW>); }

/* Streaming decode kernel (the path for M <= 32): the tiles, fragments and arithmetic of qgemm_kernel
 * with kW warps a block (16 kW rows: 8 halves the x bytes a weight byte costs at M = 32), but the
 * warps share one ring in dynamic shared memory that holds, kStages - 1 steps ahead, the weights
 * (each lane its own bytes), the step's x (through L1: the SM's blocks share x) and its scales; one
 * barrier per step makes the step visible to all and frees the slot read the step before.
 * Every copy instruction of a warp reads whole 32-byte sectors: an FP8 lane's 32 bytes of a row are
 * bytes 16t .. and 64 + 16t .. of the step (so its byte b is k kb + 64 (b / 16) + 16t + b % 16, and
 * x chunk u, bytes 8u .. 8u + 7, is k_u = kb + 64 (u / 2) + 16t + 8 (u % 2)); INT4 lane t holds group
 * t as in qgemm_kernel (k_u = kb + 32u + 8t). Thread (warp w, lane 4g + q) copies x piece p = 4w + q
 * (k kb + 8p .. + 7) of row g, 64 contiguous bytes a row per instruction, into the reader's slot. */
template <bool kInt4, int kMT, int kW>
__global__ void __launch_bounds__(32 * kW) qgemm_ring_kernel(const __nv_bfloat16 *__restrict__ x, const uint8_t *__restrict__ w,
                                                            const void *__restrict__ scale, float *__restrict__ y, int M, int N,
                                                            int K) {
    using Stage = RingStage<kInt4, kMT, kW>;
    constexpr int kStages = ring_stages<kInt4, kMT, kW>(), kRows = 16 * kW;
    constexpr int kLd = kInt4 ? 1 : 2, kRowBytes = kInt4 ? 64 : 128;
    static_assert(KDT_QGEMM_FP8_BLOCK % kRows == 0 && sizeof(float) * kMaxM * (kRows + 4) <= ring_bytes<kInt4, kMT, kW>(),
                  "a tile in one FP8 block row; the partial tile fits in the ring");
    extern __shared__ uint4 smem[];
    Stage *ring = reinterpret_cast<Stage *>(smem);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * kRows, m0 = blockIdx.z * kMaxM, S = gridDim.y, rank = blockIdx.y;
    const int steps = (K + kStep - 1) / kStep, s0 = rank * steps / S, s1 = (rank + 1) * steps / S;
    const size_t ldw = kInt4 ? (size_t)K / 2 : (size_t)K;
    const int ng = K / 32; /* int4 groups per row */
    const int r0 = min(n0 + warp * 16 + g, N - 1), r1 = min(n0 + warp * 16 + g + 8, N - 1);
    const uint8_t *wr[2] = {w + r0 * ldw, w + r1 * ldw};
    const uint32_t *sw = (const uint32_t *)scale; /* int4: 4-byte aligned (the launcher checks) */

    /* Past K or past the slice the copies zero-fill (x too, so the products there are 0). */
    auto issue = [&](int s) {
        Stage &st = ring[(s - s0) % kStages];
        const bool live = s < s1;
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int l = 0; l < kLd; l++) {
                const int off = s * kRowBytes + 16 * t + 64 * l;
                const bool in = live && off < (int)ldw;
                cp16<false>(&st.w[warp][r * kLd + l][lane], in ? wr[r] + off : wr[r], in);
            }
        for (int c = warp; c < 4 * kMT; c += kW) { /* pieces 4 (c % 4) .. + 3 of tile i = c / 4 */
            const int p = 4 * (c % 4) + t, i = c / 4, k = s * kStep + 8 * p;
            const int u = kInt4 ? p / 4 : 2 * (p / 8) + p % 2, tr = kInt4 ? p % 4 : p % 8 / 2; /* the reader's chunk, lane */
            const bool in = live && k < K;
            const __nv_bfloat16 *xr = x + (size_t)min(m0 + 8 * i + g, M - 1) * K;
            cp16<true>(&st.x[i][u][4 * g + tr], in ? xr + k : xr, in);
        }
        if constexpr (kInt4) {
            /* Row lr's groups 4s .. 4s + 3 are bf16 e .. e + 3 (e = row * ng + 4s): words e / 2 .. + 2. */
            for (int j = threadIdx.x; j < 3 * kRows; j += 32 * kW) {
                const long long wi = ((long long)min(n0 + j / 3, N - 1) * ng + 4 * s) / 2 + j % 3;
                const int bytes = live ? (int)min(4ll, max(0ll, 2 * ((long long)N * ng - 2 * wi))) : 0;
                cp4(&st.s[j], bytes ? sw + wi : sw, bytes);
            }
        } else if (threadIdx.x == 0) {
            const float *sc = (const float *)scale + (size_t)(n0 / KDT_QGEMM_FP8_BLOCK) * steps + s;
            cp4(&st.s[0], live ? sc : (const float *)scale, live ? 4 : 0);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };

    float acc[kMT][4] = {};
#pragma unroll
    for (int i = 0; i < kStages - 1; i++) issue(s0 + i);
    for (int s = s0; s < s1; s++) {
        asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 2) : "memory"); /* this thread's copies of step s */
        __syncthreads();         /* everyone's copies of step s; everyone done with step s - 1 */
        issue(s + kStages - 1); /* into step s - 1's slot */
        const Stage &st = ring[(s - s0) % kStages];
        const int kb = s * kStep;
        if constexpr (kInt4) {
            const uint16_t *s16 = (const uint16_t *)st.s;
            const int lr = warp * 16 + g, p0 = (int)(((long long)r0 * ng) & 1), p1 = (int)(((long long)r1 * ng) & 1);
            int4_step<kMT>(acc, st.w[warp][0][lane], st.w[warp][1][lane], t, ng - kb / 32,
                           [&](int i, int G) { return st.x[i][G][lane]; },
                           [&](int G, int h) { return bf16_bits(h ? s16[6 * (lr + 8) + p1 + G] : s16[6 * lr + p0 + G]); });
        } else {
            const uint4 a = st.w[warp][0][lane], b = st.w[warp][1][lane], c = st.w[warp][2][lane], d = st.w[warp][3][lane];
            const uint32_t q0[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            const uint32_t q1[8] = {c.x, c.y, c.z, c.w, d.x, d.y, d.z, d.w};
            fp8_step<kMT>(acc, q0, q1, __uint_as_float(st.s[0]), [&](int i, int u) { return st.x[i][u][lane]; });
        }
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads(); /* the ring becomes the partial tile */
    tile_reduce<1, kMT, kW>(reinterpret_cast<float *>(smem), reinterpret_cast<const float(&)[1][kMT][4]>(acc), y, M, N, m0, n0, false);
}

/* One thread per 16-byte chunk of w (16 e4m3 values, or 32 int4 values = one group): out [N, K]
 * bf16 = value * scale rounded once, written as 16-byte vectors. */
template <bool kInt4>
__global__ void dequant_kernel(const uint4 *__restrict__ w, const void *__restrict__ scale, uint4 *__restrict__ out, int N,
                               int K) {
    constexpr int kVals = kInt4 ? 32 : 16;
    const unsigned chunks = (unsigned)(K / kVals), i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (unsigned)N * chunks) return;
    const unsigned n = i / chunks, c = i - n * chunks;
    const uint4 v = __ldg(&w[i]);
    const uint32_t q[4] = {v.x, v.y, v.z, v.w};
    float s;
    if constexpr (kInt4) s = bf16_bits(__ldg((const uint16_t *)scale + i));
    else s = __ldg((const float *)scale + (size_t)(n / KDT_QGEMM_FP8_BLOCK) * ((K + KDT_QGEMM_FP8_BLOCK - 1) / KDT_QGEMM_FP8_BLOCK) +
                   c * kVals / KDT_QGEMM_FP8_BLOCK);
    uint32_t o[kVals / 2]; /* bf16 pairs */
#pragma unroll
    for (int j = 0; j < kVals / 2; j++) {
        float a, b;
        if constexpr (kInt4) {
            a = (float)((int)((q[j / 4] >> (8 * (j % 4))) & 15u) - 8);
            b = (float)((int)((q[j / 4] >> (8 * (j % 4) + 4)) & 15u) - 8);
        } else {
            const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(q[j / 2] >> (16 * (j % 2))), __NV_E4M3)));
            a = f.x;
            b = f.y;
        }
        const __nv_bfloat162 r = __floats2bfloat162_rn(a * s, b * s);
        o[j] = *(const uint32_t *)&r;
    }
    uint4 *dst = out + (size_t)i * (kVals / 8);
#pragma unroll
    for (int j = 0; j < kVals / 8; j++) dst[j] = make_uint4(o[4 * j], o[4 * j + 1], o[4 * j + 2], o[4 * j + 3]);
}

kdt_status check(const char *what, const void *x, const void *w, int32_t M, int32_t N, int32_t K, int32_t k_mult) {
    if (M < 0 || N < 1 || K < 1 || K % k_mult)
        return kdt_fail(KDT_ERR_SHAPE, "%s: M %d, N %d, K %d: K must be a positive multiple of %d", what, M, N, K, k_mult);
    if (((uintptr_t)x | (uintptr_t)w) % 16)
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: x and w must be 16-byte aligned", what);
    return KDT_OK;
}

using QgemmKernel = void (*)(const __nv_bfloat16 *, const uint8_t *, const void *, float *, int, int, int);

/* Grid (tiles of 16 x warps rows, S, ceil(M / 32)) in clusters of (1, S, 1). S: as many blocks as
 * fit at once (one wave: a second, partial wave would stream its tail with few bytes in flight), at
 * most 8 (the portable cluster) and one step of K each. `resident` caches blocks an SM times SMs. */
kdt_status launch_clustered(QgemmKernel kern, int warps, size_t smem, int &resident, const void *x, const void *w, const void *scale,
                            float *y, int32_t M, int32_t N, int32_t K, cudaStream_t st, const char *what) {
    if (!resident) {
        int dev = 0, sms = 0, per_sm = 0;
        KDT_CUDA_CHECK(cudaGetDevice(&dev));
        KDT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        if (smem) KDT_CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        KDT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, 32 * warps, smem));
        resident = sms * (per_sm > 0 ? per_sm : 1);
    }
    const int tiles = (N + 16 * warps - 1) / (16 * warps), steps = (K + kStep - 1) / kStep;
    const int S = max(1, min(min(8, steps), resident / tiles));
    const dim3 grid(tiles, S, (M + kMaxM - 1) / kMaxM);
    const cudaError_t e = launch_k_split(kern, grid, 32 * warps, smem, S, st, (const __nv_bfloat16 *)x, (const uint8_t *)w, scale, y,
                                         (int)M, (int)N, (int)K);
    if (e != cudaSuccess)
        return kdt_fail(KDT_ERR_CUDA, "%s: launch of %d x %d x %d blocks in clusters of %d: %s", what, tiles, S, grid.z, S,
                        cudaGetErrorString(e));
    KDT_CUDA_CHECK_LAUNCH(what);
    return KDT_OK;
}

template <bool kInt4, int kMT>
kdt_status launch_mt(bool stream_kernel, const void *x, const void *w, const void *scale, float *y, int32_t M, int32_t N, int32_t K,
                     cudaStream_t st, const char *what) {
    static int resident[3], optin = -1; /* optin: shared memory a block may have (the 8-warp rings need ~110 KB) */
    if (optin < 0) {
        int dev = 0;
        KDT_CUDA_CHECK(cudaGetDevice(&dev));
        KDT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    }
    /* 8 warps where x is 17 .. 32 rows and N has 16 or more such tiles: half the x bytes per weight byte */
    if constexpr (kMT >= 3)
        if (stream_kernel && N >= 2048 && ring_bytes<kInt4, kMT, 8>() <= (size_t)optin)
            return launch_clustered(qgemm_ring_kernel<kInt4, kMT, 8>, 8, ring_bytes<kInt4, kMT, 8>(), resident[2], x, w, scale, y, M,
                                    N, K, st, what);
    if (stream_kernel)
        return launch_clustered(qgemm_ring_kernel<kInt4, kMT, 4>, 4, ring_bytes<kInt4, kMT, 4>(), resident[0], x, w, scale, y, M, N,
                                K, st, what);
    return launch_clustered(qgemm_kernel<kInt4, kMT>, kWarps, 0, resident[1], x, w, scale, y, M, N, K, st, what);
}

/* The streaming kernel for M <= 32 (AUTO) or any M (STREAM), where its 4-byte copies of INT4
 * scales are aligned; qgemm_kernel otherwise. */
template <bool kInt4>
kdt_status launch(kdt_qgemm_kernel kernel, const void *x, const void *w, const void *scale, float *y, int32_t M, int32_t N,
                  int32_t K, void *stream, const char *what) {
    kdt_status s = check(what, x, w, M, N, K, kInt4 ? 32 : 16);
    if (s != KDT_OK || M == 0) return s;
    const cudaStream_t st = (cudaStream_t)stream;
    const bool ring = kernel != KDT_QGEMM_BASELINE && (kernel == KDT_QGEMM_STREAM || M <= kMaxM) &&
                      (!kInt4 || (uintptr_t)scale % 4 == 0);
    switch ((M < kMaxM ? M + 7 : kMaxM) / 8) { /* x tiles of 8 rows; past 32 rows, one block row per 32 */
    case 1: return launch_mt<kInt4, 1>(ring, x, w, scale, y, M, N, K, st, what);
    case 2: return launch_mt<kInt4, 2>(ring, x, w, scale, y, M, N, K, st, what);
    case 3: return launch_mt<kInt4, 3>(ring, x, w, scale, y, M, N, K, st, what);
    default: return launch_mt<kInt4, 4>(ring, x, w, scale, y, M, N, K, st, what);
    }
}

template <bool kInt4>
kdt_status launch_dequant(const void *w, const void *scale, void *out, int32_t N, int32_t K, void *stream, const char *what) {
    kdt_status s = check(what, out, w, 0, N, K, kInt4 ? 32 : 16);
    if (s != KDT_OK) return s;
    const size_t n = (size_t)N * (K / (kInt4 ? 32 : 16));
    if (n >= (1ull << 32))
        return kdt_fail(KDT_ERR_SHAPE, "%s: N %d, K %d: more than 2^32 chunks of 16 bytes", what, N, K);
    dequant_kernel<kInt4><<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>((const uint4 *)w, scale, (uint4 *)out,
                                                                                        N, K);
    KDT_CUDA_CHECK_LAUNCH(what);
    return KDT_OK;
}

} // namespace

extern "C" kdt_status kdt_qgemm_fp8(const void *x, const void *w, const float *scale, float *y, int32_t M, int32_t N, int32_t K,
                                    void *stream) {
    return launch<false>(KDT_QGEMM_AUTO, x, w, scale, y, M, N, K, stream, "qgemm_fp8");
}

extern "C" kdt_status kdt_qgemm_int4(const void *x, const void *w, const void *scale, float *y, int32_t M, int32_t N, int32_t K,
                                     void *stream) {
    return launch<true>(KDT_QGEMM_AUTO, x, w, scale, y, M, N, K, stream, "qgemm_int4");
}

extern "C" kdt_status kdt_dequant_fp8_bf16(const void *w, const float *scale, void *out, int32_t N, int32_t K, void *stream) {
    return launch_dequant<false>(w, scale, out, N, K, stream, "dequant_fp8_bf16");
}

extern "C" kdt_status kdt_dequant_int4_bf16(const void *w, const void *scale, void *out, int32_t N, int32_t K, void *stream) {
    return launch_dequant<true>(w, scale, out, N, K, stream, "dequant_int4_bf16");
}

extern "C" kdt_status kdt_qgemm_with(kdt_qgemm_kernel kernel, int int4, const void *x, const void *w, const void *scale, float *y,
                                     int32_t M, int32_t N, int32_t K, void *stream) {
    return int4 ? launch<true>(kernel, x, w, scale, y, M, N, K, stream, "qgemm_int4")
                : launch<false>(kernel, x, w, scale, y, M, N, K, stream, "qgemm_fp8");
}
