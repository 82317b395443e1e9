/* The argmax of logits rows (pick.cuh): one block per row. */
#include <climits>
#include <cstdint>

#include "common/cuda/cuda_common.cuh"
#include "model/cuda/pick.cuh"

namespace {

/* A decode step's one row of 8192 logits is two 16-byte loads a thread with 1024 threads: one
 * round trip instead of the 32 dependent ones of 256 threads. */
constexpr int kThreads = 1024;

/* Block (a, i) of Ba * Q: pred[a * Q + i] as kdt_mk_argmax says. kVec: rows read as float4
 * (V % 4 == 0, x 16-byte aligned). */
template <bool kVec>
__global__ void __launch_bounds__(kThreads) argmax_kernel(const float *__restrict__ x, int32_t V, int32_t Q,
                                                          const int32_t *__restrict__ rows, int32_t Ba, int32_t *__restrict__ pred) {
    const int a = blockIdx.x / Q, i = blockIdx.x % Q;
    const int n = rows ? rows[Ba + a] : Q;
    if (i >= n) {
        if (threadIdx.x == 0) pred[blockIdx.x] = -1;
        return;
    }
    const float *row = x + ((int64_t)(rows ? rows[a] : a * Q) + i) * V;
    kdt_best b = {NAN, INT_MAX};
    if (kVec) {
        for (int j = threadIdx.x; j < V / 4; j += kThreads) {
            const float4 v = ((const float4 *)row)[j];
            const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int k = 0; k < 4; k++)
                if (kdt_argmax_before(e[k], 4 * j + k, b.v, b.i)) b = {e[k], 4 * j + k};
        }
    } else {
        for (int j = threadIdx.x; j < V; j += kThreads)
            if (kdt_argmax_before(row[j], j, b.v, b.i)) b = {row[j], j};
    }
    b = kdt_block_best<kThreads>(b, kdt_argmax_before);
    if (threadIdx.x == 0) pred[blockIdx.x] = b.i < V ? b.i : 0;
}

} // namespace

kdt_status kdt_mk_argmax(const float *x, int32_t V, int32_t Ba, int32_t Q, const int32_t *rows, int32_t *pred, cudaStream_t s) {
    if (Ba <= 0) return KDT_OK;
    const unsigned g = (unsigned)(Ba * Q);
    if (V % 4 == 0 && (uintptr_t)x % 16 == 0)
        argmax_kernel<true><<<g, kThreads, 0, s>>>(x, V, Q, rows, Ba, pred);
    else
        argmax_kernel<false><<<g, kThreads, 0, s>>>(x, V, Q, rows, Ba, pred);
    KDT_CUDA_CHECK_LAUNCH("argmax");
    return KDT_OK;
}
