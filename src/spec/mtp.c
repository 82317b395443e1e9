/* The MTP drafter (docs/spec.md, "MTP"): the checkpoint's next-token layer (kdt_model_load_mtp)
 * over its own cache. Its row i pairs the target's final hidden state h_i (which predicted token
 * i + 1) with token i + 1 and predicts token i + 2, so every token the target has cached gives one
 * row once the token after it is known: observe appends them (the prompt at the prefill, the
 * accepted path after a step, the new root's row last) and keeps the last row's logits, which are
 * depth 1 of the next proposal. Depths 2 .. D chain: the row (the MTP's own output state after
 * shared_head.norm, the previous depth's top token) at the next position; those draft rows are
 * dropped from the cache when the proposal is done. On CUDA the same on the device: the target's
 * rows are gathered there, logits and states stay there, and only each depth's top tokens (the
 * next forward's rows) come to the host. */
#include <stdlib.h>
#include <string.h>

#include "common/device.h"
#include "common/internal.h"
#include "spec/internal.h"

typedef struct mtp {
    kdt_model *m;
    int32_t V, hid;
    kdt_draft_setup set;
    int dev;                    /* CUDA: the buffers below but tok, req, n_rows, rows are device memory */
    kdt_cache *cache;
    float *last_logits;         /* [slots, V] the last real row's logits: depth 1 */
    float *last_h;              /* [slots, hid] its output state */
    int32_t *tok, *req, *n_rows; /* [slots * max_len], [slots], [slots]: one forward's rows (host) */
    int32_t *rows, *d_rows;     /* [slots * max_len] the target's rows they pair with (host; CUDA: device copy) */
    int32_t *top1;              /* CUDA: [slots] each depth's top token (device) */
    float *in_h, *out_h;        /* [slots * max_len, hid] */
    float *logits;              /* [slots * max_len, V]: one row per request */
} mtp;

static void *buf(size_t n, int device) {
    void *p = NULL;
    if (!device) return malloc(n ? n : 1);
    return kdt_dev_alloc(&p, n ? n : 1) == KDT_OK ? p : NULL;
}

static void mtp_release(mtp *t) {
    kdt_cache_free(t->cache);
    t->cache = NULL;
    void (*fr)(void *) = t->dev ? kdt_dev_free : free;
    fr(t->last_logits); fr(t->last_h); fr(t->in_h); fr(t->out_h); fr(t->logits); fr(t->d_rows); fr(t->top1);
    free(t->tok); free(t->req); free(t->n_rows); free(t->rows);
    t->last_logits = t->last_h = t->in_h = t->out_h = t->logits = NULL;
    t->tok = t->req = t->n_rows = t->rows = t->d_rows = t->top1 = NULL;
}

static kdt_status mtp_begin(void *state, const kdt_draft_setup *set) {
    mtp *t = state;
    mtp_release(t);
    t->set = *set;
    if (set->backend != kdt_model_backend(t->m))
        return kdt_fail(KDT_ERR_INVALID_ARG, "mtp drafter: loaded for %s, the loop runs on %s", kdt_backend_name(kdt_model_backend(t->m)),
                        kdt_backend_name(set->backend));
    if (set->vocab_size != t->V || set->hidden_size != t->hid)
        return kdt_fail(KDT_ERR_INVALID_ARG, "mtp drafter: vocab_size %d / hidden_size %d differ from the target's %d / %d", t->V, t->hid,
                        set->vocab_size, set->hidden_size);
    t->dev = set->backend == KDT_BACKEND_CUDA;
    const size_t S = (size_t)set->slots, rows = S * set->max_len;
    kdt_status s = kdt_cache_create(t->m, set->slots, set->max_len + set->D, 0, &t->cache);
    if (s != KDT_OK) return s;
    t->last_logits = buf(S * t->V * sizeof(float), t->dev);
    t->last_h = buf(S * t->hid * sizeof(float), t->dev);
    t->in_h = buf(rows * t->hid * sizeof(float), t->dev);
    t->out_h = buf(rows * t->hid * sizeof(float), t->dev);
    t->logits = buf(S * t->V * sizeof(float), t->dev);
    t->tok = malloc(rows * sizeof(int32_t));
    t->req = malloc(S * sizeof(int32_t));
    t->n_rows = malloc(S * sizeof(int32_t));
    t->rows = malloc(rows * sizeof(int32_t));
    t->d_rows = t->dev ? buf(rows * sizeof(int32_t), 1) : NULL;
    t->top1 = t->dev ? buf(S * sizeof(int32_t), 1) : NULL;
    if (!t->last_logits || !t->last_h || !t->tok || !t->req || !t->n_rows || !t->in_h || !t->out_h || !t->logits || !t->rows ||
        (t->dev && (!t->d_rows || !t->top1))) {
        mtp_release(t);
        return kdt_fail(KDT_ERR_NOMEM, "mtp drafter: out of memory for %d slots of %d rows", set->slots, set->max_len);
    }
    return KDT_OK;
}

