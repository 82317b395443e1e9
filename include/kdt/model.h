/* The target model: a DeepseekV3ForCausalLM (DeepSeek-V3, Kimi K2) loaded from a Hugging Face
 * folder (docs/interfaces.md section 4) or built in, a paged latent KV cache, and one forward that serves
 * prefill, decode and tree verification alike.
 *
 * A forward takes a batch of requests, each with its own new rows (token ids), their rope
 * positions and a mask over the new rows, appends every row's latent KV to the request's cache
 * and returns logits. A chain (mask NULL, positions NULL) is a causal prefill or a decode step;
 * a tree (tree_build's tree_mask and positions) is a verification step, after which
 * kdt_cache_commit keeps the accepted path.
 *
 * Attention is MLA in absorbed form through kdt_verify_attn: the cache holds one latent row per
 * token, [kv_a_layernorm(compressed_kv) (kv_lora_rank), rope(k_rope) (qk_rope_head_dim)], so
 * Dv = kv_lora_rank, Dr = qk_rope_head_dim; the query of head h is [q_nope_h @ W_UK_h, rope(q_rope_h)]
 * and W_UV_h is applied to the Dv-dim output. Rope outputs are in transformers' layout (the
 * rotated pairs' first elements, then their second elements).
 *
 * Threads and devices. A model and its caches are not safe for concurrent calls: two
 * kdt_model_forward calls on one model at the same time are not supported on either backend (on
 * CUDA they share the model's scratch buffers, pinned staging and cuBLAS handle, which the first
 * forward creates); serialize them (one thread, or a lock). Different models may be used from
 * different threads. On CUDA the model lives on the device current when it was loaded, and every
 * call on it (and its caches) must run with that device current. */
#pragma once

#include "kdt/comm.h"
#include "kdt/kdt.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KDT_CACHE_BLOCK 64       /* rows per KV cache block */
#define KDT_MODEL_MAX_TREE 1025  /* most rows of one tree (verify_attn's Q limit); chains are chunked */

/* The fields of config.json that change the math, after defaults and validation. */
enum { KDT_TOPK_NOAUX_TC = 0, KDT_TOPK_GREEDY = 1, KDT_TOPK_GROUP_LIMITED = 2 };

typedef struct kdt_model_config {
    int32_t vocab_size, hidden_size, num_hidden_layers;
    int32_t intermediate_size;         /* dense layers' MLP */
    int32_t moe_intermediate_size;     /* each routed expert; shared experts: times n_shared_experts */
    int32_t num_attention_heads;
    int32_t q_lora_rank;               /* 0: config had null, q_proj maps hidden to the heads directly */
    int32_t kv_lora_rank;              /* Dv of the cache */
    int32_t qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    int32_t n_routed_experts;          /* 0: config had null, every layer is dense */
    int32_t n_shared_experts, num_experts_per_tok, n_group, topk_group;
    int32_t first_k_dense_replace, moe_layer_freq; /* layer L is MoE iff L >= first_k and L % freq == 0 */
    int32_t norm_topk_prob, tie_word_embeddings, rope_interleave; /* 0 / 1 */
    int32_t max_position_embeddings;
    float routed_scaling_factor, rms_norm_eps;
    /* Router: sigmoid scores with e_score_correction_bias and groups ranked by their two best
     * (DeepSeek-V3, Kimi, Moonlight, GLM), or softmax scores with no bias (DeepSeek-V2), either
     * over all experts (greedy) or within the groups of the best maxima (group_limited_greedy). */
    int32_t router_softmax;            /* scoring_func: 0 sigmoid, 1 softmax */
    int32_t topk_method;               /* KDT_TOPK_NOAUX_TC, KDT_TOPK_GREEDY, KDT_TOPK_GROUP_LIMITED */
    /* Rope, resolved: inv_freq[i] = theta^(-2i/d), with YaRN's ramp when yarn; cos and sin are
     * multiplied by rope_attention_factor. */
    int32_t rope_yarn;                 /* 0 default, 1 yarn */
    double rope_theta;
    double yarn_factor, yarn_beta_fast, yarn_beta_slow, yarn_mscale, yarn_mscale_all_dim;
    int32_t yarn_original_max_position_embeddings, yarn_truncate;
    double rope_attention_factor;      /* cos/sin multiplier (1 without yarn) */
    double softmax_scale;              /* (nope + rope)^-0.5, times mscale^2 of yarn_get_mscale(factor, mscale_all_dim) */
} kdt_model_config;

typedef struct kdt_model kdt_model;
typedef struct kdt_cache kdt_cache;

