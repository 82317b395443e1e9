/* The DFlash drafter (docs/spec.md, "DFlash"), CPU backend, f32.
 *
 * Context: every token in the target's cache contributes one context row, the concatenation of
 * the target's residual streams after the checkpoint's target_layer_ids, projected by fc and
 * normed by hidden_norm. Each draft layer attends to the context through its own k_proj / v_proj
 * of that row (k_norm, rope at the token's position), which depends on nothing else, so observe
 * turns each new context row into per-layer keys and values once and keeps them per slot.
 * Propose: the block [root, mask, ..., mask] (block_size rows, positions root_pos ..) goes
 * through the layers; its queries see every context key and every block key (no causal mask);
 * rows 1 .. D of the final norm, through the target's LM head, give depth d's logits.
 * On CUDA the same runs on the device (cuda/dflash.cu): observe hands it the kept rows' indices
 * into the target's device hidden states, propose the roots and context lengths. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "spec/dflash.h"
#include "spec/internal.h"

typedef struct dflash {
    dfl_model *m;
    const float *embed, *lm_head;   /* the target's, [V, hid] each (backend memory, its dtype on CUDA) */
    kdt_dtype dt;                   /* the target's */
    kdt_draft_setup set;
    dfl_dev *dev;                   /* CUDA: the device forward */
    int32_t *o_rows, *o_slot, *o_pos, *o_root; /* CUDA: observe's and propose's index lists [slots * max_len] */
    float *kc, *vc;                 /* [slots, L, max_len, KV * hd] context keys (normed, roped) and values */
    int32_t *ctx_len;               /* [slots] context rows held */
    /* Scratch for one block of bs rows. */
    float *x, *h, *q, *k, *v, *att, *o, *g, *u, *p, *logits, *ctx;
} dflash;

/* y [R, out] = x [R, in] @ W^T, W [out, in]. */
static void linear(const float *x, int64_t R, int32_t in, const float *W, int32_t out, float *y) {
    for (int64_t r = 0; r < R; r++)
        for (int32_t o = 0; o < out; o++) {
            const float *w = W + (int64_t)o * in, *xr = x + r * in;
            float acc = 0.0f;
            for (int32_t i = 0; i < in; i++) acc += w[i] * xr[i];
            y[r * out + o] = acc;
        }
}

