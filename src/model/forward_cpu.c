/* The CPU forward in f32, the reference: each step written as transformers' DeepseekV3 computes
 * it, except attention, which runs in absorbed form through kdt_verify_attn over the paged
 * latent cache. A model of dtype bf16 also rounds to bf16 what the CUDA backend stores in bf16
 * (src/model/cuda/forward.cu): the weight matrices, the inputs of the projections, the latent
 * cache rows, the absorbed queries and the attention outputs; the reference of the CUDA bf16 path. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "kdt/ops.h"
#include "model/ep.h"

/* The q_a and kv_a norms are built with transformers' default eps, not rms_norm_eps. */
#define LORA_NORM_EPS 1e-6f

/* y[r, o] = x[r, :] . W[o, :] for R rows: x [R, in], W [out, in], y [R, out]. Four rows share
 * each pass over a weight row. */
static void linear(const float *x, int64_t R, int32_t in, const float *W, int32_t out, float *y) {
    int64_t r = 0;
    for (; r + 4 <= R; r += 4) {
        const float *x0 = x + r * in, *x1 = x0 + in, *x2 = x1 + in, *x3 = x2 + in;
        for (int32_t o = 0; o < out; o++) {
            const float *w = W + (int64_t)o * in;
            float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
            for (int32_t i = 0; i < in; i++) {
                a0 += x0[i] * w[i];
                a1 += x1[i] * w[i];
                a2 += x2[i] * w[i];
                a3 += x3[i] * w[i];
            }
            y[r * out + o] = a0;
            y[(r + 1) * out + o] = a1;
            y[(r + 2) * out + o] = a2;
            y[(r + 3) * out + o] = a3;
        }
    }
    for (; r < R; r++)
        for (int32_t o = 0; o < out; o++) {
            const float *xr = x + r * in, *w = W + (int64_t)o * in;
            float a = 0;
            for (int32_t i = 0; i < in; i++) a += xr[i] * w[i];
            y[r * out + o] = a;
        }
}

/* y = w * x / sqrt(mean(x^2) + eps) over n, for one row (y may be x). */
static void rms_norm(const float *x, const float *w, int32_t n, float eps, float *y) {
    double ss = 0;
    for (int32_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const float inv = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int32_t i = 0; i < n; i++) y[i] = w[i] * (x[i] * inv);
}

static float silu(float x) { return x / (1.0f + expf(-x)); }

/* x rounded to the nearest bf16, ties to even, in place (NaN stays NaN). */
static void round_bf16(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        if ((u & 0x7FFFFFFFu) > 0x7F800000u) continue;
        u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
        memcpy(&x[i], &u, 4);
    }
}

static void round_w(const float *w, int64_t n) {
    if (w) round_bf16((float *)w, n); /* the model's own buffers (kdt_model_buf), made writable */
}

static void round_mlp(const kdt_mlp_w *p, int64_t hid) {
    round_w(p->gate, (int64_t)p->inter * hid);
    round_w(p->up, (int64_t)p->inter * hid);
    round_w(p->down, (int64_t)p->inter * hid);
}

/* The matrices the CUDA backend holds in bf16; norms, the router and its bias stay f32. */
void kdt_round_weights_bf16(kdt_model *m) {
    const kdt_model_config *c = &m->cfg;
    const int64_t hid = c->hidden_size, H = c->num_attention_heads, qk = c->qk_nope_head_dim + c->qk_rope_head_dim;
    const int64_t Dv = c->kv_lora_rank, Dqk = Dv + c->qk_rope_head_dim, I = c->moe_intermediate_size;
    const int64_t E = m->e_n; /* the experts this rank holds */
    round_w(m->embed, (int64_t)c->vocab_size * hid);
    if (m->lm_head != m->embed) round_w(m->lm_head, (int64_t)c->vocab_size * hid);
    for (int32_t l = 0; l < c->num_hidden_layers; l++) {
        const kdt_layer_w *L = &m->layers[l];
        round_w(L->q_a, (int64_t)c->q_lora_rank * hid);
        round_w(L->q_b, H * qk * c->q_lora_rank);
        round_w(L->q_proj, H * qk * hid);
        round_w(L->kv_a, Dqk * hid);
        round_w(L->kv_b, H * (c->qk_nope_head_dim + c->v_head_dim) * Dv);
        round_w(L->o, hid * H * c->v_head_dim);
        if (!L->is_moe) {
            round_mlp(&L->dense, hid);
            continue;
        }
        round_w(L->exp_gate, E * I * hid);
        round_w(L->exp_up, E * I * hid);
        round_w(L->exp_down, E * I * hid);
        if (L->shared.inter) round_mlp(&L->shared, hid);
    }
}

