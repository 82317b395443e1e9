/* The DFlash draft model (z-lab's DFlashDraftModel) on the host in f32: its checkpoint
 * (dflash_load.c) and the drafter over it (dflash.c). docs/spec.md, "DFlash". */
#pragma once

#include "kdt/spec.h"

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
