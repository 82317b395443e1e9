/* The model drafter: a small model of the target's vocabulary, run for D steps per verification,
 * greedily, or for a request that samples drawing its candidates from softmax(logits / T)
 * (kdt_spec_sample_*: the distributions go to ctx->probs for tree_sample_accept). Its cache holds each
 * request's history up to (not including) the root, plus the D - 1 chain tokens it fed while drafting;
 * observe keeps the chain rows the target confirmed and drops the rest, so the next propose feeds only
 * the tokens the cache lacks (the rest of the accepted path, then the new root) in one chain forward,
 * then D - 1 single-row steps. The logits stay in the backend's memory and the top-K runs there,
 * writing the candidates in place; on CUDA only each depth's top tokens come back (the next forward's
 * rows are host memory). */
#include <stdlib.h>
#include <string.h>

#include "common/device.h"
#include "common/internal.h"
#include "spec/internal.h"

typedef struct draft {
    kdt_model *m;
    kdt_draft_setup set;
    int32_t V;
    kdt_cache *cache;
    int32_t *chain;             /* [slots, D] tokens fed after the root at the last propose */
    int32_t *rows;              /* [slots * max_len] tokens of one forward */
    int32_t *n_rows;            /* [slots] */
    int32_t *next;              /* [slots] each request's top candidate of the last depth */
    float *logits;              /* [slots, V] backend memory */
    int32_t *d_next;            /* [slots] device: the top candidates (CUDA) */
    void *d_samp;               /* [slots] seeds u64, then temperatures f32 (CUDA) */
} draft;

static void draft_release(draft *r) {
    kdt_cache_free(r->cache);
    free(r->chain); free(r->rows); free(r->n_rows); free(r->next);
    if (r->set.backend == KDT_BACKEND_CPU) free(r->logits);
    else kdt_dev_free(r->logits);
    kdt_dev_free(r->d_next);
    kdt_dev_free(r->d_samp);
    r->d_samp = NULL;
    r->cache = NULL;
    r->chain = r->rows = r->n_rows = r->next = r->d_next = NULL;
    r->logits = NULL;
}

static kdt_status draft_begin(void *state, const kdt_draft_setup *set) {
    draft *r = state;
    draft_release(r);
    r->set = *set;
    const size_t S = (size_t)set->slots;
    if (kdt_model_backend(r->m) != set->backend)
        return kdt_fail(KDT_ERR_INVALID_ARG, "model drafter: the draft model runs on %s, the loop on %s",
                        kdt_backend_name(kdt_model_backend(r->m)), kdt_backend_name(set->backend));
    if (r->V != set->vocab_size)
        return kdt_fail(KDT_ERR_INVALID_ARG, "model drafter: the draft model's vocabulary has %d tokens, the target's %d", r->V,
                        set->vocab_size);
    /* Rows: the history without the root, then D - 1 chain tokens. */
    kdt_status s = kdt_cache_create(r->m, set->slots, set->max_len + set->D, 0, &r->cache);
    if (s != KDT_OK) return s;
    r->chain = malloc(S * set->D * sizeof *r->chain);
    r->rows = malloc(S * set->max_len * sizeof *r->rows);
    r->n_rows = malloc(S * sizeof *r->n_rows);
    r->next = malloc(S * sizeof *r->next);
    if (set->backend == KDT_BACKEND_CPU) r->logits = malloc(S * r->V * sizeof *r->logits);
    else if ((s = kdt_dev_alloc((void **)&r->logits, S * r->V * sizeof *r->logits)) == KDT_OK)
        s = kdt_dev_alloc((void **)&r->d_next, S * sizeof *r->d_next);
    if (s == KDT_OK && set->backend != KDT_BACKEND_CPU) s = kdt_dev_alloc(&r->d_samp, S * 12);
    if (s == KDT_OK && (!r->chain || !r->rows || !r->n_rows || !r->next || !r->logits))
        s = kdt_fail(KDT_ERR_NOMEM, "model drafter: out of memory for %d slots", set->slots);
    if (s != KDT_OK) draft_release(r);
    return s;
}

/* One forward of n_rows[b] rows per request (tokens back to back in r->rows), the last row's
 * logits into r->logits [B, V]. */
static kdt_status step(draft *r, const kdt_draft_ctx *ctx, int with_logits) {
    const kdt_batch bt = {.B = ctx->B, .req = ctx->slot, .n_rows = r->n_rows, .tokens = r->rows,
                          .logits_rows = KDT_LOGITS_LAST};
    return kdt_model_forward(r->m, r->cache, &bt, with_logits ? r->logits : NULL, NULL, r->set.stream);
}

/* Depth d's candidates from r->logits into scores / tokens [B, D, K] (drawn for the requests that
 * sample, when ctx carries probs), and each request's first candidate into r->next (host). */
