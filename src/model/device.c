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

/* ---- linears (kdt_dlin) ---- */

size_t kdt_dlin_bytes(const kdt_dlin *d, kdt_dtype dt) {
    if (d->fmt == KDT_WFMT_DENSE) return kdt_dlin_bf16_bytes(d) / 2 * kdt_dtype_size(dt);
    size_t b = 0;
    for (int p = 0; p < d->parts; p++)
        b += (size_t)kdt_dlin_rows(d, p) * kdt_wfmt_row_bytes(d->fmt, d->K) + kdt_wfmt_scale_bytes(d->fmt, kdt_dlin_rows(d, p), d->K);
    return b * (size_t)d->n;
}

size_t kdt_dlin_bf16_bytes(const kdt_dlin *d) { return (size_t)d->n * (size_t)d->N * (size_t)d->K * 2; }

/* n matrices of N0 + N1 rows (N1 = 0: one matrix, no stack) and K columns in format f: the device
 * buffers, two parts where FP8 blocks cannot span the stack. */
static kdt_status lin_alloc(kdt_model *m, kdt_dlin *d, kdt_wfmt f, int32_t n, int32_t N0, int32_t N1, int32_t K) {
    *d = (kdt_dlin){.fmt = f, .N = N0 + N1, .K = K, .n = n, .parts = 1, .N0 = N0 + N1};
    if (f == KDT_WFMT_DENSE) return dnew(m, (size_t)n * d->N * K, m->dtype, &d->w[0]);
    if (f == KDT_WFMT_FP8 && N1 && N0 % 128) d->parts = 2, d->N0 = N0;
    if ((size_t)d->N * K > m->deq_elems) m->deq_elems = (size_t)d->N * K;
    kdt_status s = KDT_OK;
    for (int p = 0; p < d->parts && s == KDT_OK; p++) {
        const int32_t r = kdt_dlin_rows(d, p);
        s = kdt_model_dbuf(m, (size_t)n * r * kdt_wfmt_row_bytes(f, K), &d->w[p]);
        if (s == KDT_OK) s = kdt_model_dbuf(m, (size_t)n * kdt_wfmt_scale_bytes(f, r, K), &d->scale[p]);
    }
    return s;
}

/* Where matrix e of a linear comes from on the host: f32 rows (a: N0 rows, then b: N1 rows, at
 * e * rows * K) or the checkpoint's quantized pieces (qa, qb at e * qs). */
typedef struct lsrc {
    const float *a, *b;
    const kdt_qsrc *qa, *qb;
    size_t qs;
} lsrc;

/* One quantized piece of `rows` rows into part p of matrix e, after `at` rows of that part. */
static kdt_status put_q(const kdt_dlin *d, int p, int64_t e, int32_t at, const kdt_qsrc *q, int32_t rows) {
    const int32_t pr = kdt_dlin_rows(d, p);
    const size_t rb = kdt_wfmt_row_bytes(d->fmt, d->K);
    kdt_status s = kdt_dev_h2d((char *)d->w[p] + ((size_t)e * pr + at) * rb, q->w, (size_t)rows * rb);
    if (s != KDT_OK) return s;
    /* the scales of the rows before: FP8's `at` is a multiple of 128 (else the piece has a part of its own) */
    const size_t sb = kdt_wfmt_scale_bytes(d->fmt, pr, d->K), so = kdt_wfmt_scale_bytes(d->fmt, at, d->K);
    return kdt_dev_h2d((char *)d->scale[p] + e * sb + so, q->scale, kdt_wfmt_scale_bytes(d->fmt, rows, d->K));
}

