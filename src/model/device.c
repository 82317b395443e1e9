/* The CUDA backend's weights: device buffers owned by the model, host f32 weights uploaded in the
 * model's dtype (bf16 rounded to nearest even; bf16 checkpoints come back bit for bit) into the
 * stacked layouts of kdt_layer_dw, and random weights made on the device for benchmarks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/device.h"
#include "common/internal.h"
#include "model/cuda.h"

#define STAGE_ELEMS ((size_t)1 << 20) /* bf16 conversion goes through a host buffer of this many */

kdt_status kdt_model_dbuf(kdt_model *m, size_t nbytes, void **out) {
    *out = NULL;
    if (m->n_dallocs == m->cap_dallocs) {
        const size_t cap = m->cap_dallocs ? 2 * m->cap_dallocs : 64;
        void **g = realloc(m->dallocs, cap * sizeof *g);
        if (!g) return kdt_fail(KDT_ERR_NOMEM, "model: out of memory");
        m->dallocs = g;
        m->cap_dallocs = cap;
    }
    kdt_status s = kdt_dev_alloc(out, nbytes);
    if (s == KDT_OK) m->dallocs[m->n_dallocs++] = *out;
    return s;
}

void kdt_model_free_device(kdt_model *m) {
    for (size_t i = 0; i < m->n_dallocs; i++) kdt_dev_free(m->dallocs[i]);
    free(m->dallocs);
    m->dallocs = NULL;
    m->n_dallocs = m->cap_dallocs = 0;
}

static uint16_t bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0; /* NaN */
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* n host floats into dst (device, dtype) from element `off` on. */
static kdt_status put(void *dst, kdt_dtype dt, size_t off, const float *src, size_t n) {
    if (dt == KDT_F32) return kdt_dev_h2d((float *)dst + off, src, n * sizeof(float));
    uint16_t *tmp = malloc((n < STAGE_ELEMS ? n : STAGE_ELEMS) * sizeof *tmp + 1);
    if (!tmp) return kdt_fail(KDT_ERR_NOMEM, "model: out of memory staging weights");
    kdt_status s = KDT_OK;
    for (size_t i = 0; i < n && s == KDT_OK; i += STAGE_ELEMS) {
        const size_t k = n - i < STAGE_ELEMS ? n - i : STAGE_ELEMS;
        for (size_t j = 0; j < k; j++) tmp[j] = bf16_bits(src[i + j]);
        s = kdt_dev_h2d((uint16_t *)dst + off + i, tmp, k * sizeof *tmp);
    }
    free(tmp);
    return s;
}

/* A new device tensor of n elements of dtype dt. */
static kdt_status dnew(kdt_model *m, size_t n, kdt_dtype dt, void **out) {
    return kdt_model_dbuf(m, n * kdt_dtype_size(dt), out);
}

/* A device copy of n host floats, in dtype dt. */
static kdt_status copy(kdt_model *m, const float *src, size_t n, kdt_dtype dt, void **out) {
    kdt_status s = dnew(m, n, dt, out);
    return s == KDT_OK ? put(*out, dt, 0, src, n) : s;
}

static kdt_status copy_vec(kdt_model *m, const float *src, size_t n, float **out) {
    return copy(m, src, n, KDT_F32, (void **)out);
}

/* gate and up stacked [2I, hidden], and down. */
static kdt_status upload_mlp(kdt_model *m, const kdt_mlp_w *w, kdt_mlp_dw *d) {
    const size_t I = (size_t)w->inter, hid = (size_t)m->cfg.hidden_size;
    d->inter = w->inter;
    kdt_status s = dnew(m, 2 * I * hid, m->dtype, &d->gate_up);
    if (s == KDT_OK) s = put(d->gate_up, m->dtype, 0, w->gate, I * hid);
    if (s == KDT_OK) s = put(d->gate_up, m->dtype, I * hid, w->up, I * hid);
    if (s == KDT_OK) s = copy(m, w->down, hid * I, m->dtype, &d->down);
    return s;
}

kdt_status kdt_model_upload_top(kdt_model *m) {
    const size_t V = (size_t)m->cfg.vocab_size, hid = (size_t)m->cfg.hidden_size;
    kdt_status s = copy(m, m->embed, V * hid, m->dtype, &m->d_embed);
    if (s == KDT_OK) s = copy_vec(m, m->final_norm, hid, &m->d_final_norm);
    if (s == KDT_OK && m->lm_head == m->embed) m->d_lm_head = m->d_embed;
    else if (s == KDT_OK) s = copy(m, m->lm_head, V * hid, m->dtype, &m->d_lm_head);
    m->embed = m->final_norm = m->lm_head = NULL; /* the host copies are the caller's to release */
    return s;
}

