/* The speculative loop's device work besides the ops (src/spec/internal.h): the greedy argmax of
 * the target's logits into target_pred, a draft model's top-K with log-softmax scores, and the
 * loop's stream-ordered copies. One block per logits row; the rules are the host versions'
 * (src/spec/rows.c): the lowest index wins among equal values, NaN never wins an argmax unless
 * the whole row is NaN, non-finite values are never top-K candidates nor part of the softmax. */
#include <climits>
#include <cstdlib>
#include <math.h>

#include "common/cuda/cuda_common.cuh"
#include "common/sample_math.h"
#include "spec/internal.h"

namespace {

constexpr int kThreads = 256;
/* The argmax reads a row with 1024 threads and 16-byte loads: a decode step's one row of 8192 logits
 * is two loads a thread, one round trip instead of the 32 dependent ones of 256 threads. */
constexpr int kArgmaxThreads = 1024;

struct Best {
    float v;
    int i;
};

/* 1 when (bv, bi) comes before (av, ai) in argmax order: larger value, NaN last, lower index. */
__device__ bool argmax_before(float bv, int bi, float av, int ai) {
    if (isnan(bv) != isnan(av)) return !isnan(bv);
    if (isnan(bv) || bv == av) return bi < ai;
    return bv > av;
}

/* Block-wide reduction of one Best per thread (kN threads); the result lands in every thread. */
template <int kN = kThreads, typename Before>
__device__ Best block_best(Best b, Before before) {
    __shared__ float sv[kN / 32];
    __shared__ int si[kN / 32];
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_down_sync(0xffffffffu, b.v, o);
        const int oi = __shfl_down_sync(0xffffffffu, b.i, o);
        if (before(ov, oi, b.v, b.i)) b = {ov, oi};
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads(); /* the shared slots may still be read by a previous call */
    if (lane == 0) sv[warp] = b.v, si[warp] = b.i;
    __syncthreads();
    b = {sv[0], si[0]};
    for (int w = 1; w < kN / 32; w++)
        if (before(sv[w], si[w], b.v, b.i)) b = {sv[w], si[w]};
    return b;
}

__device__ double block_sum(double x) {
    __shared__ double s[kThreads / 32];
    for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
    __syncthreads();
    if (threadIdx.x % 32 == 0) s[threadIdx.x / 32] = x;
    __syncthreads();
    double t = 0;
    for (int w = 0; w < kThreads / 32; w++) t += s[w];
    return t;
}

/* Block (a, i): pred[a * Q + i] = argmax of logits row rows[a] + i when i < rows[Ba + a], else -1;
 * without rows, row a * Q + i of Q per request. kVec: rows read as float4 (V % 4 == 0, x 16-byte
 * aligned). The argmax order is total, so the result does not depend on the reduction's shape. */
template <bool kVec>
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const float *__restrict__ x, int32_t V, int32_t Q,
                                                                const int32_t *__restrict__ rows, int32_t Ba, int32_t *__restrict__ pred) {
    const int a = blockIdx.x / Q, i = blockIdx.x % Q;
    const int n = rows ? rows[Ba + a] : Q;
    if (i >= n) {
        if (threadIdx.x == 0) pred[blockIdx.x] = -1;
        return;
    }
    const float *row = x + ((int64_t)(rows ? rows[a] : a * Q) + i) * V;
    Best b = {NAN, INT_MAX};
    if (kVec) {
        for (int j = threadIdx.x; j < V / 4; j += kArgmaxThreads) {
            const float4 v = ((const float4 *)row)[j];
            const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int k = 0; k < 4; k++)
                if (argmax_before(e[k], 4 * j + k, b.v, b.i)) b = {e[k], 4 * j + k};
        }
    } else {
        for (int j = threadIdx.x; j < V; j += kArgmaxThreads)
            if (argmax_before(row[j], j, b.v, b.i)) b = {row[j], j};
    }
    b = block_best<kArgmaxThreads>(b, argmax_before);
    if (threadIdx.x == 0) pred[blockIdx.x] = b.i < V ? b.i : 0;
}

/* Top-K order: finite values only, larger first, then the lower index. */
__device__ bool topk_before(float bv, int bi, float av, int ai) {
    if (!isfinite(bv)) return false;
    if (!isfinite(av)) return true;
    return bv > av || (bv == av && bi < ai);
}

/* Row r: K rounds, each the best entry after the previous round's in top-K order (a strict total
 * order, so nothing is taken twice), then scores = value - logsumexp over the finite values;
 * top1[r] (may be NULL) = the first token. */