/* Rope of one d-dim vector (d = 2 * half), in place. Interleaved input pairs (x[2i], x[2i+1])
 * (rope_interleave) or split ones (x[i], x[i + half]); either way the output holds the pairs'
 * rotated first elements, then their second elements, as transformers writes them. */
static void rope(float *x, int32_t half, const float *cs, const float *sn, int interleave, float *tmp) {
    for (int32_t i = 0; i < half; i++) {
        const float a = interleave ? x[2 * i] : x[i], b = interleave ? x[2 * i + 1] : x[i + half];
        tmp[i] = a * cs[i] - b * sn[i];
        tmp[i + half] = b * cs[i] + a * sn[i];
    }
    memcpy(x, tmp, (size_t)2 * half * sizeof *x);
}

/* Scratch of one forward, sized for R rows. */
typedef struct ws {
    float *x, *h, *q, *qa, *ckv, *qabs, *olat, *lse, *ov, *tmp, *cs, *sn;
    float *hb;                   /* [R, hidden] h rounded to bf16 (bf16 models) */
    uint8_t *causal;             /* [q_len, q_len] the causal mask of one chunk */
    uint8_t *gsel;               /* [n_group] groups kept by the router */
    /* MoE */
    float *gate_w;               /* [R, topk] */
    int32_t *gate_i;             /* [R, topk] */
    float *slots;                /* [R * topk, hidden] each choice's expert output times its weight */
    float *ge, *ue, *ye;         /* MLP activations [R, I] and output [R, hidden] */
} ws;

static void ws_free(ws *w) {
    free(w->x); free(w->h); free(w->hb); free(w->q); free(w->qa); free(w->ckv); free(w->qabs); free(w->olat);
    free(w->lse); free(w->ov); free(w->tmp); free(w->cs); free(w->sn); free(w->causal); free(w->gsel); free(w->gate_w); free(w->gate_i);
    free(w->slots); free(w->ge); free(w->ue); free(w->ye);
}

static kdt_status ws_alloc(ws *w, const kdt_model_config *c, int64_t R) {
    memset(w, 0, sizeof *w);
    const int64_t H = c->num_attention_heads, qk = c->qk_nope_head_dim + c->qk_rope_head_dim;
    const int64_t Dqk = c->kv_lora_rank + c->qk_rope_head_dim;
    int64_t inter = c->intermediate_size > c->moe_intermediate_size ? c->intermediate_size : c->moe_intermediate_size;
    if ((int64_t)c->moe_intermediate_size * c->n_shared_experts > inter) inter = (int64_t)c->moe_intermediate_size * c->n_shared_experts;
    int64_t widest = c->hidden_size;
    const int64_t cands[] = {H * qk, c->q_lora_rank, Dqk, H * c->v_head_dim, inter, c->n_routed_experts};
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) widest = cands[i] > widest ? cands[i] : widest;
    const int64_t topk = c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1;
    w->x = malloc((size_t)(R * c->hidden_size) * sizeof(float));
    w->h = malloc((size_t)(R * c->hidden_size) * sizeof(float));
    w->hb = malloc((size_t)(R * c->hidden_size) * sizeof(float));
    w->q = malloc((size_t)(R * H * qk) * sizeof(float));
    w->qa = malloc((size_t)(R * (c->q_lora_rank + 1)) * sizeof(float));
    w->ckv = malloc((size_t)(R * Dqk) * sizeof(float));
    w->qabs = malloc((size_t)(R * H * Dqk) * sizeof(float));
    w->olat = malloc((size_t)(R * H * c->kv_lora_rank) * sizeof(float));
    w->lse = malloc((size_t)(R * H) * sizeof(float));
    w->ov = malloc((size_t)(R * H * c->v_head_dim) * sizeof(float));
    w->tmp = malloc((size_t)(2 * widest + 2 * Dqk) * sizeof(float));
    w->cs = malloc((size_t)(R * (c->qk_rope_head_dim / 2)) * sizeof(float));
    w->sn = malloc((size_t)(R * (c->qk_rope_head_dim / 2)) * sizeof(float));
    const int64_t maxq = R < KDT_MODEL_MAX_TREE ? R : KDT_MODEL_MAX_TREE;
    w->causal = malloc((size_t)(maxq * maxq));
    w->gsel = malloc((size_t)c->n_group + 1);
    w->gate_w = malloc((size_t)(R * topk) * sizeof(float));
    w->gate_i = malloc((size_t)(R * topk) * sizeof(int32_t));
    w->slots = malloc((size_t)(R * topk * c->hidden_size) * sizeof(float));
    w->ge = malloc((size_t)(R * inter) * sizeof(float));
    w->ue = malloc((size_t)(R * inter) * sizeof(float));
    w->ye = malloc((size_t)(R * c->hidden_size) * sizeof(float));
    if (!w->x || !w->h || !w->hb || !w->q || !w->qa || !w->ckv || !w->qabs || !w->olat || !w->lse || !w->ov || !w->tmp ||
        !w->cs || !w->sn || !w->causal || !w->gsel || !w->gate_w || !w->gate_i || !w->slots || !w->ge || !w->ue || !w->ye) {
        ws_free(w);
        return kdt_fail(KDT_ERR_NOMEM, "forward: out of memory for %lld rows", (long long)R);
    }
    return KDT_OK;
}

