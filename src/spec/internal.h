/* Helpers shared by the files of src/spec/: the host versions of the per-row reductions, and the
 * stream helpers of the CUDA backend (src/spec/cuda/rows.cu; src/spec/no_cuda.c in a CPU-only build). */
#pragma once

#include "kdt/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Index of each row's largest value, the lowest index among equals (NaN never wins unless the
 * whole row is NaN): x [R, V], out [R]. */
void kdt_spec_argmax_host(const float *x, int64_t R, int32_t V, int32_t *out);

/* Per row of x [R, V]: the K largest values in decreasing order (the lower index first among
 * equals), as log-softmax scores (x - logsumexp(x)) and token ids; -inf and token 0 past the
 * row's finite values. Row r writes scores / tokens [K] at r * stride. */
void kdt_spec_topk_host(const float *x, int64_t R, int32_t V, int32_t K, float *scores, int32_t *tokens, int64_t stride);

/* The same on the device, queued on stream. argmax: pred [Ba, Q] from logits x [*, V], request
 * a's row i at rows[a] + i for i < rows[Ba + a] and -1 past them (rows [2, Ba], device; NULL: Q
 * rows each, back to back). top-K: as the host version over R rows; top1 [R] (device, may be
 * NULL) gets each row's first token. */
kdt_status kdt_spec_argmax_cuda(const float *x, int32_t V, int32_t Ba, int32_t Q, const int32_t *rows, int32_t *pred,
                                void *stream);
kdt_status kdt_spec_topk_cuda(const float *x, int64_t R, int32_t V, int32_t K, float *scores, int32_t *tokens, int64_t stride,
                              int32_t *top1, void *stream);

/* Sampled candidates (a model drafter's, docs/sampling.md 6). Per row r of x [R, V] with
 * temperature[r] > 0: q = softmax(x / T) (the weights of common/sample_math.h over their sum) into
 * probs row r (at r * pstride), and K tokens drawn i.i.d. from q's integer weights kdt_draft_weight
 * (those tree_sample_accept reads) by inverse CDF in token order, draw k being
 * kdt_sample_uniform(seed[r], 0, depth, k, KDT_SAMPLE_STREAM_DRAFT), into tokens [K] at r * stride
 * with scores KDT_SPEC_SAMPLE_SCORE(k); top1[r] (device, may be NULL) = the first draw. Rows with
 * temperature 0 get probs zero and keep their tokens and scores. temperature and seed [R] are host
 * memory for the host version, device memory for the CUDA one. */
void kdt_spec_sample_host(const float *x, int64_t R, int32_t V, int32_t K, int32_t depth, const float *temperature,
                          const uint64_t *seed, float *probs, int64_t pstride, float *scores, int32_t *tokens, int64_t stride);
kdt_status kdt_spec_sample_cuda(const float *x, int64_t R, int32_t V, int32_t K, int32_t depth, const float *temperature,
                                const uint64_t *seed, float *probs, int64_t pstride, float *scores, int32_t *tokens,
                                int64_t stride, int32_t *top1, void *stream);
/* A sampled candidate's score depends on its rank k alone, never on the token drawn: tree_build's
 * choice of nodes would otherwise favour some draws over others, and the children kept would no
 * longer be i.i.d. draws from q (the condition of lossless acceptance). -(k + 1) ln 2. */
#define KDT_SPEC_SAMPLE_SCORE(k) (-0.6931472f * (float)((k) + 1))

/* dst [R, V]: row i = src row idx[i] (idx [R] device), zeros where idx[i] < 0. */
kdt_status kdt_spec_gather_rows_cuda(const float *src, int32_t V, const int32_t *idx, int64_t R, float *dst, void *stream);

/* Stream-ordered copies between host and device memory. D2H returns once the bytes are on the
 * host (it waits for the stream); H2D and D2D are queued on the stream (from pageable memory the
 * bytes have been staged when it returns, so the source may be reused). */
typedef enum kdt_spec_copy_kind { KDT_SPEC_H2D = 0, KDT_SPEC_D2H = 1, KDT_SPEC_D2D = 2 } kdt_spec_copy_kind;
/* y [n, W] = rows rows[i] (device [n]) of x [*, W], all device memory, queued on stream. */
kdt_status kdt_spec_gather_cuda(const float *x, int64_t W, const int32_t *rows, int32_t n, float *y, void *stream);
kdt_status kdt_spec_copy(void *dst, const void *src, size_t nbytes, kdt_spec_copy_kind kind, void *stream);
kdt_status kdt_spec_stream_sync(void *stream);

/* Profiling: *span (two CUDA events, made by the first begin) marks the start of work queued on
 * stream; end marks its end, waits for it and adds the device time between the two, in seconds,
 * to *acc. */
kdt_status kdt_spec_span_begin(void **span, void *stream);
kdt_status kdt_spec_span_end(void *span, void *stream, double *acc);
void kdt_spec_span_free(void *span);

/* A copy to the host that the host waits for later (pipelined decoding, src/spec/decode.c): start
 * queues nbytes of src (device) into *rb's pinned buffer on stream, then an event (*rb is made by
 * the first start, with room for cap bytes); wait blocks until that point of the stream is reached
 * and gives the pinned copy. */
kdt_status kdt_spec_readback_start(void **rb, const void *src, size_t nbytes, size_t cap, void *stream);
kdt_status kdt_spec_readback_wait(void *rb, const void **host);
void kdt_spec_readback_free(void *rb);

#ifdef __cplusplus
}
#endif
