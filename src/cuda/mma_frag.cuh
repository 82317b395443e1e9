/* Tensor-core fragments and the K-split reduction shared by the weight-streaming GEMMs
 * (quant_gemm.cu, stream_gemm.cu): mma.sync m16n8k16 bf16 with the weights as the 16-row A operand
 * and up to 8 rows of x as the B operand, int4 nibbles to bf16, and the cluster's rank-ordered sum of
 * partial tiles (deterministic: no atomics) with its launch. */
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include <utility>

namespace kdt_frag {

__device__ __forceinline__ float bf16_bits(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

/* Nibbles i and i + 4 of w minus 8 as a bf16x2 word: 0x4300 | n is the bf16 128 + n (n in the
 * mantissa's low bits), so one shift, one lop3 and one bf16x2 subtraction of 136 give n - 8. */
__device__ __forceinline__ uint32_t nib2_bf16x2(uint32_t w, int i) {
    const uint32_t p = ((w >> (4 * i)) & 0x000F000Fu) | 0x43004300u;
    const __nv_bfloat162 r = __hsub2(*(const __nv_bfloat162 *)&p, __float2bfloat162_rn(136.f));
    return *(const uint32_t *)&r;
}

/* c [16 rows, 8 cols] f32 += a [16, 16] bf16 x b [16, 8] bf16 (PTX fragment layouts). */
__device__ __forceinline__ void mma(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* acc += one scale group's mma results part, C fragments of kMT tiles: c0, c1 (the fragment's row g)
 * times sa, c2, c3 (row g + 8) times sb. */
template <int kMT>
__device__ __forceinline__ void acc_scaled(float (&acc)[kMT][4], const float (&part)[kMT][4], float sa, float sb) {
#pragma unroll
    for (int i = 0; i < kMT; i++) {
        acc[i][0] = fmaf(sa, part[i][0], acc[i][0]);
        acc[i][1] = fmaf(sa, part[i][1], acc[i][1]);
        acc[i][2] = fmaf(sb, part[i][2], acc[i][2]);
        acc[i][3] = fmaf(sb, part[i][3], acc[i][3]);
    }
}

/* The 4 words of a quad's 16-byte loads, transposed: lane t gets word t of each lane's load. */
__device__ __forceinline__ void quad_transpose(uint4 &v, int t) {
    uint32_t a[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int m = 1; m <= 2; m <<= 1)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (j & m) continue;
            const bool hi = t & m;
            const uint32_t r = __shfl_xor_sync(0xffffffffu, hi ? a[j] : a[j | m], m);
            if (hi) a[j] = r;
            else a[j | m] = r;
        }
    v = make_uint4(a[0], a[1], a[2], a[3]);
}

/* 16 bytes (or 0: zero-fill) from global to shared, L2 only (.cg) or through L1 (.ca, for x, which
 * the blocks of an SM share). */
template <bool kL1>
__device__ __forceinline__ void cp16(void *dst, const void *src, bool in) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    if (kL1) asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(in ? 16 : 0) : "memory");
    else asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(in ? 16 : 0) : "memory");
}

/* The block's partial tile into red [m][row] (row pitch 16 kTR kW + 4: the pad spreads a quad's m over
 * banks; warp w's row tile r is rows 16 (kTR w + r) ..), then after a cluster barrier rank r (block y)
 * sums its share of the tile over the cluster's ranks in order and writes (or adds to) y [M, N].
 * acc [kTR][kMT][4]: the C fragments, c0, c1 row g and x rows 2t, 2t + 1, c2, c3 row g + 8. */
template <int kTR, int kMT, int kW>
__device__ __forceinline__ void tile_stash(float *red, const float (&acc)[kTR][kMT][4]) {
    constexpr int kPitch = 16 * kTR * kW + 4;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int r = 0; r < kTR; r++) {
        const int row = ((threadIdx.x >> 5) * kTR + r) * 16 + g;
#pragma unroll
        for (int i = 0; i < kMT; i++) {
            red[(8 * i + 2 * t) * kPitch + row] = acc[r][i][0];
            red[(8 * i + 2 * t + 1) * kPitch + row] = acc[r][i][1];
            red[(8 * i + 2 * t) * kPitch + row + 8] = acc[r][i][2];
            red[(8 * i + 2 * t + 1) * kPitch + row + 8] = acc[r][i][3];
        }
    }
}
template <int kTR, int kMT, int kW>
__device__ __forceinline__ void tile_reduce(float *red, const float (&acc)[kTR][kMT][4], float *__restrict__ y, int M, int N, int m0,
                                            int n0, bool accumulate) {
    constexpr int kRows = 16 * kTR * kW, kPitch = kRows + 4;
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    tile_stash<kTR, kMT, kW>(red, acc);
    cluster.sync();
    const int S = gridDim.y, rank = blockIdx.y;
    const int mrows = min(M - m0, kMT * 8), total = mrows * kRows;
    const int e0 = rank * total / S, e1 = (rank + 1) * total / S;
    for (int e = e0 + threadIdx.x; e < e1; e += 32 * kW) {
        const int m = e / kRows, c = e % kRows;
        float v = 0;
        for (int q = 0; q < S; q++) v += cluster.map_shared_rank(red, q)[m * kPitch + c];
        if (n0 + c < N) {
            float *o = y + (size_t)(m0 + m) * N + n0 + c;
            *o = accumulate ? *o + v : v;
        }
    }
    cluster.sync(); /* no block leaves while another reads its partials */
}

/* Launches kern over grid in clusters of (1, S, 1), the K split that tile_reduce sums. */
template <class... KArgs, class... Args>
cudaError_t launch_k_split(void (*kern)(KArgs...), dim3 grid, int threads, size_t smem, int S, cudaStream_t st, Args &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 1;
    attr.val.clusterDim.y = S;
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kern, std::forward<Args>(args)...);
}

} // namespace kdt_frag
