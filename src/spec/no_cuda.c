/* The loop's CUDA helpers in a CPU-only build (KDT_CUDA=0): a clear error. */
#include "common/device.h"
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
kdt_status kdt_spec_stream_sync(void *stream) {
    (void)stream;
    return kdt_no_cuda("speculative loop: stream synchronize");
}
#endif
