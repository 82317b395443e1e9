/* The built-in model: Kimi K2's layout scaled down, so `kdt generate` runs with no files.
 * Kimi K2 / this: hidden 7168 / 256, heads 64 / 4, q_lora 1536 / 96, kv_lora 512 / 64, rope 64 /
 * 16, nope 128 / 32, v 128 / 32, a first dense layer then MoE layers (384 / 16 experts, top 8 / 4,
 * one shared expert), sigmoid router with correction bias, YaRN rope, vocab 163840 / 512; here
 * 4 groups with 2 kept, so grouped routing is exercised. Weights are uniform with a per-tensor
 * scale, drawn from splitmix64 in a fixed order: the same seed gives the same model anywhere. */
#include <math.h>

#include "common/internal.h"
#include "model/ep.h"

static uint64_t next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* n values uniform in [center - scale, center + scale). */
static const float *fill(kdt_model *m, uint64_t *rng, size_t n, float center, float scale) {
    float *p = kdt_model_buf(m, n);
    if (!p) return NULL;
    for (size_t i = 0; i < n; i++) p[i] = center + scale * (float)((double)(next(rng) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
    return p;
}

static void builtin_config(kdt_model_config *c) {
    *c = (kdt_model_config){
        .vocab_size = 512, .hidden_size = 256, .num_hidden_layers = 4, .intermediate_size = 512,
        .moe_intermediate_size = 64, .num_attention_heads = 4, .q_lora_rank = 96, .kv_lora_rank = 64,
        .qk_nope_head_dim = 32, .qk_rope_head_dim = 16, .v_head_dim = 32, .n_routed_experts = 16,
        .n_shared_experts = 1, .num_experts_per_tok = 4, .n_group = 4, .topk_group = 2,
        .first_k_dense_replace = 1, .moe_layer_freq = 1, .norm_topk_prob = 1, .tie_word_embeddings = 0,
        .rope_interleave = 1, .max_position_embeddings = 16384, .routed_scaling_factor = 2.827f,
        .rms_norm_eps = 1e-6f, .rope_yarn = 1, .rope_theta = 50000.0, .yarn_factor = 4.0,
        .yarn_beta_fast = 32.0, .yarn_beta_slow = 1.0, .yarn_mscale = 1.0, .yarn_mscale_all_dim = 1.0,
        .yarn_original_max_position_embeddings = 4096, .yarn_truncate = 1};
    /* As config.c resolves YaRN: mscale == mscale_all_dim, so cos/sin keep factor 1 and the
     * softmax scale gains mscale(4, 1)^2. */
    const double ms = 0.1 * log(c->yarn_factor) + 1.0;
    c->rope_attention_factor = 1.0;
    c->softmax_scale = ms * ms / sqrt((double)(c->qk_nope_head_dim + c->qk_rope_head_dim));
}

kdt_status kdt_model_builtin(uint64_t seed, kdt_backend backend, kdt_model **out) {
    return kdt_model_builtin_as(seed, backend, backend == KDT_BACKEND_CUDA ? KDT_BF16 : KDT_F32, out);
}

kdt_status kdt_model_builtin_as(uint64_t seed, kdt_backend backend, kdt_dtype dtype, kdt_model **out) {
    return kdt_model_builtin_part(seed, backend, dtype, NULL, out);
}

/* The weights are made on the host whatever the backend, so that a seed gives the same model on
 * both; the CUDA backend then uploads them. With comm, every rank makes the whole (small) model
 * and keeps its experts' part in use (ep.c). */
kdt_status kdt_model_builtin_part(uint64_t seed, kdt_backend backend, kdt_dtype dtype, kdt_comm *comm, kdt_model **out) {
    if (!out) return kdt_fail(KDT_ERR_INVALID_ARG, "model_builtin: out is NULL");
    *out = NULL;
    kdt_model_config c;
    builtin_config(&c);
    kdt_status s = kdt_config_finish(&c, "built-in model");
    if (s != KDT_OK) return s;
    kdt_model *m;
    if ((s = kdt_model_alloc(&m, &c, backend, dtype)) != KDT_OK) return s;
    uint64_t rng = seed;
    const size_t V = (size_t)c.vocab_size, hid = (size_t)c.hidden_size, H = (size_t)c.num_attention_heads;
    const size_t qk = (size_t)(c.qk_nope_head_dim + c.qk_rope_head_dim), Dv = (size_t)c.kv_lora_rank;
    const size_t E = (size_t)c.n_routed_experts, I = (size_t)c.moe_intermediate_size;
    /* Scale 1 / sqrt(fan_in) (times 2 for the LM head, so that logits spread over a few units);
     * norm weights near 1. */
#define W(n, fan_in) fill(m, &rng, (n), 0.0f, 1.0f / sqrtf((float)(fan_in)))
#define NORM(n) fill(m, &rng, (n), 1.0f, 0.1f)
    int ok = (m->embed = fill(m, &rng, V * hid, 0.0f, 1.0f)) && (m->final_norm = NORM(hid)) &&
             (m->lm_head = fill(m, &rng, V * hid, 0.0f, 2.0f / sqrtf((float)hid)));
    for (int32_t l = 0; ok && l < c.num_hidden_layers; l++) {
        kdt_layer_w *w = &m->layers[l];
        const size_t ql = (size_t)c.q_lora_rank, rd = (size_t)c.qk_rope_head_dim, vd = (size_t)c.v_head_dim;
        ok = (w->attn_norm = NORM(hid)) && (w->ffn_norm = NORM(hid)) && (w->q_a = W(ql * hid, hid)) &&
             (w->q_a_norm = NORM(ql)) && (w->q_b = W(H * qk * ql, ql)) && (w->kv_a = W((Dv + rd) * hid, hid)) &&
             (w->kv_a_norm = NORM(Dv)) && (w->kv_b = W(H * ((size_t)c.qk_nope_head_dim + vd) * Dv, Dv)) &&
             (w->o = W(hid * H * vd, H * vd));
        w->is_moe = kdt_layer_is_moe(&c, l);
        if (ok && !w->is_moe) {
            const size_t In = (size_t)c.intermediate_size;
            w->dense.inter = c.intermediate_size;
            ok = (w->dense.gate = W(In * hid, hid)) && (w->dense.up = W(In * hid, hid)) && (w->dense.down = W(hid * In, In));
        } else if (ok) {
            const size_t Is = I * (size_t)c.n_shared_experts;
            w->shared.inter = (int32_t)Is;
            ok = (w->router = W(E * hid, hid)) && (w->router_bias = fill(m, &rng, E, 0.0f, 0.05f)) &&
                 (w->exp_gate = W(E * I * hid, hid)) && (w->exp_up = W(E * I * hid, hid)) &&
                 (w->exp_down = W(E * hid * I, I)) && (w->shared.gate = W(Is * hid, hid)) &&
                 (w->shared.up = W(Is * hid, hid)) && (w->shared.down = W(hid * Is, Is));
        }
    }
#undef W
#undef NORM
    if (!ok) s = kdt_fail(KDT_ERR_NOMEM, "built-in model: out of memory");
    kdt_ep_assign(m, comm);
    for (int32_t l = 0; ok && l < c.num_hidden_layers; l++) { /* the views start at this rank's first expert */
        kdt_layer_w *w = &m->layers[l];
        if (!w->is_moe) continue;
        w->exp_gate += (size_t)m->e_lo * I * hid;
        w->exp_up += (size_t)m->e_lo * I * hid;
        w->exp_down += (size_t)m->e_lo * hid * I;
    }
    if (s == KDT_OK && backend == KDT_BACKEND_CUDA) {
        s = kdt_model_upload_top(m);
        for (int32_t l = 0; l < c.num_hidden_layers && s == KDT_OK; l++) s = kdt_model_upload_layer(m, l);
        kdt_model_release_bufs(m, 0);
    }
    if (s == KDT_OK) s = kdt_model_finish(m);
    if (s != KDT_OK) { kdt_model_free(m); return s; }
    *out = m;
    return KDT_OK;
}