/* cos and sin [R, rope / 2] of each row's position, times the YaRN attention factor. */
static void rope_tables(const kdt_model *m, const int32_t *pos, int64_t R, ws *w) {
    const int32_t half = m->cfg.qk_rope_head_dim / 2;
    const float af = (float)m->cfg.rope_attention_factor;
    for (int64_t r = 0; r < R; r++)
        for (int32_t i = 0; i < half; i++) {
            const float ang = (float)pos[r] * m->inv_freq[i];
            w->cs[r * half + i] = (float)cos((double)ang) * af;
            w->sn[r * half + i] = (float)sin((double)ang) * af;
        }
}

/* MLA attention of layer l over the batch's rows: h [R, hidden] in, w->h out ([R, hidden]). */
static kdt_status attention(const kdt_model *m, kdt_cache *c, int32_t l, const kdt_batch *bt, const int32_t *start, int64_t R,
                            ws *w) {
    const kdt_model_config *cf = &m->cfg;
    const kdt_layer_w *L = &m->layers[l];
    const int32_t H = cf->num_attention_heads, nope = cf->qk_nope_head_dim, rd = cf->qk_rope_head_dim, half = rd / 2;
    const int32_t qk = nope + rd, Dv = cf->kv_lora_rank, Dqk = Dv + rd, vd = cf->v_head_dim, hid = cf->hidden_size;
    const int bf = m->dtype == KDT_BF16;
    /* Queries [R, H, qk] and the compressed KV [R, Dv + rd]. */
    if (cf->q_lora_rank) {
        linear(w->h, R, hid, L->q_a, cf->q_lora_rank, w->qa);
        for (int64_t r = 0; r < R; r++)
            rms_norm(w->qa + r * cf->q_lora_rank, L->q_a_norm, cf->q_lora_rank, LORA_NORM_EPS, w->qa + r * cf->q_lora_rank);
        if (bf) round_bf16(w->qa, R * cf->q_lora_rank);
        linear(w->qa, R, cf->q_lora_rank, L->q_b, H * qk, w->q);
    } else {
        linear(w->h, R, hid, L->q_proj, H * qk, w->q);
    }
    linear(w->h, R, hid, L->kv_a, Dqk, w->ckv);
    /* Latent rows [norm(c_kv), rope(k_rope)] and absorbed queries [q_nope @ W_UK, rope(q_rope)]. */
    for (int64_t r = 0; r < R; r++) {
        float *kv = w->ckv + r * Dqk;
        rms_norm(kv, L->kv_a_norm, Dv, LORA_NORM_EPS, kv);
        rope(kv + Dv, half, w->cs + r * half, w->sn + r * half, cf->rope_interleave, w->tmp);
        if (bf) round_bf16(kv, Dqk);
        for (int32_t hh = 0; hh < H; hh++) {
            float *qh = w->q + (r * H + hh) * qk;
            if (bf) round_bf16(qh, nope);
            const float *wuk = L->kv_b + (int64_t)hh * (nope + vd) * Dv; /* [nope, Dv] */
            float *qa = w->qabs + (r * H + hh) * Dqk;
            for (int32_t j = 0; j < Dv; j++) qa[j] = 0;
            for (int32_t i = 0; i < nope; i++) {
                const float qi = qh[i];
                const float *row = wuk + (int64_t)i * Dv;
                for (int32_t j = 0; j < Dv; j++) qa[j] += qi * row[j];
            }
            memcpy(qa + Dv, qh + nope, (size_t)rd * sizeof(float));
            rope(qa + Dv, half, w->cs + r * half, w->sn + r * half, cf->rope_interleave, w->tmp);
            if (bf) round_bf16(qa, Dqk);
        }
    }
    /* Append the rows to the cache: row i of request b is slot start[b] + i. */
    float *pool = c->pool[l];
    int64_t r = 0;
    for (int32_t b = 0; b < bt->B; b++) {
        const int32_t *table = c->block_table + (size_t)bt->req[b] * c->MB;
        for (int32_t i = 0; i < bt->n_rows[b]; i++, r++) {
            const int32_t slot = start[b] + i;
            float *dst = pool + ((int64_t)table[slot / KDT_CACHE_BLOCK] * KDT_CACHE_BLOCK + slot % KDT_CACHE_BLOCK) * Dqk;
            memcpy(dst, w->ckv + r * Dqk, (size_t)Dqk * sizeof(float));
        }
    }
    /* verify_attn per request: a tree in one call, a chain in causal chunks of at most
     * KDT_MODEL_MAX_TREE rows, each seeing the rows before it. */
    const int64_t maxq = R < KDT_MODEL_MAX_TREE ? R : KDT_MODEL_MAX_TREE;
    r = 0;
    int64_t mask_off = 0;
    for (int32_t b = 0; b < bt->B; b++) {
        const int32_t n = bt->n_rows[b];
        for (int32_t s0 = 0; s0 < n;) {
            const int32_t q_len = bt->tree_mask ? n : (n - s0 < maxq ? n - s0 : (int32_t)maxq);
            const int32_t kv_len = start[b] + s0 + q_len;
            const uint8_t *mask = bt->tree_mask ? bt->tree_mask + mask_off : w->causal;
            if (!bt->tree_mask)
                for (int32_t i = 0; i < q_len; i++)
                    for (int32_t j = 0; j < q_len; j++) w->causal[(int64_t)i * q_len + j] = j <= i;
            kdt_verify_attn_params p = {.B = 1, .Q = q_len, .H = H, .Dv = Dv, .Dr = rd, .dtype = KDT_F32,
                                        .q = w->qabs + (r + s0) * H * Dqk, .kv_cache = pool, .NB = c->NB,
                                        .BS = KDT_CACHE_BLOCK, .block_table = c->block_table + (size_t)bt->req[b] * c->MB,
                                        .MB = c->MB, .kv_len = &kv_len, .tree_mask = mask, .sm_scale = (float)cf->softmax_scale,
                                        .o = w->olat + (r + s0) * H * Dv, .lse = w->lse + (r + s0) * H};
            kdt_status s = kdt_verify_attn(&p, KDT_BACKEND_CPU, NULL);
            if (s != KDT_OK) return s;
            s0 += q_len;
        }
        if (bt->tree_mask) mask_off += (int64_t)n * n;
        r += n;
    }
    /* W_UV per head on the latent output, then o_proj. */
    if (bf) round_bf16(w->olat, R * H * Dv);
    for (r = 0; r < R; r++)
        for (int32_t hh = 0; hh < H; hh++) {
            const float *wuv = L->kv_b + ((int64_t)hh * (nope + vd) + nope) * Dv; /* [vd, Dv] */
            linear(w->olat + (r * H + hh) * Dv, 1, Dv, wuv, vd, w->ov + (r * H + hh) * vd);
        }
    if (bf) round_bf16(w->ov, R * H * vd);
    linear(w->ov, R, H * vd, L->o, hid, w->h);
    return KDT_OK;
}