/* Loads config.json and model.safetensors (or the shards of model.safetensors.index.json) from
 * dir: DeepSeek-V3 / Kimi K2, Moonlight, DeepSeek-V2, GLM-4.7-Flash, or the language model of
 * Kimi K2.5 / K2.6 / Kimi-VL (text_config, `language_model.` names). f32, bf16 and f16 weights,
 * FP8 blocks and compressed-tensors INT4 groups (docs/interfaces.md section 4; dequantized to f32 on the CPU, kept
 * quantized on the GPU by KDT_BACKEND_CUDA in bf16);
 * experts one tensor per expert (the hub's layout) or fused (transformers 5). Every missing tensor, wrong shape or bad field fails with a message naming
 * the file, tensor or field. KDT_BACKEND_CPU computes in f32, KDT_BACKEND_CUDA in bf16 (weights,
 * activations between GEMMs and the KV cache in bf16; accumulation, norms, the residual stream
 * and the router in f32). */
KDT_API kdt_status kdt_model_load(const char *dir, kdt_backend backend, kdt_model **out);
/* The checkpoint's first next-token (MTP) layer, model.layers.N with N = num_hidden_layers
 * (DeepSeek-V3, GLM-4.7-Flash: num_nextn_predict_layers >= 1), as a one-layer model whose row
 * input is x = eh_proj([enorm(embed(token)); hnorm(h)]), h the kdt_batch's mtp_hidden row, then
 * the decoder layer (MLA over its own cache, MoE or dense as layer N is), shared_head.norm and
 * shared_head.head (the checkpoint's LM head when absent); the embedding is layer N's
 * embed_tokens when present, else the model's. CPU (f32) or CUDA (bf16, mtp_hidden then device memory). */
KDT_API kdt_status kdt_model_load_mtp(const char *dir, kdt_backend backend, kdt_model **out);
/* The built-in model (Kimi K2's layout scaled down: see src/model/builtin.c), made from seed. */
KDT_API kdt_status kdt_model_builtin(uint64_t seed, kdt_backend backend, kdt_model **out);
/* As the two above with the compute dtype chosen: KDT_F32 (on CUDA too: f32 weights, activations
 * and cache, for lossless checks against the CPU) or KDT_BF16 (on the CPU an emulation, f32
 * arithmetic rounded to bf16 wherever the CUDA backend stores bf16: the CUDA path's reference). */
KDT_API kdt_status kdt_model_load_as(const char *dir, kdt_backend backend, kdt_dtype dtype, kdt_model **out);
KDT_API kdt_status kdt_model_builtin_as(uint64_t seed, kdt_backend backend, kdt_dtype dtype, kdt_model **out);
KDT_API void       kdt_model_free(kdt_model *m);
KDT_API const kdt_model_config *kdt_model_get_config(const kdt_model *m);
KDT_API kdt_backend kdt_model_backend(const kdt_model *m);
KDT_API kdt_dtype  kdt_model_dtype(const kdt_model *m);   /* the compute dtype (also the cache's) */
/* Options of the CUDA forward (bits; the CPU backend ignores them). A model starts with
 * $KDT_MODEL_FLAGS (a number) where set, else KDT_MODEL_MOE_DEVICE | KDT_MODEL_GRAPHS | KDT_MODEL_FUSED |
 * KDT_MODEL_PDL.
 *   KDT_MODEL_MOE_DEVICE: MoE layers of batches with at most 16 rows per expert on average (for
 *     experts of 32 MB and more, 2 unless they are dense bf16: cuBLAS is faster past that; decode,
 *     verification) run the routed experts in two kernels reading the routing from device memory,
 *     so the forward has no host wait inside (else cuBLAS GEMMs per expert, sized on the host).
 *   KDT_MODEL_GRAPHS: KDT_MODEL_MOE_DEVICE, and forwards with no host wait inside are captured as
 *     CUDA graphs the second time their shape is seen (the requests' row counts, tree or chain,
 *     logits rows, the cache, device output addresses) and replayed from then on, with the same
 *     results bit for bit. */
#define KDT_MODEL_MOE_DEVICE 1u
#define KDT_MODEL_GRAPHS 2u
#define KDT_MODEL_GEMV 4u  /* the projections (q_b, o, dense MLPs, LM head) of batches of at most 16 rows
                              in the device MoE's kernel instead of cuBLAS: an experiment, deterministic */
#define KDT_MODEL_FUSED 8u /* fewer launches: a MoE layer's routing of at most 64 rows in one block (the f32 router
                              scores too where the router is at most 64 KB), the q_a norm in the cache append's
                              launch; for at most 16 rows and weights under 8 MB, the query's rope with the W_UK
                              absorb and the projections in the small-batch kernel; with KDT_MODEL_MOE_DEVICE,
                              experts under 32 MB on the device kernels up to 2^30 routed multiply-adds (prefill
                              of the small models). Deterministic */
