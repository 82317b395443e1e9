/* The loop's CUDA helpers in a CPU-only build (KDT_CUDA=0): a clear error. */
#include "common/device.h"
#include "spec/dflash.h"
#include "spec/internal.h"

#if !KDT_HAVE_CUDA
kdt_status kdt_spec_argmax_cuda(const float *x, int32_t V, int32_t Ba, int32_t Q, const int32_t *rows, int32_t *pred,
                                void *stream) {
    (void)x; (void)V; (void)Ba; (void)Q; (void)rows; (void)pred; (void)stream;
    return kdt_no_cuda("speculative loop: argmax");
}
kdt_status kdt_spec_topk_cuda(const float *x, int64_t R, int32_t V, int32_t K, float *scores, int32_t *tokens, int64_t stride,
                              int32_t *top1, void *stream) {
    (void)x; (void)R; (void)V; (void)K; (void)scores; (void)tokens; (void)stride; (void)top1; (void)stream;
    return kdt_no_cuda("speculative loop: top-k");
}
kdt_status kdt_spec_sample_cuda(const float *x, int64_t R, int32_t V, int32_t K, int32_t depth, const float *temperature,
                                const uint64_t *seed, float *probs, int64_t pstride, float *scores, int32_t *tokens,
                                int64_t stride, int32_t *top1, void *stream) {
    (void)x; (void)R; (void)V; (void)K; (void)depth; (void)temperature; (void)seed; (void)probs; (void)pstride;
    (void)scores; (void)tokens; (void)stride; (void)top1; (void)stream;
    return kdt_no_cuda("speculative loop: sampled candidates");
}
kdt_status kdt_spec_gather_rows_cuda(const float *src, int32_t V, const int32_t *idx, int64_t R, float *dst, void *stream) {
    (void)src; (void)V; (void)idx; (void)R; (void)dst; (void)stream;
    return kdt_no_cuda("speculative loop: gather rows");
}
kdt_status kdt_spec_copy(void *dst, const void *src, size_t nbytes, kdt_spec_copy_kind kind, void *stream) {
    (void)dst; (void)src; (void)nbytes; (void)kind; (void)stream;
    return kdt_no_cuda("speculative loop: device copy");
}
kdt_status kdt_spec_gather_cuda(const float *x, int64_t W, const int32_t *rows, int32_t n, float *y, void *stream) {
    (void)x; (void)W; (void)rows; (void)n; (void)y; (void)stream;
    return kdt_no_cuda("speculative loop: gather");
}
kdt_status kdt_spec_stream_sync(void *stream) {
    (void)stream;
    return kdt_no_cuda("speculative loop: stream synchronize");
}
kdt_status kdt_spec_span_begin(void **span, void *stream) {
    (void)span; (void)stream;
    return kdt_no_cuda("speculative loop: profiling events");
}
kdt_status kdt_spec_span_end(void *span, void *stream, double *acc) {
    (void)span; (void)stream; (void)acc;
    return kdt_no_cuda("speculative loop: profiling events");
}
void kdt_spec_span_free(void *span) { (void)span; }
kdt_status kdt_spec_readback_start(void **rb, const void *src, size_t nbytes, size_t cap, void *stream) {
    (void)rb; (void)src; (void)nbytes; (void)cap; (void)stream;
    return kdt_no_cuda("speculative loop: pipelined copy");
}
kdt_status kdt_spec_readback_wait(void *rb, const void **host) {
    (void)rb; (void)host;
    return kdt_no_cuda("speculative loop: pipelined copy");
}
void kdt_spec_readback_free(void *rb) { (void)rb; }
kdt_status dfl_dev_create(const dfl_model *m, const dfl_config *c, uint64_t seed, const void *embed, const void *lm_head,
                          kdt_dtype dt, int32_t slots, int32_t max_len, int32_t D, dfl_dev **out) {
    (void)m; (void)c; (void)seed; (void)embed; (void)lm_head; (void)dt; (void)slots; (void)max_len; (void)D;
    *out = NULL;
    return kdt_no_cuda("dflash drafter");
}
void dfl_dev_free(dfl_dev *g) { (void)g; }
kdt_status dfl_dev_observe(dfl_dev *g, int32_t n, const float *hidden, const int32_t *rows, const int32_t *slot,
                           const int32_t *pos, void *stream) {
    (void)g; (void)n; (void)hidden; (void)rows; (void)slot; (void)pos; (void)stream;
    return kdt_no_cuda("dflash drafter");
}
kdt_status dfl_dev_propose(dfl_dev *g, int32_t B, const int32_t *slot, const int32_t *root, const int32_t *n_ctx, int32_t K,
                           float *scores, int32_t *tokens, void *stream) {
    (void)g; (void)B; (void)slot; (void)root; (void)n_ctx; (void)K; (void)scores; (void)tokens; (void)stream;
    return kdt_no_cuda("dflash drafter");
}
#endif
