/* The model's internal pieces: weights as the CPU backend holds them, the cache, and the
 * functions the files of src/model/ share. */
#pragma once

#include "kdt/model.h"

/* nn.Linear weights are [out, in], row-major, as in the checkpoint. */
typedef struct kdt_mlp_w {
    const float *gate, *up;      /* [I, hidden] */
    const float *down;           /* [hidden, I] */
    int32_t inter;               /* I; 0: absent (no shared experts) */
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
} kdt_layer_w;

struct kdt_model {
    kdt_model_config cfg;
    kdt_backend backend;
    const float *embed;                        /* [vocab, hidden] */
    const float *final_norm;                   /* [hidden] */
    const float *lm_head;                      /* [vocab, hidden]; the embedding when tied */
    kdt_layer_w *layers;                       /* [num_hidden_layers] */
    float *inv_freq;                           /* [rope / 2] */
    void **allocs;                             /* every buffer the model owns */
    size_t n_allocs, cap_allocs;
};

struct kdt_cache {
    const kdt_model *model;
    int32_t max_requests, max_len, NB, MB, Dqk;
    float **pool;                              /* [layers] of [NB, BS, Dqk] */
    int32_t *block_table;                      /* [max_requests, MB], -1 where unused */
    int32_t *kv_len;                           /* [max_requests] */
    int32_t *free_blocks;                      /* stack of free block ids */
    int32_t n_free;
};

/* Model lifetime helpers (model.c). */
kdt_status kdt_model_alloc(kdt_model **out, const kdt_model_config *cfg, kdt_backend backend);
float     *kdt_model_buf(kdt_model *m, size_t n_floats);   /* owned by m, zeroed; NULL on OOM */
kdt_status kdt_model_finish(kdt_model *m);                  /* rope tables after the weights */
int        kdt_layer_is_moe(const kdt_model_config *c, int32_t layer);

/* Config checks shared by the loader and the built-in model (config.c). */
kdt_status kdt_config_finish(kdt_model_config *c, const char *what);

/* The CPU forward (forward_cpu.c). The batch is validated and the cache has room. */
kdt_status kdt_forward_cpu(kdt_model *m, kdt_cache *c, const kdt_batch *b, const int32_t *start,
                           const int32_t *positions, float *logits, float *hidden);