__global__ void topk_kernel(const float *__restrict__ x, int32_t V, int32_t K, float *__restrict__ scores,
                            int32_t *__restrict__ tokens, int64_t stride, int32_t *__restrict__ top1) {
    const float *row = x + (int64_t)blockIdx.x * V;
    float *sc = scores + blockIdx.x * stride;
    int32_t *tk = tokens + blockIdx.x * stride;
    float last_v = INFINITY, mx = 0;
    int last_i = -1, found = 0;
    for (int k = 0; k < K; k++) {
        Best b = {NAN, INT_MAX};
        for (int j = threadIdx.x; j < V; j += kThreads) {
            const float v = row[j];
            const bool after = k == 0 || v < last_v || (v == last_v && j > last_i);
            if (after && topk_before(v, j, b.v, b.i)) b = {v, j};
        }
        b = block_best(b, topk_before);
        if (!isfinite(b.v)) break;
        if (threadIdx.x == 0) sc[k] = b.v, tk[k] = b.i;
        if (k == 0) mx = b.v;
        last_v = b.v;
        last_i = b.i;
        found = k + 1;
    }
    double sum = 0;
    for (int j = threadIdx.x; found && j < V; j += kThreads)
        if (isfinite(row[j])) sum += exp((double)row[j] - mx);
    sum = block_sum(sum);
    if (threadIdx.x != 0) return;
    const double lse = (double)mx + log(sum);
    for (int k = 0; k < K; k++) {
        sc[k] = k < found ? (float)((double)sc[k] - lse) : -INFINITY;
        if (k >= found) tk[k] = 0;
    }
    if (top1) top1[blockIdx.x] = found ? tk[0] : 0;
}

/* Row r as kdt_spec_sample_host: q = softmax(x / T) (each token's weight over their sum) into
 * probs, then the K draws by inverse CDF over q's integer weights. Each thread owns a contiguous
 * segment of the row (so that the prefix sums are per-thread sums, scanned once). */
__global__ void sample_kernel(const float *__restrict__ x, int32_t V, int32_t K, int32_t depth, const float *__restrict__ temperature,
                              const uint64_t *__restrict__ seed, float *__restrict__ probs, int64_t pstride,
                              float *__restrict__ scores, int32_t *__restrict__ tokens, int64_t stride, int32_t *__restrict__ top1) {
    __shared__ unsigned long long before[kThreads + 1];
    const float *row = x + (int64_t)blockIdx.x * V, T = temperature[blockIdx.x];
    float *q = probs + blockIdx.x * pstride;
    if (!(T > 0.0f)) {
        for (int j = threadIdx.x; j < V; j += kThreads) q[j] = 0.0f;
        return;
    }
    float m = -INFINITY;
    for (int j = threadIdx.x; j < V; j += kThreads) m = fmaxf(m, kdt_sample_key(row[j], T));
    m = block_best({m, 0}, argmax_before).v;
    const int seg = (V + kThreads - 1) / kThreads, lo = min(V, (int)threadIdx.x * seg), hi = min(V, lo + seg);
    double part = 0;
    for (int j = lo; j < hi; j++) part += q[j] = kdt_sample_weight(kdt_sample_key(row[j], T), m) * 0x1p-32f;
    const double sum = block_sum(part);
    unsigned long long w = 0;
    for (int j = lo; j < hi; j++) w += kdt_draft_weight(q[j] = (float)(q[j] / sum));
    before[threadIdx.x + 1] = w;
    __syncthreads();
    if (threadIdx.x == 0) {
        before[0] = 0;
        for (int t = 1; t <= kThreads; t++) before[t] += before[t - 1];
    }
    __syncthreads();
    const unsigned long long Qz = before[kThreads];
    for (int k = 0; k < K; k++) {
        const double u = kdt_sample_uniform(seed[blockIdx.x], 0, (uint32_t)depth, (uint32_t)k, KDT_SAMPLE_STREAM_DRAFT);
        const unsigned long long t = kdt_sample_target(u, Qz);
        if (!(before[threadIdx.x] <= t && t < before[threadIdx.x + 1])) continue; /* one thread's segment holds t */
        unsigned long long cum = before[threadIdx.x];
        int v = lo;
        while (v < hi - 1 && (cum += kdt_draft_weight(q[v])) <= t) v++;
        tokens[blockIdx.x * stride + k] = v;
        scores[blockIdx.x * stride + k] = KDT_SPEC_SAMPLE_SCORE(k);
        if (k == 0 && top1) top1[blockIdx.x] = v;
    }
}

/* dst row i = src row idx[i], or zeros where idx[i] < 0; rows of V floats. */
__global__ void gather_kernel(const float *__restrict__ src, int32_t V, const int32_t *__restrict__ idx, float *__restrict__ dst) {
    const int32_t s = idx[blockIdx.x];
    float *d = dst + (int64_t)blockIdx.x * V;
    for (int j = threadIdx.x; j < V; j += kThreads) d[j] = s >= 0 ? src[(int64_t)s * V + j] : 0.0f;
}

} // namespace

extern "C" kdt_status kdt_spec_sample_cuda(const float *x, int64_t R, int32_t V, int32_t K, int32_t depth, const float *temperature,
                                           const uint64_t *seed, float *probs, int64_t pstride, float *scores, int32_t *tokens,
                                           int64_t stride, int32_t *top1, void *stream) {
    if (R <= 0) return KDT_OK;
    sample_kernel<<<(unsigned)R, kThreads, 0, (cudaStream_t)stream>>>(x, V, K, depth, temperature, seed, probs, pstride, scores,
                                                                      tokens, stride, top1);
    KDT_CUDA_CHECK_LAUNCH("spec sample");
    return KDT_OK;
}