/* y [n] = x / rms(x) * w; in place allowed. */
static void rms_norm(const float *x, const float *w, int32_t n, float eps, float *y) {
    float ss = 0.0f;
    for (int32_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int32_t i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

/* Per head of x [heads, hd]: the head norm, then rope at pos (rotate-half layout, Qwen3's). */
static void norm_rope(const dfl_model *m, float *x, int32_t heads, const float *w, int32_t pos) {
    const int32_t hd = m->c.hd, half = hd / 2;
    for (int32_t h = 0; h < heads; h++) {
        float *e = x + (int64_t)h * hd;
        rms_norm(e, w, hd, m->c.eps, e);
        for (int32_t i = 0; i < half; i++) {
            const float f = (float)pos * m->inv_freq[i], c = cosf(f), s = sinf(f), a = e[i], b = e[i + half];
            e[i] = a * c - b * s;
            e[i + half] = b * c + a * s;
        }
    }
}

static float *cache_at(const dflash *d, float *base, int32_t slot, int32_t l, int32_t pos) {
    const dfl_config *c = &d->m->c;
    return base + (((int64_t)slot * c->L + l) * d->set.max_len + pos) * c->KV * c->hd;
}

/* Appends one context row (feat [nT * hid]) at the slot's next position. */
static kdt_status push_ctx(dflash *d, int32_t slot, const float *feat) {
    const dfl_model *m = d->m;
    const dfl_config *c = &m->c;
    const int32_t pos = d->ctx_len[slot];
    if (pos >= d->set.max_len) return kdt_fail(KDT_ERR_INVALID_ARG, "dflash drafter: request %d's context passes max_len %d", slot, d->set.max_len);
    linear(feat, 1, c->nT * c->hid, m->fc, c->hid, d->ctx);
    rms_norm(d->ctx, m->hidden_norm, c->hid, c->eps, d->ctx);
    for (int32_t l = 0; l < c->L; l++) {
        float *k = cache_at(d, d->kc, slot, l, pos), *v = cache_at(d, d->vc, slot, l, pos);
        linear(d->ctx, 1, c->hid, m->layers[l].k, c->KV * c->hd, k);
        linear(d->ctx, 1, c->hid, m->layers[l].v, c->KV * c->hd, v);
        norm_rope(m, k, c->KV, m->layers[l].k_norm, pos);
    }
    d->ctx_len[slot] = pos + 1;
    return KDT_OK;
}

/* One block through layer l: d->x [bs, hid] updated in place; n context rows of the slot. */
static void layer(dflash *d, int32_t l, int32_t slot, int32_t n, int32_t pos0) {
    const dfl_model *m = d->m;
    const dfl_config *c = &m->c;
    const dfl_layer *w = &m->layers[l];
    const int32_t bs = c->bs, hid = c->hid, hd = c->hd, kvd = c->KV * hd, qd = c->H * hd, grp = c->H / c->KV;
    for (int32_t r = 0; r < bs; r++) rms_norm(d->x + (int64_t)r * hid, w->in_norm, hid, c->eps, d->h + (int64_t)r * hid);
    linear(d->h, bs, hid, w->q, qd, d->q);
    linear(d->h, bs, hid, w->k, kvd, d->k);
    linear(d->h, bs, hid, w->v, kvd, d->v);
    for (int32_t r = 0; r < bs; r++) {
        norm_rope(m, d->q + (int64_t)r * qd, c->H, w->q_norm, pos0 + r);
        norm_rope(m, d->k + (int64_t)r * kvd, c->KV, w->k_norm, pos0 + r);
    }
    const float scale = 1.0f / sqrtf((float)hd);
    const float *kc = cache_at(d, d->kc, slot, l, 0), *vc = cache_at(d, d->vc, slot, l, 0);
    for (int32_t r = 0; r < bs; r++)
        for (int32_t hh = 0; hh < c->H; hh++) {
            const float *qv = d->q + (int64_t)r * qd + (int64_t)hh * hd;
            const int64_t g = (int64_t)(hh / grp) * hd;
            float mx = -INFINITY;
            for (int32_t j = 0; j < n + bs; j++) { /* keys: the context, then the block */
                const float *kv = j < n ? kc + (int64_t)j * kvd + g : d->k + (int64_t)(j - n) * kvd + g;
                float dot = 0.0f;
                for (int32_t i = 0; i < hd; i++) dot += qv[i] * kv[i];
                d->p[j] = dot * scale;
                if (d->p[j] > mx) mx = d->p[j];
            }
            float sum = 0.0f;
            for (int32_t j = 0; j < n + bs; j++) sum += (d->p[j] = expf(d->p[j] - mx));
            float *out = d->att + (int64_t)r * qd + (int64_t)hh * hd;
            memset(out, 0, (size_t)hd * sizeof *out);
            for (int32_t j = 0; j < n + bs; j++) {
                const float *vv = j < n ? vc + (int64_t)j * kvd + g : d->v + (int64_t)(j - n) * kvd + g, pj = d->p[j] / sum;
                for (int32_t i = 0; i < hd; i++) out[i] += pj * vv[i];
            }
        }
    linear(d->att, bs, qd, w->o, hid, d->o);
    for (int64_t i = 0; i < (int64_t)bs * hid; i++) d->x[i] += d->o[i];
    for (int32_t r = 0; r < bs; r++) rms_norm(d->x + (int64_t)r * hid, w->post_norm, hid, c->eps, d->h + (int64_t)r * hid);
    linear(d->h, bs, hid, w->gate, c->I, d->g);
    linear(d->h, bs, hid, w->up, c->I, d->u);
    for (int64_t i = 0; i < (int64_t)bs * c->I; i++) d->g[i] = d->g[i] / (1.0f + expf(-d->g[i])) * d->u[i];
    linear(d->g, bs, c->I, w->down, hid, d->o);
    for (int64_t i = 0; i < (int64_t)bs * hid; i++) d->x[i] += d->o[i];
}

static void release(dflash *d) {
    float **bufs[] = {&d->kc, &d->vc, &d->x, &d->h, &d->q, &d->k, &d->v, &d->att, &d->o, &d->g, &d->u, &d->p, &d->logits, &d->ctx};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) { free(*bufs[i]); *bufs[i] = NULL; }
    free(d->ctx_len);
    free(d->o_rows); free(d->o_slot); free(d->o_pos); free(d->o_root);
    d->ctx_len = d->o_rows = d->o_slot = d->o_pos = d->o_root = NULL;
    dfl_dev_free(d->dev);
    d->dev = NULL;
}

/* CUDA: the device forward and the host index lists. */
static kdt_status begin_cuda(dflash *d, const kdt_draft_setup *set) {
    const size_t n = (size_t)set->slots * set->max_len;
    d->ctx_len = calloc((size_t)set->slots, sizeof *d->ctx_len);
    d->o_rows = malloc(n * sizeof(int32_t));
    d->o_slot = malloc(n * sizeof(int32_t));
    d->o_pos = malloc(n * sizeof(int32_t));
    d->o_root = malloc((size_t)set->slots * sizeof(int32_t));
    kdt_status s = d->ctx_len && d->o_rows && d->o_slot && d->o_pos && d->o_root
                       ? dfl_dev_create(d->m, NULL, 0, d->embed, d->lm_head, d->dt, set->slots, set->max_len, set->D, &d->dev)
                       : kdt_fail(KDT_ERR_NOMEM, "dflash drafter: out of memory for %d slots", set->slots);
    if (s != KDT_OK) release(d);
    return s;
}

static kdt_status dflash_begin(void *state, const kdt_draft_setup *set) {
    dflash *d = state;
    const dfl_config *c = &d->m->c;
    release(d);
    d->set = *set;
    /* A request's context can pass prompt + max_new: its last step accepts up to D + 1 tokens, and the
     * loop observes them all. */
    d->set.max_len = set->max_len + set->D + 1;
    set = &d->set;
    if (set->D > c->bs - 1)
        return kdt_fail(KDT_ERR_INVALID_ARG, "dflash drafter: depth %d exceeds block_size - 1 = %d", set->D, c->bs - 1);
    if (set->vocab_size != c->V || set->hidden_size != c->hid)
        return kdt_fail(KDT_ERR_INVALID_ARG, "dflash drafter: vocab_size %d / hidden_size %d differ from the target's %d / %d", c->V, c->hid,
                        set->vocab_size, set->hidden_size);
    if (set->backend == KDT_BACKEND_CUDA) return begin_cuda(d, set);
    const size_t S = (size_t)set->slots, bs = (size_t)c->bs, kv = S * c->L * set->max_len * c->KV * c->hd;
    d->kc = malloc(kv * sizeof(float));
    d->vc = malloc(kv * sizeof(float));
    d->ctx_len = calloc(S, sizeof *d->ctx_len);
    d->x = malloc(bs * c->hid * sizeof(float));
    d->h = malloc(bs * c->hid * sizeof(float));
    d->o = malloc(bs * c->hid * sizeof(float));
    d->q = malloc(bs * c->H * c->hd * sizeof(float));
    d->att = malloc(bs * c->H * c->hd * sizeof(float));
    d->k = malloc(bs * c->KV * c->hd * sizeof(float));
    d->v = malloc(bs * c->KV * c->hd * sizeof(float));
    d->g = malloc(bs * c->I * sizeof(float));
    d->u = malloc(bs * c->I * sizeof(float));
    d->p = malloc(((size_t)set->max_len + bs) * sizeof(float));
    d->logits = malloc(bs * c->V * sizeof(float));
    d->ctx = malloc((size_t)c->hid * sizeof(float));
    if (!d->kc || !d->vc || !d->ctx_len || !d->x || !d->h || !d->o || !d->q || !d->att || !d->k || !d->v || !d->g || !d->u || !d->p ||
        !d->logits || !d->ctx) {
        release(d);
        return kdt_fail(KDT_ERR_NOMEM, "dflash drafter: out of memory for %d slots of %d context rows", set->slots, set->max_len);
    }
    return KDT_OK;
}

static kdt_status dflash_propose(void *state, const kdt_draft_ctx *ctx, float *scores, int32_t *tokens) {
    dflash *d = state;
    const dfl_config *c = &d->m->c;
    const int32_t D = d->set.D, K = d->set.K, hid = c->hid;
    for (int32_t b = 0; b < ctx->B; b++) {
        const int32_t slot = ctx->slot[b], pos0 = ctx->hist_len[b] - 1, n = d->ctx_len[slot];
        if (n != pos0)
            return kdt_fail(KDT_ERR_INVALID_ARG, "dflash drafter: request %d has %d context rows for a root at position %d", slot, n, pos0);
        if (d->dev) { /* the lists for the device; it drafts every request at once */
            d->o_root[b] = ctx->history[b][pos0];
            d->o_pos[b] = n;
            continue;
        }
        for (int32_t r = 0; r < c->bs; r++) {
            const float *e = d->embed + (int64_t)(r == 0 ? ctx->history[b][pos0] : c->mask) * hid;
            for (int32_t i = 0; i < hid; i++) d->x[(int64_t)r * hid + i] = e[i] * c->emb_scale;
        }
        for (int32_t l = 0; l < c->L; l++) layer(d, l, slot, n, pos0);
        for (int32_t r = 1; r <= D; r++) rms_norm(d->x + (int64_t)r * hid, d->m->norm, hid, c->eps, d->h + (int64_t)(r - 1) * hid);
        linear(d->h, D, hid, d->lm_head, c->V, d->logits);
        if (c->out_mult != 1.0f)
            for (int64_t i = 0; i < (int64_t)D * c->V; i++) d->logits[i] *= c->out_mult;
        kdt_spec_topk_host(d->logits, D, c->V, K, scores + (int64_t)b * D * K, tokens + (int64_t)b * D * K, K);
    }
    return d->dev ? dfl_dev_propose(d->dev, ctx->B, ctx->slot, d->o_root, d->o_pos, K, scores, tokens, d->set.stream) : KDT_OK;
}

static kdt_status dflash_observe(void *state, const kdt_draft_ctx *ctx, const kdt_draft_feedback *fb) {
    dflash *d = state;
    const int64_t w = (int64_t)d->m->c.nT * d->m->c.hid;
    if (!fb->hidden) return kdt_fail(KDT_ERR_INVALID_ARG, "dflash drafter: observe without hidden states");
    int32_t n = 0;
    for (int32_t b = 0; b < ctx->B; b++) {
        const int32_t slot = ctx->slot[b], rows = fb->prefill ? fb->n_rows[b] : fb->accept_len[b] + 1;
        if (fb->prefill) d->ctx_len[slot] = 0;
        if (d->ctx_len[slot] + rows > d->set.max_len)
            return kdt_fail(KDT_ERR_INVALID_ARG, "dflash drafter: request %d's context passes max_len %d", slot, d->set.max_len);
        for (int32_t i = 0; i < rows; i++) {
            const int32_t row = fb->row_start[b] + (fb->prefill ? i : fb->accept_index[(int64_t)b * fb->Q + i]);
            if (d->dev) { /* listed here, run on the device below */
                d->o_rows[n] = row, d->o_slot[n] = slot, d->o_pos[n++] = d->ctx_len[slot]++;
                continue;
            }
            kdt_status s = push_ctx(d, slot, fb->hidden + row * w);
            if (s != KDT_OK) return s;
        }
    }
    return d->dev && n ? dfl_dev_observe(d->dev, n, fb->hidden, d->o_rows, d->o_slot, d->o_pos, d->set.stream) : KDT_OK;
}

static void dflash_destroy(void *state) {
    dflash *d = state;
    if (!d) return;
    release(d);
    dfl_model_free(d->m);
    free(d);
}

kdt_status kdt_drafter_dflash(kdt_model *target, const char *dir, kdt_drafter **out) {
    if (!target || !dir || !out) return kdt_fail(KDT_ERR_INVALID_ARG, "dflash drafter: NULL argument");
    *out = NULL;
    const kdt_model_config *tc = kdt_model_get_config(target);
    dflash *d = calloc(1, sizeof *d);
    kdt_drafter *dr = calloc(1, sizeof *dr);
    kdt_status s = !d || !dr ? kdt_fail(KDT_ERR_NOMEM, "dflash drafter: out of memory") : KDT_OK;
    if (s == KDT_OK) s = kdt_model_embeddings(target, (const void **)&d->embed, (const void **)&d->lm_head);
    if (s == KDT_OK) d->dt = kdt_model_dtype(target);
    if (s == KDT_OK) s = dfl_model_load(dir, &d->m);
    if (s == KDT_OK && (d->m->c.hid != tc->hidden_size || d->m->c.V != tc->vocab_size))
        s = kdt_fail(KDT_ERR_INVALID_ARG, "dflash drafter: %s has hidden_size %d, vocab_size %d; the target %d, %d", dir, d->m->c.hid,
                     d->m->c.V, tc->hidden_size, tc->vocab_size);
    for (int32_t i = 0; s == KDT_OK && i < d->m->c.nT; i++)
        if (d->m->c.target_layers[i] >= tc->num_hidden_layers)
            s = kdt_fail(KDT_ERR_INVALID_ARG, "dflash drafter: target_layer_ids[%d] = %d, the target has %d layers", i,
                         d->m->c.target_layers[i], tc->num_hidden_layers);
    if (s != KDT_OK) {
        if (d) dfl_model_free(d->m);
        free(d);
        free(dr);
        return s;
    }
    *dr = (kdt_drafter){.name = "dflash", .state = d, .wants_hidden = 1, .n_hidden_layers = d->m->c.nT,
                        .hidden_layers = d->m->c.target_layers, .begin = dflash_begin, .propose = dflash_propose,
                        .observe = dflash_observe, .destroy = dflash_destroy};
    *out = dr;
    return KDT_OK;
}
