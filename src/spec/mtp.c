/* The MTP drafter (docs/spec.md, "MTP"): the checkpoint's next-token layer (kdt_model_load_mtp)
 * over its own cache. Its row i pairs the target's final hidden state h_i (which predicted token
 * i + 1) with token i + 1 and predicts token i + 2, so every token the target has cached gives one
 * row once the token after it is known: observe appends them (the prompt at the prefill, the
 * accepted path after a step, the new root's row last) and keeps the last row's logits, which are
 * depth 1 of the next proposal. Depths 2 .. D chain: the row (the MTP's own output state after
 * shared_head.norm, the previous depth's top token) at the next position; those draft rows are
 * dropped from the cache when the proposal is done. CPU backend only so far. */
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "spec/internal.h"

typedef struct mtp {
    kdt_model *m;
    int32_t V, hid;
    kdt_draft_setup set;
    kdt_cache *cache;
    float *last_logits;         /* [slots, V] the last real row's logits: depth 1 */
    float *last_h;              /* [slots, hid] its output state */
    int32_t *tok, *req, *n_rows; /* [slots * max_len], [slots], [slots]: one forward's rows */
    float *in_h, *out_h;        /* [slots * max_len, hid] */
    float *logits;              /* [slots, V] */
} mtp;

static void mtp_release(mtp *t) {
    kdt_cache_free(t->cache);
    t->cache = NULL;
    free(t->last_logits); free(t->last_h); free(t->tok); free(t->req); free(t->n_rows); free(t->in_h); free(t->out_h); free(t->logits);
    t->last_logits = t->last_h = t->in_h = t->out_h = t->logits = NULL;
    t->tok = t->req = t->n_rows = NULL;
}

static kdt_status mtp_begin(void *state, const kdt_draft_setup *set) {
    mtp *t = state;
    mtp_release(t);
    t->set = *set;
    if (set->backend != KDT_BACKEND_CPU)
        return kdt_fail(KDT_ERR_UNSUPPORTED, "mtp drafter: CPU backend only so far (the loop runs on %s)", kdt_backend_name(set->backend));
    if (set->vocab_size != t->V || set->hidden_size != t->hid)
        return kdt_fail(KDT_ERR_INVALID_ARG, "mtp drafter: vocab_size %d / hidden_size %d differ from the target's %d / %d", t->V, t->hid,
                        set->vocab_size, set->hidden_size);
    const size_t S = (size_t)set->slots, rows = S * set->max_len;
    kdt_status s = kdt_cache_create(t->m, set->slots, set->max_len + set->D, 0, &t->cache);
    if (s != KDT_OK) return s;
    t->last_logits = malloc(S * t->V * sizeof(float));
    t->last_h = malloc(S * t->hid * sizeof(float));
    t->tok = malloc(rows * sizeof(int32_t));
    t->req = malloc(S * sizeof(int32_t));
    t->n_rows = malloc(S * sizeof(int32_t));
    t->in_h = malloc(rows * t->hid * sizeof(float));
    t->out_h = malloc(rows * t->hid * sizeof(float));
    t->logits = malloc(S * t->V * sizeof(float));
    if (!t->last_logits || !t->last_h || !t->tok || !t->req || !t->n_rows || !t->in_h || !t->out_h || !t->logits) {
        mtp_release(t);
        return kdt_fail(KDT_ERR_NOMEM, "mtp drafter: out of memory for %d slots of %d rows", set->slots, set->max_len);
    }
    return KDT_OK;
}

/* Runs the gathered rows (nb requests) and keeps each request's last row as its depth-1 state. */
static kdt_status run_rows(mtp *t, int32_t nb) {
    const kdt_batch bt = {.B = nb, .req = t->req, .n_rows = t->n_rows, .tokens = t->tok, .logits_rows = KDT_LOGITS_LAST, .mtp_hidden = t->in_h};
    kdt_status s = kdt_model_forward(t->m, t->cache, &bt, t->logits, t->out_h, NULL);
    for (int64_t b = 0, end = 0; s == KDT_OK && b < nb; b++) {
        end += t->n_rows[b];
        memcpy(t->last_logits + (int64_t)t->req[b] * t->V, t->logits + b * t->V, (size_t)t->V * sizeof(float));
        memcpy(t->last_h + (int64_t)t->req[b] * t->hid, t->out_h + (end - 1) * t->hid, (size_t)t->hid * sizeof(float));
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
            const int32_t row = fb->row_start[b] + (fb->prefill ? have + j : fb->accept_index[(int64_t)b * fb->Q + j]);
            t->tok[R] = ctx->history[b][have + j + 1];
            memcpy(t->in_h + R * t->hid, fb->hidden + (int64_t)row * t->hid, (size_t)t->hid * sizeof(float));
        }
        t->req[nb] = slot;
        t->n_rows[nb++] = n;
    }
    return nb ? run_rows(t, nb) : KDT_OK;
}

static kdt_status mtp_propose(void *state, const kdt_draft_ctx *ctx, float *scores, int32_t *tokens) {
    mtp *t = state;
    const int32_t D = t->set.D, K = t->set.K, B = ctx->B;
    for (int32_t b = 0; b < B; b++) {
        const int32_t slot = ctx->slot[b];
        if (kdt_cache_len(t->cache, slot) != ctx->hist_len[b] - 1)
            return kdt_fail(KDT_ERR_INVALID_ARG, "mtp drafter: request %d has %d rows for a root at position %d", slot,
                            kdt_cache_len(t->cache, slot), ctx->hist_len[b] - 1);
        kdt_spec_topk_host(t->last_logits + (int64_t)slot * t->V, 1, t->V, K, scores + (int64_t)b * D * K, tokens + (int64_t)b * D * K, K);
        t->req[b] = slot;
        t->n_rows[b] = 1;
        t->tok[b] = tokens[(int64_t)b * D * K];
        memcpy(t->in_h + (int64_t)b * t->hid, t->last_h + (int64_t)slot * t->hid, (size_t)t->hid * sizeof(float));
    }
    kdt_status s = KDT_OK;
    for (int32_t d = 1; d < D && s == KDT_OK; d++) {
        const kdt_batch bt = {.B = B, .req = t->req, .n_rows = t->n_rows, .tokens = t->tok, .logits_rows = KDT_LOGITS_ALL, .mtp_hidden = t->in_h};
        s = kdt_model_forward(t->m, t->cache, &bt, t->logits, t->out_h, NULL);
        for (int32_t b = 0; s == KDT_OK && b < B; b++) {
            const int64_t o = ((int64_t)b * D + d) * K;
            kdt_spec_topk_host(t->logits + (int64_t)b * t->V, 1, t->V, K, scores + o, tokens + o, K);
            t->tok[b] = tokens[o];
        }
        if (s == KDT_OK) memcpy(t->in_h, t->out_h, (size_t)B * t->hid * sizeof(float));
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