static kdt_status upload_lin(kdt_model *m, kdt_dlin *d, int32_t n, int32_t N0, int32_t N1, int32_t K, lsrc src) {
    kdt_status s = lin_alloc(m, d, src.qa ? src.qa->fmt : KDT_WFMT_DENSE, n, N0, N1, K);
    const size_t NK = (size_t)d->N * K;
    for (int64_t e = 0; e < n && s == KDT_OK; e++) {
        if (d->fmt == KDT_WFMT_DENSE) {
            s = put(d->w[0], m->dtype, e * NK, src.a + e * (size_t)N0 * K, (size_t)N0 * K);
            if (s == KDT_OK && N1) s = put(d->w[0], m->dtype, e * NK + (size_t)N0 * K, src.b + e * (size_t)N1 * K, (size_t)N1 * K);
            continue;
        }
        s = put_q(d, 0, e, 0, src.qa + e * src.qs, N0);
        if (s == KDT_OK && N1) s = d->parts == 2 ? put_q(d, 1, e, 0, src.qb + e * src.qs, N1) : put_q(d, 0, e, N0, src.qb + e * src.qs, N1);
    }
    return s;
}

/* The source of one linear: its f32 weight, or its quantized pieces. */
static lsrc one(const float *w, const kdt_qsrc *q) { return (lsrc){w, NULL, q->fmt ? q : NULL, NULL, 1}; }
static lsrc pair(const float *a, const kdt_qsrc *qa, const float *b, const kdt_qsrc *qb) {
    return (lsrc){a, b, qa->fmt ? qa : NULL, qa->fmt ? qb : NULL, 1};
}

/* gate and up stacked [2I, hidden], and down. */
static kdt_status upload_mlp(kdt_model *m, const kdt_mlp_w *w, kdt_mlp_dw *d) {
    const int32_t I = w->inter, hid = m->cfg.hidden_size;
    d->inter = w->inter;
    kdt_status s = upload_lin(m, &d->gate_up, 1, I, I, hid, pair(w->gate, &w->gate_q, w->up, &w->up_q));
    return s == KDT_OK ? upload_lin(m, &d->down, 1, hid, 0, I, one(w->down, &w->down_q)) : s;
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
    if (s == KDT_OK && ql) s = upload_lin(m, &d->q_b, 1, (int32_t)(H * qk), 0, (int32_t)ql, one(w->q_b, &w->q_b_q));
    if (s == KDT_OK)
        s = upload_lin(m, &d->attn_in, 1, (int32_t)qw, (int32_t)Dqk, (int32_t)hid,
                       ql ? pair(w->q_a, &w->q_a_q, w->kv_a, &w->kv_a_q) : pair(w->q_proj, &w->q_proj_q, w->kv_a, &w->kv_a_q));
    if (s == KDT_OK) s = copy(m, w->kv_b, H * (nope + vd) * Dv, dt, &d->kv_b);
    if (s == KDT_OK) s = upload_lin(m, &d->o, 1, (int32_t)hid, 0, (int32_t)(H * vd), one(w->o, &w->o_q));
    d->is_moe = w->is_moe;
    if (s == KDT_OK && !w->is_moe) s = upload_mlp(m, &w->dense, &d->dense);
    if (s == KDT_OK && w->is_moe) {
        const int32_t E = c->n_routed_experts, I = c->moe_intermediate_size;
        const kdt_qsrc *q = w->exp_q;
        s = copy_vec(m, w->router, (size_t)E * hid, &d->router);
        if (s == KDT_OK) s = copy_vec(m, w->router_bias, (size_t)E, &d->router_bias);
        if (s == KDT_OK)
            s = upload_lin(m, &d->exp_gate_up, E, I, I, (int32_t)hid, (lsrc){w->exp_gate, w->exp_up, q, q ? q + 1 : NULL, 3});
        if (s == KDT_OK) s = upload_lin(m, &d->exp_down, E, (int32_t)hid, 0, I, (lsrc){w->exp_down, NULL, q ? q + 2 : NULL, NULL, 3});
        if (s == KDT_OK) s = kdt_cuda_pack_experts(&d->exp_gate_up, &d->exp_down); /* INT4: the grouped kernel's layout */
        if (s == KDT_OK && w->shared.inter) s = upload_mlp(m, &w->shared, &d->shared);
    }
    memset(&m->layers[l], 0, sizeof m->layers[l]); /* the host copies are the caller's to release */
    return s;
}

/* ---- random weights ---- */