/* An MLP (dense layer or shared experts): y [R, hidden] = down(silu(gate x) * up x). */
static void mlp(const kdt_mlp_w *p, const float *x, int64_t R, int32_t hid, int bf, ws *w, float *y) {
    linear(x, R, hid, p->gate, p->inter, w->ge);
    linear(x, R, hid, p->up, p->inter, w->ue);
    for (int64_t i = 0; i < R * p->inter; i++) w->ge[i] = silu(w->ge[i]) * w->ue[i];
    if (bf) round_bf16(w->ge, R * p->inter);
    linear(w->ge, R, p->inter, p->down, hid, y);
}

/* How near the router's choice came to another one (tests only, kdt_model.probe_router_margin):
 * the smallest gap, in biased score, between a kept expert and a dropped one of a kept group, and
 * between a kept group's score and a dropped group's. */
static float route_margin(const kdt_model_config *c, const float *choice, const uint8_t *gsel, const int32_t *idx) {
    const int32_t E = c->n_routed_experts, G = c->n_group, per = E / G, K = c->num_experts_per_tok;
    float kept_min = INFINITY, dropped_max = -INFINITY, gkept_min = INFINITY, gdropped_max = -INFINITY;
    for (int32_t e = 0; e < E; e++) {
        int kept = 0;
        for (int32_t k = 0; k < K && !kept; k++) kept = idx[k] == e;
        if (kept) kept_min = fminf(kept_min, choice[e]);
        else if (gsel[e / per]) dropped_max = fmaxf(dropped_max, choice[e]);
    }
    for (int32_t g = 0; g < G; g++) {
        float t1 = -INFINITY, t2 = -INFINITY;
        for (int32_t e = g * per; e < (g + 1) * per; e++) {
            if (choice[e] > t1) { t2 = t1; t1 = choice[e]; }
            else if (choice[e] > t2) t2 = choice[e];
        }
        const float gs = per >= 2 ? t1 + t2 : t1;
        if (gsel[g]) gkept_min = fminf(gkept_min, gs);
        else gdropped_max = fmaxf(gdropped_max, gs);
    }
    return fminf(kept_min - dropped_max, gkept_min - gdropped_max); /* +inf where nothing was dropped */
}