static kdt_status candidates(draft *r, const kdt_draft_ctx *ctx, int32_t d, float *scores, int32_t *tokens) {
    const int32_t B = ctx->B, D = r->set.D, K = r->set.K;
    const int64_t dk = (int64_t)D * K, dv = (int64_t)D * r->V;
    float *sc = scores + (int64_t)d * K, *probs = ctx->probs ? ctx->probs + (int64_t)d * r->V : NULL;
    int32_t *tk = tokens + (int64_t)d * K;
    if (r->set.backend == KDT_BACKEND_CPU) {
        kdt_spec_topk_host(r->logits, B, r->V, K, sc, tk, dk);
        if (probs) kdt_spec_sample_host(r->logits, B, r->V, K, d, ctx->temperature, ctx->seed, probs, dv, sc, tk, dk);
        for (int32_t b = 0; b < B; b++) r->next[b] = tokens[b * dk + (int64_t)d * K];
        return KDT_OK;
    }
    kdt_status s = kdt_spec_topk_cuda(r->logits, B, r->V, K, sc, tk, dk, r->d_next, r->set.stream);
    if (s == KDT_OK && probs) {
        const uint64_t *seed = r->d_samp;
        s = kdt_spec_sample_cuda(r->logits, B, r->V, K, d, (const float *)(seed + B), seed, probs, dv, sc, tk, dk, r->d_next,
                                 r->set.stream);
    }
    if (s != KDT_OK || d == D - 1) return s; /* the last depth's top tokens feed nothing */
    return kdt_spec_copy(r->next, r->d_next, (size_t)B * sizeof *r->next, KDT_SPEC_D2H, r->set.stream);
}

static kdt_status draft_propose(void *state, const kdt_draft_ctx *ctx, float *scores, int32_t *tokens) {
    draft *r = state;
    const int32_t D = r->set.D;
    int64_t R = 0;
    for (int32_t b = 0; b < ctx->B; b++) {
        const int32_t have = kdt_cache_len(r->cache, ctx->slot[b]), h = ctx->hist_len[b];
        if (have < 0 || have >= h)
            return kdt_fail(KDT_ERR_INTERNAL, "model drafter: slot %d caches %d rows of a %d-token history", ctx->slot[b], have, h);
        r->n_rows[b] = h - have;
        memcpy(r->rows + R, ctx->history[b] + have, (size_t)(h - have) * sizeof *r->rows);
        R += h - have;
    }
    kdt_status s = KDT_OK;
    if (ctx->probs && r->set.backend != KDT_BACKEND_CPU) { /* the requests' seeds and temperatures, to the device */
        uint64_t *seed = r->d_samp;
        s = kdt_spec_copy(seed, ctx->seed, (size_t)ctx->B * sizeof *seed, KDT_SPEC_H2D, r->set.stream);
        if (s == KDT_OK)
            s = kdt_spec_copy(seed + ctx->B, ctx->temperature, (size_t)ctx->B * sizeof(float), KDT_SPEC_H2D, r->set.stream);
    }
    for (int32_t d = 0; d < D && s == KDT_OK; d++) {
        if (d > 0) {
            for (int32_t b = 0; b < ctx->B; b++) {
                r->n_rows[b] = 1;
                r->rows[b] = r->next[b];
                r->chain[(size_t)ctx->slot[b] * D + d - 1] = r->next[b];
            }
        }
        if ((s = step(r, ctx, 1)) == KDT_OK) s = candidates(r, ctx, d, scores, tokens);
    }
    return s;
}

/* Prefill: caches the prompt. A step: keeps the chain rows that match the accepted tokens, and
 * never the new root (the next propose needs at least one row to feed). */
static kdt_status draft_observe(void *state, const kdt_draft_ctx *ctx, const kdt_draft_feedback *fb) {
    draft *r = state;
    if (fb->prefill) {
        int64_t R = 0;
        for (int32_t b = 0; b < ctx->B; b++) {
            if (kdt_cache_len(r->cache, ctx->slot[b]) != 0)
                return kdt_fail(KDT_ERR_INTERNAL, "model drafter: slot %d is not empty at its prefill", ctx->slot[b]);
            r->n_rows[b] = ctx->hist_len[b] - 1;
            memcpy(r->rows + R, ctx->history[b], (size_t)r->n_rows[b] * sizeof *r->rows);
            R += r->n_rows[b];
        }
        return step(r, ctx, 0);
    }
    for (int32_t b = 0; b < ctx->B; b++) {
        const int32_t slot = ctx->slot[b], h1 = ctx->hist_len[b], h0 = h1 - fb->n_new[b];
        const int32_t *hist = ctx->history[b], *chain = r->chain + (size_t)slot * r->set.D;
        int32_t keep = h0;
        while (keep - h0 < r->set.D - 1 && keep < h1 - 1 && chain[keep - h0] == hist[keep]) keep++;
        kdt_status s = kdt_cache_truncate(r->cache, slot, keep);
        if (s != KDT_OK) return s;
    }
    return KDT_OK;
}

static kdt_status draft_reset(void *state, int32_t slot) { return kdt_cache_reset(((draft *)state)->cache, slot); }

static void draft_destroy(void *state) {
    draft_release(state);
    free(state);
}

kdt_status kdt_drafter_model(kdt_model *m, kdt_drafter **out) {
    if (!out) return kdt_fail(KDT_ERR_INVALID_ARG, "drafter_model: out is NULL");
    *out = NULL;
    if (!m) return kdt_fail(KDT_ERR_INVALID_ARG, "drafter_model: the draft model is NULL");
    kdt_drafter *d = calloc(1, sizeof *d);
    draft *r = calloc(1, sizeof *r);
    if (!d || !r) {
        free(d);
        free(r);
        return kdt_fail(KDT_ERR_NOMEM, "drafter_model: out of memory");
    }
    r->m = m;
    r->V = kdt_model_get_config(m)->vocab_size;
    *d = (kdt_drafter){.name = "model", .state = r, .sampled = 1, .begin = draft_begin, .propose = draft_propose, .observe = draft_observe,
                       .reset = draft_reset, .destroy = draft_destroy};
    *out = d;
    return KDT_OK;
}