typedef struct rnd {
    kdt_model *m;
    uint64_t seed, n;            /* n: tensors made so far, so that each has its own stream */
    kdt_wfmt experts, others;    /* formats of the routed experts and of the other linears */
} rnd;

static uint64_t next_seed(rnd *r) { return r->seed * 0x9E3779B97F4A7C15ull + ++r->n; }

static kdt_status rand_t(rnd *r, size_t n, kdt_dtype dt, float center, float scale, void **out) {
    kdt_status s = dnew(r->m, n, dt, out);
    return s == KDT_OK ? kdt_cuda_fill_uniform(*out, dt, n, next_seed(r), center, scale) : s;
}

static kdt_status rand_w(rnd *r, size_t n, size_t fan_in, void **out) {
    return rand_t(r, n, r->m->dtype, 0.0f, 1.0f / sqrtf((float)fan_in), out);
}

static kdt_status rand_norm(rnd *r, size_t n, float **out) { return rand_t(r, n, KDT_F32, 1.0f, 0.1f, (void **)out); }

/* n random matrices [N0 + N1, K] in format f. Quantized: FP8 codes with the top exponent bit
 * clear (|v| < 2, no NaN) times scales near 1 / sqrt(K); INT4 nibbles times scales near
 * 1 / (8 sqrt(K)). */
static kdt_status rand_lin(rnd *r, kdt_dlin *d, kdt_wfmt f, int32_t n, int32_t N0, int32_t N1, int32_t K) {
    if (f == KDT_WFMT_DENSE) {
        *d = (kdt_dlin){.fmt = f, .N = N0 + N1, .K = K, .n = n, .parts = 1, .N0 = N0 + N1};
        return rand_w(r, (size_t)n * d->N * K, (size_t)K, &d->w[0]);
    }
    kdt_status s = lin_alloc(r->m, d, f, n, N0, N1, K);
    const float sc = (f == KDT_WFMT_FP8 ? 1.0f : 0.125f) / sqrtf((float)K);
    for (int p = 0; p < d->parts && s == KDT_OK; p++) {
        const int32_t rows = kdt_dlin_rows(d, p);
        s = kdt_cuda_fill_codes(d->w[p], (size_t)n * rows * kdt_wfmt_row_bytes(f, K), next_seed(r), f == KDT_WFMT_FP8 ? 0xBF : 0xFF);
        if (s == KDT_OK)
            s = kdt_cuda_fill_uniform(d->scale[p], f == KDT_WFMT_FP8 ? KDT_F32 : KDT_BF16,
                                      (size_t)n * kdt_wfmt_scale_bytes(f, rows, K) / (f == KDT_WFMT_FP8 ? 4 : 2), next_seed(r), sc, sc / 4);
    }
    return s;
}

static kdt_status rand_mlp(rnd *r, int32_t inter, kdt_mlp_dw *d) {
    const int32_t hid = r->m->cfg.hidden_size;
    d->inter = inter;
    kdt_status s = rand_lin(r, &d->gate_up, r->others, 1, inter, inter, hid);
    return s == KDT_OK ? rand_lin(r, &d->down, r->others, 1, hid, 0, inter) : s;
}

