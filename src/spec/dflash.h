/* The DFlash draft model (z-lab's DFlashDraftModel) on the host in f32: its checkpoint
 * (dflash_load.c) and the drafter over it (dflash.c). docs/spec.md, "DFlash". */
#pragma once

#include "kdt/spec.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DFL_MAX_ALLOCS (11 * 256 + 3) /* tensors of the most layers the config allows */

typedef struct dfl_config {
    int32_t hid, L, H, KV, hd, I, V;   /* hidden, layers, query heads, KV heads, head dim, MLP, vocabulary */
    int32_t bs, mask;                  /* block_size, mask_token_id */
    int32_t nT, target_layers[KDT_MODEL_MAX_HIDDEN_LAYERS];
    float eps, emb_scale, out_mult;    /* rms_norm_eps, input_embedding_scale, output_multiplier */
    double theta;                      /* rope_theta */
} dfl_config;

typedef struct dfl_layer {
    float *in_norm, *post_norm;        /* [hid] */
    float *q, *o;                      /* [H * hd, hid], [hid, H * hd] */
    float *k, *v;                      /* [KV * hd, hid] */
    float *q_norm, *k_norm;            /* [hd] */
    float *gate, *up, *down;           /* [I, hid], [I, hid], [hid, I] */
} dfl_layer;

typedef struct dfl_model {
    dfl_config c;
    float *fc;                         /* [hid, nT * hid] */
    float *hidden_norm, *norm;         /* [hid] */
    dfl_layer *layers;                 /* [L] */
    float *inv_freq;                   /* [hd / 2] */
    void **allocs;                     /* every tensor, freed with the model */
    size_t n_allocs;
} dfl_model;

kdt_status dfl_model_load(const char *dir, dfl_model **out);
void dfl_model_free(dfl_model *m);

/* The drafter's forward on CUDA (cuda/dflash.cu; stubs in no_cuda.c): the weights on the device
 * in dtype dt (the target's), matrices stacked per layer ([q; k; v] and [gate; up]), cuBLAS GEMMs
 * with f32 accumulation, the residual stream and the context keys and values in f32. */
typedef struct dfl_dev dfl_dev;

/* From the host weights of m, or with m NULL random weights of config c (seed; for benchmarks).
 * embed, lm_head [V, hid] (device, dt) are the target's. Room for slots requests of max_len context
 * rows, blocks of at most D <= bs - 1 drafted rows. */
kdt_status dfl_dev_create(const dfl_model *m, const dfl_config *c, uint64_t seed, const void *embed, const void *lm_head,
                          kdt_dtype dt, int32_t slots, int32_t max_len, int32_t D, dfl_dev **out);
void       dfl_dev_free(dfl_dev *g);
/* n new context rows: row i is row rows[i] of hidden [*, nT * hid] (device f32), for slot[i] at
 * position pos[i] (host arrays [n]). */
kdt_status dfl_dev_observe(dfl_dev *g, int32_t n, const float *hidden, const int32_t *rows, const int32_t *slot,
                           const int32_t *pos, void *stream);
/* B blocks [root[b], mask, ...] at positions n_ctx[b] .., over the first n_ctx[b] context rows of
 * slot[b] (host arrays [B]); scores, tokens [B, D, K] (device) as the drafter interface wants. */
kdt_status dfl_dev_propose(dfl_dev *g, int32_t B, const int32_t *slot, const int32_t *root, const int32_t *n_ctx, int32_t K,
                           float *scores, int32_t *tokens, void *stream);

#ifdef __cplusplus
}
#endif