/* Selection as transformers' DeepseekV3TopkRouter: sigmoid scores, plus the correction bias for
 * choosing only; groups ranked by the sum of their two best biased scores; the best topk_group
 * groups kept; the best num_experts_per_tok experts among them; weights are the unbiased scores,
 * normalized when norm_topk_prob, times routed_scaling_factor. Ties go to the lower index.
 * DeepSeek-V2 (DeepseekV2TopkRouter): softmax scores, no bias, every group kept (greedy) or the
 * groups of the best maxima (group_limited_greedy). */
static void route(const kdt_model_config *c, const kdt_layer_w *L, const float *x, float *tmp, uint8_t *gsel, int32_t *idx,
                  float *wt, float *margin) {
    const int32_t E = c->n_routed_experts, G = c->n_group, per = E / G, K = c->num_experts_per_tok;
    float *score = tmp, *choice = tmp + E;
    linear(x, 1, c->hidden_size, L->router, E, score);
    if (c->router_softmax) {
        float mx = -INFINITY, z = 0;
        for (int32_t e = 0; e < E; e++) mx = score[e] > mx ? score[e] : mx;
        for (int32_t e = 0; e < E; e++) z += score[e] = expf(score[e] - mx);
        for (int32_t e = 0; e < E; e++) choice[e] = score[e] /= z;
    } else {
        for (int32_t e = 0; e < E; e++) {
            score[e] = 1.0f / (1.0f + expf(-score[e]));
            choice[e] = score[e] + L->router_bias[e];
        }
    }
    memset(gsel, c->topk_method == KDT_TOPK_GREEDY, (size_t)G);
    for (int32_t kept = 0; kept < c->topk_group && c->topk_method != KDT_TOPK_GREEDY; kept++) {
        int32_t best = -1;
        float best_s = 0;
        for (int32_t g = 0; g < G; g++) {
            if (gsel[g]) continue;
            float t1 = -INFINITY, t2 = -INFINITY;
            for (int32_t e = g * per; e < (g + 1) * per; e++) {
                if (choice[e] > t1) { t2 = t1; t1 = choice[e]; }
                else if (choice[e] > t2) t2 = choice[e];
            }
            const float gs = per >= 2 && c->topk_method == KDT_TOPK_NOAUX_TC ? t1 + t2 : t1;
            if (best < 0 || gs > best_s) { best = g; best_s = gs; }
        }
        gsel[best] = 1;
    }
    float sum = 0;
    for (int32_t k = 0; k < K; k++) {
        int32_t best = -1;
        for (int32_t e = 0; e < E; e++) {
            if (!gsel[e / per]) continue;
            int taken = 0;
            for (int32_t j = 0; j < k && !taken; j++) taken = idx[j] == e;
            if (!taken && (best < 0 || choice[e] > choice[best])) best = e;
        }
        idx[k] = best;
        wt[k] = score[best];
        sum += wt[k];
    }
    for (int32_t k = 0; k < K; k++) {
        if (c->norm_topk_prob) wt[k] /= sum + 1e-20f;
        wt[k] *= c->routed_scaling_factor;
    }
    if (margin) *margin = fminf(*margin, route_margin(c, choice, gsel, idx));
}