#define KDT_MODEL_PDL 16u  /* in decode- and verify-sized forwards (graphs, or at most 64 rows), the model's own
                              kernels (norms, cache append, absorb, router, small-batch products, MoE combine) with
                              programmatic dependent launch: each may be scheduled while the one before it runs and
                              waits on the device; the same bits */
KDT_API kdt_status kdt_model_set_flags(kdt_model *m, uint32_t flags);
KDT_API uint32_t   kdt_model_flags(const kdt_model *m);
/* Forwards replayed from a graph and graphs captured so far (0 on the CPU). */
KDT_API void       kdt_model_graph_counts(const kdt_model *m, int64_t *replays, int64_t *captures);
/* Parses a config.json text (what kdt_model_load does first); `what` names it in messages. */
KDT_API kdt_status kdt_model_config_parse(const char *json, size_t len, const char *what, kdt_model_config *out);

/* ---- Paged latent KV cache: per layer a pool [num_blocks, KDT_CACHE_BLOCK, Dv + Dr], one block
 * table shared by the layers. Requests are slots 0 .. max_requests - 1; blocks are taken from a
 * common free list as rows are appended and given back by reset and truncate. ---- */
/* max_len: most rows per request; num_blocks 0: enough for every request at max_len. */
KDT_API kdt_status kdt_cache_create(const kdt_model *m, int32_t max_requests, int32_t max_len,
                                    int32_t num_blocks, kdt_cache **out);
KDT_API void       kdt_cache_free(kdt_cache *c);
KDT_API int32_t    kdt_cache_len(const kdt_cache *c, int32_t req);       /* rows held; -1 if req is out of range */
KDT_API kdt_status kdt_cache_reset(kdt_cache *c, int32_t req);           /* empties a request */
KDT_API kdt_status kdt_cache_truncate(kdt_cache *c, int32_t req, int32_t len); /* keeps rows [0, len) */
KDT_API int32_t    kdt_cache_num_blocks(const kdt_cache *c);             /* the pool's blocks */
KDT_API int32_t    kdt_cache_free_blocks(const kdt_cache *c);            /* of those, not held by a request */

/* The pieces kdt_kv_commit and verify_attn take, for one layer (backend memory), as of this call:
 * on CUDA the device block table and lengths are updated here, not by forwards and commits, so take
 * a new view after the cache changes. */
typedef struct kdt_cache_layer_view {
    void *kv_cache;              /* [NB, BS, Dqk] */
    kdt_dtype dtype;
    int32_t NB, BS, Dqk, Dv;
    const int32_t *block_table;  /* [max_requests, MB]; -1 past a request's blocks */
    int32_t MB;
    const int32_t *kv_len;       /* [max_requests] */
} kdt_cache_layer_view;
KDT_API kdt_status kdt_cache_layer(const kdt_cache *c, int32_t layer, kdt_cache_layer_view *out);

/* After a verification forward that appended Q tree rows for each of B requests: moves each
 * request's accepted path (tree_accept's accept_index [B, Q] and accept_len [B]) right after
 * its prefix in every layer through kdt_kv_commit, and shortens the request to prefix + 1 +
 * accept_len rows. Host memory for every pointer, whatever the backend. */
KDT_API kdt_status kdt_cache_commit(kdt_cache *c, int32_t B, const int32_t *req, int32_t Q,
                                    const int32_t *accept_index, const int32_t *accept_len);

/* ---- Forward ---- */
typedef enum kdt_logits_rows {
    KDT_LOGITS_ALL = 0,          /* logits [R, vocab]: every new row */
    KDT_LOGITS_LAST = 1,         /* logits [B, vocab]: each request's last row (prefill) */
} kdt_logits_rows;

/* R = sum of n_rows. Rows of request b are rows off_b .. off_b + n_rows[b] - 1, off_b = the sum
 * of the earlier n_rows. Host memory for every pointer, whatever the backend. */