static kdt_status rand_layer(rnd *r, int32_t l) {
    const kdt_model_config *c = &r->m->cfg;
    kdt_layer_dw *d = &r->m->dlayers[l];
    const int32_t hid = c->hidden_size, H = c->num_attention_heads, ql = c->q_lora_rank;
    const int32_t qk = c->qk_nope_head_dim + c->qk_rope_head_dim, Dv = c->kv_lora_rank;
    const int32_t Dqk = Dv + c->qk_rope_head_dim, vd = c->v_head_dim, nope = c->qk_nope_head_dim;
    const kdt_wfmt f = r->others;
    kdt_status s = rand_norm(r, (size_t)hid, &d->attn_norm);
    if (s == KDT_OK) s = rand_norm(r, (size_t)hid, &d->ffn_norm);
    if (s == KDT_OK) s = rand_norm(r, (size_t)Dv, &d->kv_a_norm);
    if (s == KDT_OK && ql) s = rand_norm(r, (size_t)ql, &d->q_a_norm);
    if (s == KDT_OK && ql) s = rand_lin(r, &d->q_b, f, 1, H * qk, 0, ql);
    if (s == KDT_OK) s = rand_lin(r, &d->attn_in, f, 1, ql ? ql : H * qk, Dqk, hid);
    if (s == KDT_OK) s = rand_w(r, (size_t)H * (nope + vd) * Dv, (size_t)Dv, &d->kv_b);
    if (s == KDT_OK) s = rand_lin(r, &d->o, f, 1, hid, 0, H * vd);
    d->is_moe = kdt_layer_is_moe(c, l);
    if (s != KDT_OK || !d->is_moe) return s == KDT_OK ? rand_mlp(r, c->intermediate_size, &d->dense) : s;
    const int32_t E = c->n_routed_experts, I = c->moe_intermediate_size;
    s = rand_t(r, (size_t)E * hid, KDT_F32, 0.0f, 1.0f / sqrtf((float)hid), (void **)&d->router);
    if (s == KDT_OK) s = rand_t(r, (size_t)E, KDT_F32, 0.0f, 0.05f, (void **)&d->router_bias);
    if (s == KDT_OK) s = rand_lin(r, &d->exp_gate_up, r->experts, E, I, I, hid);
    if (s == KDT_OK) s = rand_lin(r, &d->exp_down, r->experts, E, hid, 0, I);
    if (s == KDT_OK) s = kdt_cuda_pack_experts(&d->exp_gate_up, &d->exp_down); /* as the upload packs them */
    if (s == KDT_OK && c->n_shared_experts) s = rand_mlp(r, c->moe_intermediate_size * c->n_shared_experts, &d->shared);
    return s;
}

kdt_status kdt_model_random_cuda_q(const kdt_model_config *cfg, uint64_t seed, kdt_dtype dtype, kdt_wfmt experts, kdt_wfmt others,
                                   kdt_model **out) {
    if (!out || !cfg) return kdt_fail(KDT_ERR_INVALID_ARG, "model_random: cfg or out is NULL");
    *out = NULL;
    if ((experts || others) && dtype != KDT_BF16)
        return kdt_fail(KDT_ERR_UNSUPPORTED, "model_random: quantized weights need a bf16 model, not %s", kdt_dtype_name(dtype));
    kdt_model *m;
    kdt_status s = kdt_model_alloc(&m, cfg, KDT_BACKEND_CUDA, dtype);
    if (s != KDT_OK) return s;
    rnd r = {.m = m, .seed = seed, .experts = experts, .others = others};
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

kdt_status kdt_model_random_cuda(const kdt_model_config *cfg, uint64_t seed, kdt_dtype dtype, kdt_model **out) {
    return kdt_model_random_cuda_q(cfg, seed, dtype, KDT_WFMT_DENSE, KDT_WFMT_DENSE, out);
}

void kdt_model_layer_bytes(const kdt_model *m, int32_t l, size_t now[4], size_t bf16[4]) {
    const kdt_layer_dw *d = &m->dlayers[l];
    const kdt_model_config *c = &m->cfg;
    const size_t es = kdt_dtype_size(m->dtype), kv_b = (size_t)c->num_attention_heads * (c->qk_nope_head_dim + c->v_head_dim) *
                                                       (size_t)c->kv_lora_rank;
    const kdt_dlin *parts[4][3] = {{&d->attn_in, &d->q_b, &d->o}, {&d->exp_gate_up, &d->exp_down, NULL},
                                   {&d->shared.gate_up, &d->shared.down, NULL}, {&d->dense.gate_up, &d->dense.down, NULL}};
    for (int i = 0; i < 4; i++) {
        now[i] = i ? 0 : kv_b * es;
        bf16[i] = i ? 0 : kv_b * 2;
        for (int j = 0; j < 3 && parts[i][j]; j++) {
            now[i] += kdt_dlin_bytes(parts[i][j], m->dtype);
            bf16[i] += kdt_dlin_bf16_bytes(parts[i][j]);
        }
    }
}
