/* The model's CUDA entry points in a CPU-only build (KDT_CUDA=0): each one is a clear error. */
#include "common/device.h"
#include "common/internal.h"
#include "model/comm_internal.h"
#include "model/cuda.h"

#if !KDT_HAVE_CUDA
kdt_status kdt_forward_cuda(kdt_model *m, kdt_cache *c, const kdt_batch *b, const int32_t *start, const int32_t *positions,
                            float *logits, float *hidden, void *stream) {
    (void)m; (void)c; (void)b; (void)start; (void)positions; (void)logits; (void)hidden; (void)stream;
    return kdt_no_cuda("model forward");
}

void kdt_cuda_ctx_free(struct kdt_cuda_ctx *ctx) { (void)ctx; }

void kdt_cuda_graph_counts(const struct kdt_cuda_ctx *ctx, int64_t *replays, int64_t *captures) {
    (void)ctx;
    *replays = *captures = 0;
}

kdt_status kdt_cuda_fill_uniform(void *dst, kdt_dtype dtype, size_t n, uint64_t seed, float center, float scale) {
    (void)dst; (void)dtype; (void)n; (void)seed; (void)center; (void)scale;
    return kdt_no_cuda("random weights");
}

kdt_status kdt_cuda_fill_bytes(void *dst, int byte, size_t n) {
    (void)dst; (void)byte; (void)n;
    return kdt_no_cuda("device fill");
}
/* The NCCL backend of kdt/comm.h needs the CUDA runtime. */
kdt_status kdt_nccl_world_init(kdt_comm_world *w) {
    (void)w;
    return kdt_fail(KDT_ERR_UNSUPPORTED, "comm: NCCL is unavailable in a build without CUDA (KDT_CUDA=0)");
}

void kdt_nccl_world_free(kdt_comm_world *w) { (void)w; }
kdt_status kdt_nccl_init(kdt_comm *c) { (void)c; return kdt_no_cuda("NCCL communicator"); }
void kdt_nccl_free(kdt_comm *c) { (void)c; }
kdt_status kdt_nccl_run(kdt_comm *c, const kdt_comm_call *call) { (void)c; (void)call; return kdt_no_cuda("NCCL collective"); }
kdt_status kdt_cuda_fill_codes(void *dst, size_t n, uint64_t seed, uint8_t mask) {
    (void)dst; (void)n; (void)seed; (void)mask;
    return kdt_no_cuda("random weights");
}
kdt_status kdt_cuda_pack_experts(kdt_dlin *gate_up, kdt_dlin *down) {
    (void)gate_up; (void)down;
    return kdt_no_cuda("INT4 expert packing");
}
#endif