/* n floats from src to dst, both in the backend's memory. */
static kdt_status move(const mtp *t, float *dst, const float *src, size_t n) {
    if (t->dev) return kdt_spec_copy(dst, src, n * sizeof(float), KDT_SPEC_D2D, t->set.stream);
    memcpy(dst, src, n * sizeof(float));
    return KDT_OK;
}

/* Runs the gathered rows (nb requests) and keeps each request's last row as its depth-1 state. */
static kdt_status run_rows(mtp *t, int32_t nb) {
    const kdt_batch bt = {.B = nb, .req = t->req, .n_rows = t->n_rows, .tokens = t->tok, .logits_rows = KDT_LOGITS_LAST, .mtp_hidden = t->in_h};
    kdt_status s = kdt_model_forward(t->m, t->cache, &bt, t->logits, t->out_h, t->set.stream);
    for (int64_t b = 0, end = 0; s == KDT_OK && b < nb; b++) {
        end += t->n_rows[b];
        s = move(t, t->last_logits + (int64_t)t->req[b] * t->V, t->logits + b * t->V, (size_t)t->V);
        if (s == KDT_OK) s = move(t, t->last_h + (int64_t)t->req[b] * t->hid, t->out_h + (end - 1) * t->hid, (size_t)t->hid);
    }
    return s;
}

static kdt_status mtp_observe(void *state, const kdt_draft_ctx *ctx, const kdt_draft_feedback *fb) {
    mtp *t = state;
    if (!fb->hidden) return kdt_fail(KDT_ERR_INVALID_ARG, "mtp drafter: observe without hidden states");
    int32_t nb = 0;
    int64_t R = 0;
    for (int32_t b = 0; b < ctx->B; b++) {
        const int32_t slot = ctx->slot[b];
        if (fb->prefill) kdt_cache_reset(t->cache, slot);
        const int32_t have = kdt_cache_len(t->cache, slot), n = ctx->hist_len[b] - 1 - have;
        if (n <= 0) continue;
        for (int32_t j = 0; j < n; j++, R++) {
            t->rows[R] = fb->row_start[b] + (fb->prefill ? have + j : fb->accept_index[(int64_t)b * fb->Q + j]);
            t->tok[R] = ctx->history[b][have + j + 1];
            if (!t->dev) memcpy(t->in_h + R * t->hid, fb->hidden + (int64_t)t->rows[R] * t->hid, (size_t)t->hid * sizeof(float));
        }
        t->req[nb] = slot;
        t->n_rows[nb++] = n;
    }
    if (!nb) return KDT_OK;
    if (t->dev) { /* the target's rows stay on the device: gathered there */
        kdt_status s = kdt_spec_copy(t->d_rows, t->rows, (size_t)R * sizeof(int32_t), KDT_SPEC_H2D, t->set.stream);
        if (s == KDT_OK) s = kdt_spec_gather_cuda(fb->hidden, t->hid, t->d_rows, (int32_t)R, t->in_h, t->set.stream);
        if (s != KDT_OK) return s;
    }
    return run_rows(t, nb);
}