kdt_status kdt_moe_experts_cpu(const kdt_model *m, const kdt_layer_w *L, int64_t R, const float *xin, const int32_t *gi,
                               const float *gw, float *slots) {
    const kdt_model_config *c = &m->cfg;
    const int32_t hid = c->hidden_size, I = c->moe_intermediate_size, K = c->num_experts_per_tok;
    ws w = {.ge = malloc((size_t)(R * I) * sizeof(float)), .ue = malloc((size_t)(R * I) * sizeof(float))};
    float *xe = malloc((size_t)(R * hid) * sizeof(float)), *ye = malloc((size_t)(R * hid) * sizeof(float));
    int32_t *rows = malloc((size_t)R * sizeof(int32_t));
    kdt_status s = w.ge && w.ue && xe && ye && rows ? KDT_OK : kdt_fail(KDT_ERR_NOMEM, "forward: out of memory for the experts");
    /* Rows are grouped by expert so each expert's weights are read once per call. */
    for (int32_t e = m->e_lo; s == KDT_OK && e < m->e_lo + m->e_n; e++) {
        int64_t n = 0;
        for (int64_t r = 0; r < R; r++)
            for (int32_t k = 0; k < K; k++)
                if (gi[r * K + k] == e) {
                    rows[n] = (int32_t)(r * K + k);
                    memcpy(xe + n * hid, xin + r * hid, (size_t)hid * sizeof(float));
                    n++;
                }
        if (!n) continue;
        const int64_t le = e - m->e_lo;
        const kdt_mlp_w ex = {.gate = L->exp_gate + le * I * hid, .up = L->exp_up + le * I * hid,
                              .down = L->exp_down + le * hid * I, .inter = I};
        mlp(&ex, xe, n, hid, m->dtype == KDT_BF16, &w, ye);
        for (int64_t j = 0; j < n; j++)
            for (int32_t i = 0; i < hid; i++) slots[(int64_t)rows[j] * hid + i] = ye[j * hid + i] * gw[rows[j]];
    }
    free(w.ge); free(w.ue); free(xe); free(ye); free(rows);
    return s;
}

/* MoE of layer l: the router reads w->h, the experts xin (w->h, or its bf16 rounding) [R, hidden];
 * out added to y [R, hidden], each row's experts in increasing expert order whatever the ranks. */
static kdt_status moe(const kdt_model *m, int32_t l, int64_t R, const float *xin, ws *w, float *y) {
    const kdt_model_config *c = &m->cfg;
    const kdt_layer_w *L = &m->layers[l];
    const int32_t hid = c->hidden_size, K = c->num_experts_per_tok;
    for (int64_t r = 0; r < R; r++)
        route(c, L, w->h + r * hid, w->tmp, w->gsel, w->gate_i + r * K, w->gate_w + r * K,
              m->probe_router_margin ? m->probe_router_margin + r : NULL);
    memset(w->slots, 0, (size_t)(R * K * hid) * sizeof(float));
    kdt_status s = kdt_ep_moe(m, l, R, xin, w->gate_i, w->gate_w, w->slots);
    for (int64_t r = 0; s == KDT_OK && r < R; r++) {
        const int32_t *gi = w->gate_i + r * K;
        for (int32_t done = 0, last = -1; done < K; done++) { /* the next choice by expert id */
            int32_t k = -1;
            for (int32_t j = 0; j < K; j++)
                if (gi[j] > last && (k < 0 || gi[j] < gi[k])) k = j;
            last = gi[k];
            const float *sl = w->slots + (r * K + k) * hid;
            for (int32_t i = 0; i < hid; i++) y[r * hid + i] += sl[i];
        }
    }
    if (s == KDT_OK && L->shared.inter) {
        mlp(&L->shared, xin, R, hid, m->dtype == KDT_BF16, w, w->ye);
        for (int64_t i = 0; i < R * hid; i++) y[i] += w->ye[i];
    }
    return s;
}