extern "C" kdt_status kdt_spec_gather_rows_cuda(const float *src, int32_t V, const int32_t *idx, int64_t R, float *dst, void *stream) {
    if (R <= 0) return KDT_OK;
    gather_kernel<<<(unsigned)R, kThreads, 0, (cudaStream_t)stream>>>(src, V, idx, dst);
    KDT_CUDA_CHECK_LAUNCH("spec gather rows");
    return KDT_OK;
}

extern "C" kdt_status kdt_spec_argmax_cuda(const float *x, int32_t V, int32_t Ba, int32_t Q, const int32_t *rows, int32_t *pred,
                                           void *stream) {
    if (Ba <= 0) return KDT_OK;
    const unsigned g = (unsigned)(Ba * Q);
    if (V % 4 == 0 && (uintptr_t)x % 16 == 0)
        argmax_kernel<true><<<g, kArgmaxThreads, 0, (cudaStream_t)stream>>>(x, V, Q, rows, Ba, pred);
    else
        argmax_kernel<false><<<g, kArgmaxThreads, 0, (cudaStream_t)stream>>>(x, V, Q, rows, Ba, pred);
    KDT_CUDA_CHECK_LAUNCH("spec argmax");
    return KDT_OK;
}

extern "C" kdt_status kdt_spec_topk_cuda(const float *x, int64_t R, int32_t V, int32_t K, float *scores, int32_t *tokens,
                                         int64_t stride, int32_t *top1, void *stream) {
    if (R <= 0) return KDT_OK;
    topk_kernel<<<(unsigned)R, kThreads, 0, (cudaStream_t)stream>>>(x, V, K, scores, tokens, stride, top1);
    KDT_CUDA_CHECK_LAUNCH("spec top-k");
    return KDT_OK;
}

extern "C" kdt_status kdt_spec_copy(void *dst, const void *src, size_t nbytes, kdt_spec_copy_kind kind, void *stream) {
    if (nbytes == 0) return KDT_OK;
    cudaStream_t st = (cudaStream_t)stream;
    if (kind != KDT_SPEC_D2H) {
        KDT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, kind == KDT_SPEC_H2D ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice, st));
        return KDT_OK;
    }
    KDT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, st));
    KDT_CUDA_CHECK(cudaStreamSynchronize(st));
    return KDT_OK;
}

namespace {
__global__ void gather(const float *x, int64_t W, const int32_t *rows, float *y) {
    const int64_t i = blockIdx.y;
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < W; j += (int64_t)gridDim.x * blockDim.x)
        y[i * W + j] = x[rows[i] * W + j];
}
} // namespace

extern "C" kdt_status kdt_spec_gather_cuda(const float *x, int64_t W, const int32_t *rows, int32_t n, float *y, void *stream) {
    if (n <= 0) return KDT_OK;
    const int64_t bx = (W + kThreads - 1) / kThreads;
    gather<<<dim3((unsigned)(bx < 64 ? bx : 64), (unsigned)n), kThreads, 0, (cudaStream_t)stream>>>(x, W, rows, y);
    KDT_CUDA_CHECK_LAUNCH("spec gather");
    return KDT_OK;
}

extern "C" kdt_status kdt_spec_stream_sync(void *stream) {
    KDT_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)stream));
    KDT_CUDA_CHECK(cudaGetLastError());
    return KDT_OK;
}

extern "C" kdt_status kdt_spec_span_begin(void **span, void *stream) {
    cudaEvent_t *ev = (cudaEvent_t *)*span;
    if (!ev) {
        if (!(ev = (cudaEvent_t *)calloc(2, sizeof *ev))) return kdt_fail(KDT_ERR_NOMEM, "speculative loop: out of memory");
        *span = ev;
        for (int i = 0; i < 2; i++) KDT_CUDA_CHECK(cudaEventCreate(&ev[i]));
    }
    KDT_CUDA_CHECK(cudaEventRecord(ev[0], (cudaStream_t)stream));
    return KDT_OK;
}

extern "C" kdt_status kdt_spec_span_end(void *span, void *stream, double *acc) {
    cudaEvent_t *ev = (cudaEvent_t *)span;
    float ms = 0.0f;
    KDT_CUDA_CHECK(cudaEventRecord(ev[1], (cudaStream_t)stream));
    KDT_CUDA_CHECK(cudaEventSynchronize(ev[1]));
    KDT_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
    *acc += 1e-3 * (double)ms;
    return KDT_OK;
}

extern "C" void kdt_spec_span_free(void *span) {
    cudaEvent_t *ev = (cudaEvent_t *)span;
    for (int i = 0; ev && i < 2; i++)
        if (ev[i]) (void)cudaEventDestroy(ev[i]);
    free(ev);
}