kdt_status kdt_model_upload_mtp(kdt_model *m) {
    const size_t hid = (size_t)m->cfg.hidden_size;
    kdt_status s = copy_vec(m, m->mtp_enorm, hid, &m->d_mtp_enorm);
    if (s == KDT_OK) s = copy_vec(m, m->mtp_hnorm, hid, &m->d_mtp_hnorm);
    if (s == KDT_OK) s = copy(m, m->mtp_eh, hid * 2 * hid, m->dtype, &m->d_mtp_eh);
    m->mtp_enorm = m->mtp_hnorm = m->mtp_eh = NULL; /* the host copies are the caller's to release */
    return s;
}

kdt_status kdt_model_upload_layer(kdt_model *m, int32_t l) {
    const kdt_model_config *c = &m->cfg;
    const kdt_layer_w *w = &m->layers[l];
    kdt_layer_dw *d = &m->dlayers[l];
    const kdt_dtype dt = m->dtype;
    const size_t hid = (size_t)c->hidden_size, H = (size_t)c->num_attention_heads, ql = (size_t)c->q_lora_rank;
    const size_t qk = (size_t)(c->qk_nope_head_dim + c->qk_rope_head_dim), Dv = (size_t)c->kv_lora_rank;
    const size_t Dqk = Dv + (size_t)c->qk_rope_head_dim, vd = (size_t)c->v_head_dim, nope = (size_t)c->qk_nope_head_dim;
    const size_t qw = ql ? ql : H * qk; /* rows of the query projection that reads the hidden state */
    kdt_status s = copy_vec(m, w->attn_norm, hid, &d->attn_norm);
    if (s == KDT_OK) s = copy_vec(m, w->ffn_norm, hid, &d->ffn_norm);
    if (s == KDT_OK) s = copy_vec(m, w->kv_a_norm, Dv, &d->kv_a_norm);
    if (s == KDT_OK && ql) s = copy_vec(m, w->q_a_norm, ql, &d->q_a_norm);
    if (s == KDT_OK && ql) s = copy(m, w->q_b, H * qk * ql, dt, &d->q_b);
    if (s == KDT_OK) s = dnew(m, (qw + Dqk) * hid, dt, &d->attn_in);
    if (s == KDT_OK) s = put(d->attn_in, dt, 0, ql ? w->q_a : w->q_proj, qw * hid);
    if (s == KDT_OK) s = put(d->attn_in, dt, qw * hid, w->kv_a, Dqk * hid);
    if (s == KDT_OK) s = copy(m, w->kv_b, H * (nope + vd) * Dv, dt, &d->kv_b);
    if (s == KDT_OK) s = copy(m, w->o, hid * H * vd, dt, &d->o);
    d->is_moe = w->is_moe;
    if (s == KDT_OK && !w->is_moe) s = upload_mlp(m, &w->dense, &d->dense);
    if (s == KDT_OK && w->is_moe) {
        const size_t E = (size_t)c->n_routed_experts, I = (size_t)c->moe_intermediate_size;
        s = copy_vec(m, w->router, E * hid, &d->router);
        if (s == KDT_OK) s = copy_vec(m, w->router_bias, E, &d->router_bias);
        if (s == KDT_OK) s = dnew(m, E * 2 * I * hid, dt, &d->exp_gate_up);
        for (size_t e = 0; e < E && s == KDT_OK; e++) {
            s = put(d->exp_gate_up, dt, e * 2 * I * hid, w->exp_gate + e * I * hid, I * hid);
            if (s == KDT_OK) s = put(d->exp_gate_up, dt, (e * 2 + 1) * I * hid, w->exp_up + e * I * hid, I * hid);
        }
        if (s == KDT_OK) s = copy(m, w->exp_down, E * hid * I, dt, &d->exp_down);
        if (s == KDT_OK && w->shared.inter) s = upload_mlp(m, &w->shared, &d->shared);
    }
    memset(&m->layers[l], 0, sizeof m->layers[l]); /* the host copies are the caller's to release */
    return s;
}

/* ---- random weights ---- */

typedef struct rnd {
    kdt_model *m;
    uint64_t seed, n;            /* n: tensors made so far, so that each has its own stream */
} rnd;

static kdt_status rand_t(rnd *r, size_t n, kdt_dtype dt, float center, float scale, void **out) {
    kdt_status s = dnew(r->m, n, dt, out);
    return s == KDT_OK ? kdt_cuda_fill_uniform(*out, dt, n, r->seed * 0x9E3779B97F4A7C15ull + ++r->n, center, scale) : s;
}