/* An MTP model's rows: x [R, hidden] = eh_proj([enorm(x); hnorm(h)]), h [R, hidden]. */
static kdt_status mtp_input(const kdt_model *m, const float *h, int64_t R, ws *w) {
    const int32_t hid = m->cfg.hidden_size;
    float *cat = malloc(2 * (size_t)hid * sizeof *cat);
    if (!cat) return kdt_fail(KDT_ERR_NOMEM, "forward: out of memory");
    for (int64_t r = 0; r < R; r++) {
        rms_norm(w->x + r * hid, m->mtp_enorm, hid, m->cfg.rms_norm_eps, cat);
        rms_norm(h + r * hid, m->mtp_hnorm, hid, m->cfg.rms_norm_eps, cat + hid);
        linear(cat, 1, 2 * hid, m->mtp_eh, hid, w->x + r * hid);
    }
    free(cat);
    return KDT_OK;
}

kdt_status kdt_forward_cpu(kdt_model *m, kdt_cache *c, const kdt_batch *bt, const int32_t *start, const int32_t *pos,
                           float *logits, float *hidden) {
    const kdt_model_config *cf = &m->cfg;
    const int32_t hid = cf->hidden_size;
    const int bf = m->dtype == KDT_BF16;
    int64_t R = 0;
    for (int32_t b = 0; b < bt->B; b++) R += bt->n_rows[b];
    ws w;
    kdt_status s = ws_alloc(&w, cf, R);
    if (s != KDT_OK) return s;
    rope_tables(m, pos, R, &w);
    for (int64_t r = 0; r < R; r++) memcpy(w.x + r * hid, m->embed + (int64_t)bt->tokens[r] * hid, (size_t)hid * sizeof(float));
    if (m->mtp_eh) s = mtp_input(m, bt->mtp_hidden, R, &w);
    for (int32_t l = 0; l < cf->num_hidden_layers && s == KDT_OK; l++) {
        const kdt_layer_w *L = &m->layers[l];
        for (int64_t r = 0; r < R; r++) rms_norm(w.x + r * hid, L->attn_norm, hid, cf->rms_norm_eps, w.h + r * hid);
        if (bf) round_bf16(w.h, R * hid);
        if ((s = attention(m, c, l, bt, start, R, &w)) != KDT_OK) break;
        for (int64_t i = 0; i < R * hid; i++) w.x[i] += w.h[i];
        for (int64_t r = 0; r < R; r++) rms_norm(w.x + r * hid, L->ffn_norm, hid, cf->rms_norm_eps, w.h + r * hid);
        const float *hin = bf ? w.hb : w.h; /* the projections' input; the router reads w.h */
        if (bf) {
            memcpy(w.hb, w.h, (size_t)(R * hid) * sizeof(float));
            round_bf16(w.hb, R * hid);
        }
        if (L->is_moe) {
            if ((s = moe(m, l, R, hin, &w, w.x)) != KDT_OK) break;
        } else {
            mlp(&L->dense, hin, R, hid, bf, &w, w.ye);
            for (int64_t i = 0; i < R * hid; i++) w.x[i] += w.ye[i];
        }
        for (int32_t j = 0; hidden && j < m->n_hid_layers; j++) /* a layer may be asked for twice */
            if (m->hid_layers[j] == l)
                for (int64_t r = 0; r < R; r++)
                    memcpy(hidden + (r * m->n_hid_layers + j) * hid, w.x + r * hid, (size_t)hid * sizeof(float));
    }
    if (s == KDT_OK) {
        for (int64_t r = 0; r < R; r++) rms_norm(w.x + r * hid, m->final_norm, hid, cf->rms_norm_eps, w.h + r * hid);
        if (hidden && m->n_hid_layers == 0) memcpy(hidden, w.h, (size_t)(R * hid) * sizeof(float));
        if (bf) round_bf16(w.h, R * hid);
        if (logits && bt->logits_rows == KDT_LOGITS_ALL) {
            linear(w.h, R, hid, m->lm_head, cf->vocab_size, logits);
        } else if (logits) {
            for (int32_t b = 0, end = 0; b < bt->B; b++) {
                end += bt->n_rows[b];
                linear(w.h + (int64_t)(end - 1) * hid, 1, hid, m->lm_head, cf->vocab_size, logits + (int64_t)b * cf->vocab_size);
            }
        }
    }
    ws_free(&w);
    return s;
}
