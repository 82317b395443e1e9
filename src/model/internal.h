/* The model's internal pieces: weights as the CPU backend holds them and as the CUDA backend
 * holds them, the cache, and the functions the files of src/model/ share. */
#pragma once

#include "kdt/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How a linear's weights are held on the device: in the model's dtype, or as the checkpoint
 * ships them (src/cuda/quant_gemm.h's formats: FP8 128x128 blocks, INT4 groups of 32). */
typedef enum kdt_wfmt { KDT_WFMT_DENSE = 0, KDT_WFMT_FP8 = 1, KDT_WFMT_INT4 = 2 } kdt_wfmt;

/* A quantized linear as the loader found it, for the CUDA backend to upload without dequantizing:
 * the checkpoint's bytes (memory-mapped, valid while the checkpoint is open). fmt DENSE: the f32
 * weight was loaded instead. */
typedef struct kdt_qsrc {
    kdt_wfmt fmt;
    const void *w;               /* FP8: e4m3 [out, in]; INT4: int32 words [out, in / 8] */
    const void *scale;           /* FP8: f32 [ceil(out/128), ceil(in/128)]; INT4: bf16 [out, in / 32] */
} kdt_qsrc;

/* nn.Linear weights are [out, in], row-major, as in the checkpoint. */
typedef struct kdt_mlp_w {
    const float *gate, *up;      /* [I, hidden]; NULL where gate_q / up_q hold them */
    const float *down;           /* [hidden, I] */
    int32_t inter;               /* I; 0: absent (no shared experts) */
    kdt_qsrc gate_q, up_q, down_q;
} kdt_mlp_w;

typedef struct kdt_layer_w {
    const float *attn_norm, *ffn_norm;         /* [hidden] */
    const float *q_a, *q_a_norm, *q_b;         /* [q_lora, hidden], [q_lora], [H * (nope + rope), q_lora] */
    const float *q_proj;                       /* [H * (nope + rope), hidden] when q_lora_rank is 0 */
    const float *kv_a;                         /* [kv_lora + rope, hidden] */
    const float *kv_a_norm;                    /* [kv_lora] */
    const float *kv_b;                         /* [H * (nope + v), kv_lora]: per head W_UK [nope] rows, then W_UV [v] */
    const float *o;                            /* [hidden, H * v] */
    int is_moe;
    kdt_mlp_w dense;                           /* !is_moe */
    const float *router;                       /* [E, hidden] */
    const float *router_bias;                  /* [E] e_score_correction_bias */
    const float *exp_gate, *exp_up;            /* [E, I, hidden] */
    const float *exp_down;                     /* [E, hidden, I] */
    kdt_mlp_w shared;
    /* CUDA bf16 models: linears kept quantized (the float pointer above is NULL then). Stacked
     * pairs ([q_a | kv_a], [gate | up]) are quantized both or neither; kv_b is always float. */
    kdt_qsrc q_a_q, q_proj_q, kv_a_q, q_b_q, o_q;
    kdt_qsrc *exp_q;                           /* [E, 3] gate, up, down; NULL: exp_gate/up/down hold them */
} kdt_layer_w;

/* The CUDA backend's weights, device memory: matrices in the model's dtype (bf16 or f32) or kept
 * quantized, norms, the router and its bias in f32. Projections that read the same input are
 * stacked, so that one GEMM computes them. */

/* n matrices [N, K] (the experts of a layer; 1 otherwise), each the rows of part 0 then those of
 * part 1. DENSE: one part, w [n, N, K] in the model's dtype. FP8 / INT4: w and scale per part as
 * quant_gemm.h has them, matrix e of part p at e times its size; a stack is two parts only where
 * FP8's 128-row scale blocks cannot span it (part 0's rows not a multiple of 128). */
typedef struct kdt_dlin {
    kdt_wfmt fmt;
    int32_t N, K, n;
    int32_t parts, N0;           /* N0: rows of part 0 (N when one part) */
    void *w[2], *scale[2];
#ifdef __cplusplus
    int32_t packed = 0;          /* (C++ aggregate initializers that stop before it: 0, without -Wextra's warning) */
#else
    int32_t packed;              /* 1: INT4 routed experts in moe_quant's packed layout (src/model/cuda/moe_quant.h) */
#endif
} kdt_dlin;

/* Bytes of one row of `K` quantized values, and of the scales of `rows` such rows. */
static inline size_t kdt_wfmt_row_bytes(kdt_wfmt f, int64_t K) {
    return f == KDT_WFMT_FP8 ? (size_t)K : f == KDT_WFMT_INT4 ? (size_t)K / 2 : 0;
}
static inline size_t kdt_wfmt_scale_bytes(kdt_wfmt f, int64_t rows, int64_t K) {
    if (f == KDT_WFMT_FP8) return (size_t)((rows + 127) / 128) * (size_t)((K + 127) / 128) * 4;
    return f == KDT_WFMT_INT4 ? (size_t)rows * (size_t)(K / 32) * 2 : 0;
}
/* Rows of part p of w. */
static inline int32_t kdt_dlin_rows(const kdt_dlin *w, int p) { return w->parts == 1 ? w->N : p ? w->N - w->N0 : w->N0; }

typedef struct kdt_mlp_dw {
    kdt_dlin gate_up;            /* [2I, hidden]: gate rows, then up rows */
    kdt_dlin down;               /* [hidden, I] */
    int32_t inter;               /* I; 0: absent */
} kdt_mlp_dw;

typedef struct kdt_layer_dw {
    float *attn_norm, *ffn_norm;               /* [hidden] */
    float *q_a_norm;                           /* [q_lora] */
    float *kv_a_norm;                          /* [kv_lora] */
    kdt_dlin attn_in;                          /* [Wa, hidden]: q_a (q_proj when q_lora_rank is 0) rows, then kv_a rows */
    kdt_dlin q_b;                              /* [H * (nope + rope), q_lora] */
    void *kv_b;                                /* [H * (nope + v), kv_lora], the model's dtype (per-head GEMMs) */
    kdt_dlin o;                                /* [hidden, H * v] */
    int is_moe;
    kdt_mlp_dw dense, shared;
    float *router;                             /* [E, hidden] */
    float *router_bias;                        /* [E] */
    kdt_dlin exp_gate_up;                      /* E x [2I, hidden] */
    kdt_dlin exp_down;                         /* E x [hidden, I] */
} kdt_layer_dw;

struct kdt_cuda_ctx;                           /* cuBLAS handle and scratch (src/model/cuda/forward.cu) */

struct kdt_model {
    kdt_model_config cfg;
    kdt_backend backend;
    kdt_dtype dtype;                           /* compute dtype: f32 or bf16 (emulated on the CPU: see kdt_forward_cpu) */
    /* CPU backend (host f32; on CUDA only while a piece is being uploaded). */
    const float *embed;                        /* [vocab, hidden] */
    const float *final_norm;                   /* [hidden] */
    const float *lm_head;                      /* [vocab, hidden]; the embedding when tied */
    kdt_layer_w *layers;                       /* [num_hidden_layers] */
    float *inv_freq;                           /* [rope / 2] */
    void **allocs;                             /* every host buffer the model owns */
    size_t n_allocs, cap_allocs;
    /* CUDA backend (device memory). */
    void *d_embed;                             /* [vocab, hidden] dtype */
    void *d_lm_head;                           /* [vocab, hidden] dtype; d_embed when tied */
    float *d_final_norm;                       /* [hidden] */
    float *d_inv_freq;                         /* [rope / 2] */
    kdt_layer_dw *dlayers;                     /* [num_hidden_layers] */
    void *d_deq;                               /* bf16 [deq_elems]: a quantized matrix dequantized for prefill-sized GEMMs */
    size_t deq_elems;                          /* the largest quantized matrix's N x K; d_deq is made by the first forward */
    void **dallocs;                            /* every device buffer the model owns */
    size_t n_dallocs, cap_dallocs;
    struct kdt_cuda_ctx *ctx;                  /* made by the first CUDA forward */
    /* Tests only (NULL otherwise): the CPU forward lowers probe_router_margin[r] to row r's
     * smallest router margin over the MoE layers (route_margin in forward_cpu.c), which shows
     * whether an expert choice that another backend made differently was a near-tie. */
    float *probe_router_margin;                /* [rows of the next forward] */
    uint32_t flags;                            /* KDT_MODEL_MOE_DEVICE, KDT_MODEL_GRAPHS, KDT_MODEL_GEMV */
    const float *mtp_enorm, *mtp_hnorm;        /* MTP model (kdt_model_load_mtp): [hidden] each; NULL otherwise */
    const float *mtp_eh;                       /* [hidden, 2 * hidden] */
    float *d_mtp_enorm, *d_mtp_hnorm;          /* CUDA MTP model: [hidden] each */
    void *d_mtp_eh;                            /* [hidden, 2 * hidden] dtype */
    int32_t n_hid_layers;                      /* kdt_model_set_hidden_layers; 0: hidden is the final norm's output */
    int32_t hid_layers[KDT_MODEL_MAX_HIDDEN_LAYERS];
    /* Expert parallel (ep.c): the communicator of a model loaded on more than one rank (NULL
     * otherwise) and this rank's routed experts [e_lo, e_lo + e_n), the ones exp_gate, exp_up and
     * exp_down hold (every expert without a communicator). */
    kdt_comm *comm;
    int32_t e_lo, e_n;
};

struct kdt_cache {
    const kdt_model *model;
    int32_t max_requests, max_len, NB, MB, Dqk;
    float **pool;                              /* CPU: [layers] of [NB, BS, Dqk] */
    void **dpool;                              /* CUDA: [layers] of [NB, BS, Dqk], the model's dtype */
    int32_t *block_table;                      /* [max_requests, MB], -1 where unused */
    int32_t *kv_len;                           /* [max_requests] */
    int32_t *d_block_table, *d_kv_len;         /* CUDA: device copies of the two, brought up to date by kdt_cache_layer */
    int dev_stale;                             /* CUDA: the host changed them since */
    int32_t *d_commit;                         /* CUDA: scratch of kdt_cache_commit */
    int32_t *free_blocks;                      /* stack of free block ids */
    int32_t n_free;
};

/* Model lifetime helpers (model.c). dtype: KDT_F32 or KDT_BF16 (emulated on the CPU). */
kdt_status kdt_model_alloc(kdt_model **out, const kdt_model_config *cfg, kdt_backend backend, kdt_dtype dtype);
float     *kdt_model_buf(kdt_model *m, size_t n_floats);   /* owned by m, zeroed; NULL on OOM */
void       kdt_model_release_bufs(kdt_model *m, size_t from); /* frees the host buffers made since n_allocs was `from` */
kdt_status kdt_model_finish(kdt_model *m);                  /* rope tables after the weights */
int        kdt_layer_is_moe(const kdt_model_config *c, int32_t layer);

/* The CUDA backend's weights (device.c). The upload functions copy host f32 weights (as the
 * loader and the built-in model make them) to the device in the model's dtype and layout; the
 * caller then releases the host copies. */
kdt_status kdt_model_dbuf(kdt_model *m, size_t nbytes, void **out); /* device memory owned by m */
kdt_status kdt_model_upload_top(kdt_model *m);              /* embedding, final norm, LM head */
kdt_status kdt_model_upload_layer(kdt_model *m, int32_t layer);
kdt_status kdt_model_upload_mtp(kdt_model *m);              /* an MTP model's enorm, hnorm, eh_proj */
void       kdt_model_free_device(kdt_model *m);
/* A CUDA model of config cfg (finished: kdt_config_finish) with random weights made on the
 * device: uniform, scale 1 / sqrt(fan_in), norms near 1, as the built-in model. For benchmarks
 * at real dims, no files. */
kdt_status kdt_model_random_cuda(const kdt_model_config *cfg, uint64_t seed, kdt_dtype dtype, kdt_model **out);
/* The same with the routed experts in format `experts` and the other linears (not kv_b, the
 * embedding, the LM head) in `others`; dtype KDT_BF16 where either is quantized. Quantized
 * weights: random codes (FP8 below 2 in magnitude, INT4 any nibble) and scales that give the
 * same spread as the dense ones. */
kdt_status kdt_model_random_cuda_q(const kdt_model_config *cfg, uint64_t seed, kdt_dtype dtype, kdt_wfmt experts,
                                   kdt_wfmt others, kdt_model **out);
/* Device bytes of w (its n matrices, all parts, scales included; dense ones in dtype dt), and
 * what bf16 would take. */
size_t     kdt_dlin_bytes(const kdt_dlin *w, kdt_dtype dt);
size_t     kdt_dlin_bf16_bytes(const kdt_dlin *w);
/* Device bytes of layer l's weights by part: [0] attention, [1] routed experts, [2] shared
 * experts, [3] dense MLP; as held (now) and as bf16 would hold them (bf16). */
void       kdt_model_layer_bytes(const kdt_model *m, int32_t l, size_t now[4], size_t bf16[4]);

/* Config checks shared by the loader and the built-in model (config.c). */
kdt_status kdt_config_finish(kdt_model_config *c, const char *what);

/* The CPU forward (forward_cpu.c). The batch is validated and the cache has room. A model of
 * dtype KDT_BF16 emulates the CUDA backend's bf16: f32 arithmetic, with the weight matrices
 * (kdt_round_weights_bf16, by kdt_model_finish) and the activations rounded to bf16 where the
 * CUDA backend stores them in bf16. */
kdt_status kdt_forward_cpu(kdt_model *m, kdt_cache *c, const kdt_batch *b, const int32_t *start,
                           const int32_t *positions, float *logits, float *hidden);
void       kdt_round_weights_bf16(kdt_model *m);

#ifdef __cplusplus
}
#endif