/* Top K of row x [V] into scores / tokens [K]; the top token into t->tok[b] (through the device on CUDA). */
static kdt_status topk(mtp *t, const float *x, int32_t b, float *scores, int32_t *tokens) {
    if (!t->dev) {
        kdt_spec_topk_host(x, 1, t->V, t->set.K, scores, tokens, t->set.K);
        t->tok[b] = tokens[0];
        return KDT_OK;
    }
    return kdt_spec_topk_cuda(x, 1, t->V, t->set.K, scores, tokens, t->set.K, t->top1 + b, t->set.stream);
}

static kdt_status mtp_propose(void *state, const kdt_draft_ctx *ctx, float *scores, int32_t *tokens) {
    mtp *t = state;
    const int32_t D = t->set.D, K = t->set.K, B = ctx->B;
    const size_t hb = (size_t)t->hid;
    kdt_status s = KDT_OK;
    for (int32_t b = 0; b < B && s == KDT_OK; b++) {
        const int32_t slot = ctx->slot[b];
        if (kdt_cache_len(t->cache, slot) != ctx->hist_len[b] - 1)
            return kdt_fail(KDT_ERR_INVALID_ARG, "mtp drafter: request %d has %d rows for a root at position %d", slot,
                            kdt_cache_len(t->cache, slot), ctx->hist_len[b] - 1);
        s = topk(t, t->last_logits + (int64_t)slot * t->V, b, scores + (int64_t)b * D * K, tokens + (int64_t)b * D * K);
        t->req[b] = slot;
        t->n_rows[b] = 1;
        if (s == KDT_OK) s = move(t, t->in_h + (int64_t)b * hb, t->last_h + (int64_t)slot * hb, hb);
    }
    for (int32_t d = 1; d < D && s == KDT_OK; d++) {
        if (t->dev && (s = kdt_spec_copy(t->tok, t->top1, (size_t)B * sizeof(int32_t), KDT_SPEC_D2H, t->set.stream)) != KDT_OK) break;
        const kdt_batch bt = {.B = B, .req = t->req, .n_rows = t->n_rows, .tokens = t->tok, .logits_rows = KDT_LOGITS_ALL, .mtp_hidden = t->in_h};
        s = kdt_model_forward(t->m, t->cache, &bt, t->logits, t->out_h, t->set.stream);
        if (s == KDT_OK && t->dev) /* every request's row at once, at stride D * K */
            s = kdt_spec_topk_cuda(t->logits, B, t->V, K, scores + d * K, tokens + d * K, (int64_t)D * K, t->top1, t->set.stream);
        else if (s == KDT_OK) {
            kdt_spec_topk_host(t->logits, B, t->V, K, scores + d * K, tokens + d * K, (int64_t)D * K);
            for (int32_t b = 0; b < B; b++) t->tok[b] = tokens[((int64_t)b * D + d) * K];
        }
        if (s == KDT_OK) s = move(t, t->in_h, t->out_h, (size_t)B * hb);
    }
    for (int32_t b = 0; b < B; b++) {
        kdt_status r = kdt_cache_truncate(t->cache, ctx->slot[b], ctx->hist_len[b] - 1);
        if (s == KDT_OK) s = r;
    }
    return s;
}

static void mtp_destroy(void *state) {
    mtp *t = state;
    if (!t) return;
    mtp_release(t);
    kdt_model_free(t->m);
    free(t);
}

kdt_status kdt_drafter_mtp(const char *dir, kdt_backend backend, kdt_drafter **out) {
    if (!dir || !out) return kdt_fail(KDT_ERR_INVALID_ARG, "mtp drafter: NULL argument");
    *out = NULL;
    mtp *t = calloc(1, sizeof *t);
    kdt_drafter *dr = calloc(1, sizeof *dr);
    kdt_status s = !t || !dr ? kdt_fail(KDT_ERR_NOMEM, "mtp drafter: out of memory") : kdt_model_load_mtp(dir, backend, &t->m);
    if (s != KDT_OK) {
        free(t);
        free(dr);
        return s;
    }
    t->V = kdt_model_get_config(t->m)->vocab_size;
    t->hid = kdt_model_get_config(t->m)->hidden_size;
    *dr = (kdt_drafter){.name = "mtp", .state = t, .wants_hidden = 1, .begin = mtp_begin, .propose = mtp_propose,
                        .observe = mtp_observe, .destroy = mtp_destroy};
    *out = dr;
    return KDT_OK;
}
