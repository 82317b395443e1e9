/* The speculative loop's device work besides the ops (src/spec/internal.h): the greedy argmax of
 * the target's logits into target_pred (model/cuda/pick.cu's kernel), a draft model's top-K with
 * log-softmax scores, and the loop's stream-ordered copies. One block per logits row; the rules are the host versions'
 * (src/spec/rows.c): the lowest index wins among equal values, NaN never wins an argmax unless
 * the whole row is NaN, non-finite values are never top-K candidates nor part of the softmax. */
#include <climits>
#include <cstdlib>
#include <math.h>

#include "common/cuda/cuda_common.cuh"
#include "common/sample_math.h"
#include "model/cuda/pick.cuh"
#include "spec/internal.h"

namespace {

constexpr int kThreads = 256;

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
        kdt_best b = {NAN, INT_MAX};
        for (int j = threadIdx.x; j < V; j += kThreads) {
            const float v = row[j];
            const bool after = k == 0 || v < last_v || (v == last_v && j > last_i);
            if (after && topk_before(v, j, b.v, b.i)) b = {v, j};
        }
        b = kdt_block_best<kThreads>(b, topk_before);
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
    m = kdt_block_best<kThreads>({m, 0}, kdt_argmax_before).v;
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
    return kdt_mk_argmax(x, V, Ba, Q, rows, pred, (cudaStream_t)stream);
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

namespace {
struct Readback {
    void *host;                  /* pinned */
    size_t cap;
    cudaEvent_t ev;
};
} // namespace

extern "C" kdt_status kdt_spec_readback_start(void **rbp, const void *src, size_t nbytes, size_t cap, void *stream) {
    Readback *rb = (Readback *)*rbp;
    if (!rb) {
        if (!(rb = (Readback *)calloc(1, sizeof *rb))) return kdt_fail(KDT_ERR_NOMEM, "speculative loop: out of memory");
        *rbp = rb;
        KDT_CUDA_CHECK(cudaMallocHost(&rb->host, cap ? cap : 1));
        rb->cap = cap;
        KDT_CUDA_CHECK(cudaEventCreateWithFlags(&rb->ev, cudaEventDisableTiming));
    }
    if (nbytes > rb->cap) return kdt_fail(KDT_ERR_INTERNAL, "speculative loop: a readback of %zu bytes, room for %zu", nbytes, rb->cap);
    cudaStream_t st = (cudaStream_t)stream;
    if (nbytes) KDT_CUDA_CHECK(cudaMemcpyAsync(rb->host, src, nbytes, cudaMemcpyDeviceToHost, st));
    KDT_CUDA_CHECK(cudaEventRecord(rb->ev, st));
    return KDT_OK;
}

extern "C" kdt_status kdt_spec_readback_wait(void *rbp, const void **host) {
    Readback *rb = (Readback *)rbp;
    KDT_CUDA_CHECK(cudaEventSynchronize(rb->ev));
    *host = rb->host;
    return KDT_OK;
}

extern "C" void kdt_spec_readback_free(void *rbp) {
    Readback *rb = (Readback *)rbp;
    if (!rb) return;
    if (rb->host) (void)cudaFreeHost(rb->host);
    if (rb->ev) (void)cudaEventDestroy(rb->ev);
    free(rb);
}