typedef struct kdt_batch {
    int32_t B;                   /* requests in this call, 1 .. */
    const int32_t *req;          /* [B] cache slots, distinct */
    const int32_t *n_rows;       /* [B] new rows per request, >= 1 */
    const int32_t *tokens;       /* [R] token ids */
    const int32_t *positions;    /* [R] rope positions (>= 0); NULL: cache length + i, a chain */
    const uint8_t *tree_mask;    /* per request [n_rows, n_rows] (0/1), back to back; NULL: causal.
                                    A request with a mask has n_rows <= KDT_MODEL_MAX_TREE. */
    kdt_logits_rows logits_rows;
    const float *mtp_hidden;     /* [R, hidden] host (device on CUDA): an MTP model's (kdt_model_load_mtp) other input, the
                                    target's hidden state paired with each row's token; NULL otherwise */
    /* CUDA only (KDT_ERR_UNSUPPORTED on the CPU), for a decode loop that queues its next step before
     * it reads this one's tokens (docs/spec.md, "Pipelined plain decoding"). Zero: unused. */
    const int32_t *dev_tokens;   /* [R] device: the token ids, read when the forward's work runs (after the
                                    work queued before it on the stream, e.g. an earlier forward's argmax;
                                    may be this forward's argmax, read before it is written); tokens is
                                    then unused and may be NULL */
    int32_t *argmax;             /* [RL] device: each logits row's argmax (the lowest index among equal values,
                                    NaN only for a row all NaN), computed by the forward's own work */
    int32_t no_wait;             /* 1: return once the work is queued; logits, hidden and argmax must be device
                                    memory, ready after the stream reaches this point */
} kdt_batch;

/* Runs the model over the batch's rows, appends their latent KV rows to the cache (a chain
 * longer than KDT_MODEL_MAX_TREE rows is attended in chunks), and writes logits ([R, vocab] or
 * [B, vocab], host, may be NULL) and the final hidden states after the last norm ([R, hidden],
 * host, may be NULL: what a drafter that reads the target's states takes). On failure no cache
 * length changes. stream: the CUDA stream (unused on CPU). On CUDA, logits and hidden may also
 * be device memory, and the call returns once they are written (with no_wait, once queued). */
/* What the forward's hidden output holds: with n > 0, the residual streams after layers
 * layers[0 .. n-1] (each in 0 .. num_hidden_layers - 1, the output of that decoder layer, no norm),
 * concatenated per row: hidden [R, n * hidden_size]; n = 0 (the default): the final norm's output
 * [R, hidden_size]. For drafters that read intermediate layers (DFlash). On CUDA with n > 0,
 * hidden must be device memory (else the forward fails with KDT_ERR_UNSUPPORTED). */
#define KDT_MODEL_MAX_HIDDEN_LAYERS 16
KDT_API kdt_status kdt_model_set_hidden_layers(kdt_model *m, int32_t n, const int32_t *layers);
/* The embedding and the LM head [vocab, hidden] each (the same memory when tied), in the backend's
 * memory and the model's dtype (kdt_model_dtype): host f32 on the CPU, device memory on CUDA. For
 * drafters that share them (DFlash). */
KDT_API kdt_status kdt_model_embeddings(const kdt_model *m, const void **embed, const void **lm_head);
KDT_API kdt_status kdt_model_forward(kdt_model *m, kdt_cache *c, const kdt_batch *batch,
                                     float *logits, float *hidden, void *stream);

/* ---- Expert parallel (docs/multi_gpu.md): one model over the ranks of a communicator ----
 * Every rank calls one of the two loaders at once, from its own thread, with its own handle. Rank r
 * of N reads only the routed experts [r*E/N, (r+1)*E/N) of each MoE layer (the other experts' bytes
 * of the memory-mapped safetensors are never touched); rank 0 also reads everything else and is the
 * only rank that runs forwards, caches and the loop above them: at each MoE layer its forward sends
 * the layer's rows and routing to the others, which must sit in kdt_model_serve_experts, and
 * gathers their experts' outputs (CPU: the same f32 logits as one rank, bit for bit). A rank whose
 * load fails aborts the communicator, so every rank's load fails with a message naming it. A
 * communicator of size 1 (or NULL) is kdt_model_load_as / kdt_model_builtin_as. The CUDA backend
 * takes a world of one only so far (KDT_ERR_UNSUPPORTED otherwise). Freeing rank 0's model ends the
 * other ranks' kdt_model_serve_experts. */
KDT_API kdt_status kdt_model_load_ranked(const char *dir, kdt_backend backend, kdt_dtype dtype, kdt_comm *comm,
                                         kdt_model **out);
KDT_API kdt_status kdt_model_builtin_ranked(uint64_t seed, kdt_backend backend, kdt_dtype dtype, kdt_comm *comm,
                                            kdt_model **out);
/* Ranks > 0: answers rank 0's MoE layers until its model is freed (KDT_OK) or the communicator fails. */
KDT_API kdt_status kdt_model_serve_experts(kdt_model *m);

#ifdef __cplusplus
}
#endif
