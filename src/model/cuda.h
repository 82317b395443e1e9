/* The model's CUDA entry points (src/model/cuda/). A CPU-only build has stubs that fail with
 * KDT_ERR_NO_CUDA (src/model/no_cuda.c); the model never calls them there, since a CUDA model
 * cannot be made without a device. */
#pragma once

#include "model/internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA forward (cuda/forward.cu), as kdt_forward_cpu: the batch is validated, the cache grown.
 * Runs on `stream` and returns once logits and hidden (host or device memory) are written. */
kdt_status kdt_forward_cuda(kdt_model *m, kdt_cache *c, const kdt_batch *b, const int32_t *start, const int32_t *positions,
                            float *logits, float *hidden, void *stream);
void       kdt_cuda_ctx_free(struct kdt_cuda_ctx *ctx);
void       kdt_cuda_graph_counts(const struct kdt_cuda_ctx *ctx, int64_t *replays, int64_t *captures); /* ctx may be NULL */

/* Device fills (cuda/kernels.cu), on the legacy default stream: n values of dtype (bf16 or f32)
 * uniform in [center - scale, center + scale), a hash of (seed, index); n bytes set to `byte`. */
kdt_status kdt_cuda_fill_uniform(void *dst, kdt_dtype dtype, size_t n, uint64_t seed, float center, float scale);
kdt_status kdt_cuda_fill_bytes(void *dst, int byte, size_t n);
/* n random bytes (a hash of (seed, index)) ANDed with mask into dst (cuda/linear.cu): quantized codes. */
kdt_status kdt_cuda_fill_codes(void *dst, size_t n, uint64_t seed, uint8_t mask);
/* A MoE layer's INT4 routed experts (gate/up [E, 2I, hidden], down [E, hidden, I]) repacked in place into
 * the grouped kernel's layout (cuda/moe_quant.h; sets packed), where the kernel takes that layout (hidden
 * and I multiples of 128); anything else is left as it is. Waits for the device. */
kdt_status kdt_cuda_pack_experts(kdt_dlin *gate_up, kdt_dlin *down);

#ifdef __cplusplus
}
#endif