static kdt_status rand_w(rnd *r, size_t n, size_t fan_in, void **out) {
    return rand_t(r, n, r->m->dtype, 0.0f, 1.0f / sqrtf((float)fan_in), out);
}

static kdt_status rand_norm(rnd *r, size_t n, float **out) { return rand_t(r, n, KDT_F32, 1.0f, 0.1f, (void **)out); }

static kdt_status rand_mlp(rnd *r, int32_t inter, kdt_mlp_dw *d) {
    const size_t I = (size_t)inter, hid = (size_t)r->m->cfg.hidden_size;
    d->inter = inter;
    kdt_status s = rand_w(r, 2 * I * hid, hid, &d->gate_up);
    return s == KDT_OK ? rand_w(r, hid * I, I, &d->down) : s;
}

static kdt_status rand_layer(rnd *r, int32_t l) {
    const kdt_model_config *c = &r->m->cfg;
    kdt_layer_dw *d = &r->m->dlayers[l];
    const size_t hid = (size_t)c->hidden_size, H = (size_t)c->num_attention_heads, ql = (size_t)c->q_lora_rank;
    const size_t qk = (size_t)(c->qk_nope_head_dim + c->qk_rope_head_dim), Dv = (size_t)c->kv_lora_rank;
    const size_t Dqk = Dv + (size_t)c->qk_rope_head_dim, vd = (size_t)c->v_head_dim, nope = (size_t)c->qk_nope_head_dim;
    kdt_status s = rand_norm(r, hid, &d->attn_norm);
    if (s == KDT_OK) s = rand_norm(r, hid, &d->ffn_norm);
    if (s == KDT_OK) s = rand_norm(r, Dv, &d->kv_a_norm);
    if (s == KDT_OK && ql) s = rand_norm(r, ql, &d->q_a_norm);
    if (s == KDT_OK && ql) s = rand_w(r, H * qk * ql, ql, &d->q_b);
    if (s == KDT_OK) s = rand_w(r, ((ql ? ql : H * qk) + Dqk) * hid, hid, &d->attn_in);
    if (s == KDT_OK) s = rand_w(r, H * (nope + vd) * Dv, Dv, &d->kv_b);
    if (s == KDT_OK) s = rand_w(r, hid * H * vd, H * vd, &d->o);
    d->is_moe = kdt_layer_is_moe(c, l);
    if (s != KDT_OK || !d->is_moe) return s == KDT_OK ? rand_mlp(r, c->intermediate_size, &d->dense) : s;
    const size_t E = (size_t)c->n_routed_experts, I = (size_t)c->moe_intermediate_size;
    s = rand_t(r, E * hid, KDT_F32, 0.0f, 1.0f / sqrtf((float)hid), (void **)&d->router);
    if (s == KDT_OK) s = rand_t(r, E, KDT_F32, 0.0f, 0.05f, (void **)&d->router_bias);
    if (s == KDT_OK) s = rand_w(r, E * 2 * I * hid, hid, &d->exp_gate_up);
    if (s == KDT_OK) s = rand_w(r, E * hid * I, I, &d->exp_down);
    if (s == KDT_OK && c->n_shared_experts) s = rand_mlp(r, c->moe_intermediate_size * c->n_shared_experts, &d->shared);
    return s;
}

kdt_status kdt_model_random_cuda(const kdt_model_config *cfg, uint64_t seed, kdt_dtype dtype, kdt_model **out) {
    if (!out || !cfg) return kdt_fail(KDT_ERR_INVALID_ARG, "model_random: cfg or out is NULL");
    *out = NULL;
    kdt_model *m;
    kdt_status s = kdt_model_alloc(&m, cfg, KDT_BACKEND_CUDA, dtype);
    if (s != KDT_OK) return s;
    rnd r = {.m = m, .seed = seed};
    const size_t V = (size_t)cfg->vocab_size, hid = (size_t)cfg->hidden_size;
    s = rand_t(&r, V * hid, dtype, 0.0f, 1.0f, &m->d_embed);
    if (s == KDT_OK) s = rand_norm(&r, hid, &m->d_final_norm);
    if (s == KDT_OK && cfg->tie_word_embeddings) m->d_lm_head = m->d_embed;
    else if (s == KDT_OK) s = rand_t(&r, V * hid, dtype, 0.0f, 2.0f / sqrtf((float)hid), &m->d_lm_head);
    for (int32_t l = 0; l < cfg->num_hidden_layers && s == KDT_OK; l++) s = rand_layer(&r, l);
    if (s == KDT_OK) s = kdt_model_finish(m); /* also waits for the fills */
    if (s != KDT_OK) { kdt_model_free(m); return s; }
    *out = m;
    return KDT_OK;
}
