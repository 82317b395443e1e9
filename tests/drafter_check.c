#include "drafter_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

kdt_status kt_target_states(kdt_model *m, const kdt_drafter *dr, const int32_t *tokens, int32_t n, float *hidden) {
    kdt_cache *c = NULL;
    kdt_status s = kdt_cache_create(m, 1, n + 1, 0, &c);
    if (s == KDT_OK) s = kdt_model_set_hidden_layers(m, dr->n_hidden_layers, dr->hidden_layers);
    const int32_t req = 0;
    const kdt_batch bt = {.B = 1, .req = &req, .n_rows = &n, .tokens = tokens, .logits_rows = KDT_LOGITS_LAST};
    if (s == KDT_OK) s = kdt_model_forward(m, c, &bt, NULL, hidden, NULL); /* the layers stay set: a loop may be using m */
    kdt_cache_free(c);
    return s;
}

kdt_status kt_draft_fresh(kdt_drafter *dr, const kdt_model_config *cf, kdt_backend be, const int32_t *hist, int32_t len,
                          int32_t D, int32_t K, const float *hidden, float *scores, int32_t *tokens) {
    const kdt_draft_setup set = {.slots = 1, .max_len = len + 1, .D = D, .K = K, .vocab_size = cf->vocab_size,
                                 .hidden_size = cf->hidden_size, .backend = be};
    const int32_t slot = 0, n_new = 1, zero = 0, rows = len - 1;
    const int32_t *hp = hist;
    const kdt_draft_ctx ctx = {.B = 1, .slot = &slot, .history = &hp, .hist_len = &len};
    const kdt_draft_feedback fb = {.prefill = 1, .n_new = &n_new, .accept_len = &zero, .hidden = hidden, .row_start = &zero, .n_rows = &rows};
    kdt_status s = dr->begin(dr->state, &set);
    if (s == KDT_OK) s = dr->observe(dr->state, &ctx, &fb);
    if (s == KDT_OK) s = dr->propose(dr->state, &ctx, scores, tokens);
    return s;
}

/* Wraps the drafter under test: every proposal is also computed fresh and compared. */
typedef struct checker {
    kdt_drafter *inner;
    kdt_model *m;
    kt_fresh_propose fresh;
    int32_t D, K;
    int64_t compared, bad;
    float worst;
} checker;

static kdt_status chk_begin(void *st, const kdt_draft_setup *set) {
    checker *c = st;
    c->D = set->D;
    c->K = set->K;
    return c->inner->begin(c->inner->state, set);
}

static kdt_status chk_propose(void *st, const kdt_draft_ctx *ctx, float *scores, int32_t *tokens) {
    checker *c = st;
    kdt_status s = c->inner->propose(c->inner->state, ctx, scores, tokens);
    const int32_t n = c->D * c->K;
    float *fs = malloc((size_t)n * sizeof *fs);
    int32_t *ft = malloc((size_t)n * sizeof *ft);
    for (int32_t b = 0; s == KDT_OK && b < ctx->B; b++) {
        if ((s = c->fresh(c->m, ctx->history[b], ctx->hist_len[b], c->D, c->K, fs, ft)) != KDT_OK) break;
        /* fmaxf passes over NaN: scores -inf on both sides (masked candidates) are no difference. */
        float e = 0.0f;
        for (int32_t i = 0; i < n; i++) e = fmaxf(e, fabsf(fs[i] - scores[(int64_t)b * n + i]));
        c->worst = fmaxf(c->worst, e);
        c->bad += e > 1e-4f || memcmp(ft, tokens + (int64_t)b * n, (size_t)n * sizeof *ft) != 0;
        c->compared++;
    }
    free(fs);
    free(ft);
    return s;
}

static kdt_status chk_observe(void *st, const kdt_draft_ctx *ctx, const kdt_draft_feedback *fb) {
    checker *c = st;
    return c->inner->observe(c->inner->state, ctx, fb);
}

int kt_check_lossless(kdt_model *m, const char *name, kt_make_drafter make, kt_fresh_propose fresh, const int32_t (*cases)[3],
                       size_t n_cases, int32_t B, const int32_t *const *prompts, const int32_t *plen, int32_t max_new) {
    int32_t *ref = malloc((size_t)B * max_new * sizeof *ref), *out = malloc((size_t)B * max_new * sizeof *out);
    kdt_spec_request *reqs = malloc((size_t)B * sizeof *reqs);
    kdt_spec_params p = {.depth = 1, .topk = 1, .budget = 1, .eos = -1};
    for (int32_t b = 0; b < B; b++)
        reqs[b] = (kdt_spec_request){.prompt = prompts[b], .prompt_len = plen[b], .max_new = max_new, .out = ref + (int64_t)b * max_new};
    kdt_status s = kdt_spec_generate(m, NULL, &p, B, reqs, NULL, NULL);
    char wrap_name[64];
    snprintf(wrap_name, sizeof wrap_name, "%s-checked", name);
    const int ref_ok = kt_check(s == KDT_OK, "plain greedy reference: %s", s == KDT_OK ? "ok" : kdt_last_error());
    for (size_t i = 0; ref_ok && i < n_cases; i++) {
        checker c = {.m = m, .fresh = fresh};
        kdt_drafter wrap = {.name = wrap_name, .state = &c, .wants_hidden = 1, .begin = chk_begin, .propose = chk_propose,
                            .observe = chk_observe};
        s = make(m, &c.inner);
        if (s == KDT_OK) {
            wrap.n_hidden_layers = c.inner->n_hidden_layers;
            wrap.hidden_layers = c.inner->hidden_layers;
        }
        p = (kdt_spec_params){.depth = cases[i][0], .topk = cases[i][1], .budget = cases[i][2], .eos = -1};
        for (int32_t b = 0; b < B; b++)
            reqs[b] = (kdt_spec_request){.prompt = prompts[b], .prompt_len = plen[b], .max_new = max_new, .out = out + (int64_t)b * max_new};
        kdt_spec_stats st;
        if (s == KDT_OK) s = kdt_spec_generate(m, &wrap, &p, B, reqs, &st, NULL);
        int same = s == KDT_OK;
        for (int32_t b = 0; same && b < B; b++)
            same = reqs[b].n_out == max_new && memcmp(out + (int64_t)b * max_new, ref + (int64_t)b * max_new, (size_t)max_new * sizeof *out) == 0;
        kt_check(same && c.bad == 0 && c.compared > 0,
                 "%s D=%d K=%d N=%d: speculative output equals greedy (%lld steps, %lld accepted); %lld proposals equal a fresh "
                 "drafter's over the history (max |diff| %.1e, %lld differ)%s%s",
                 name, cases[i][0], cases[i][1], cases[i][2], s == KDT_OK ? (long long)st.steps : -1LL, s == KDT_OK ? (long long)st.accepted : -1LL,
                 (long long)c.compared, c.worst, (long long)c.bad, s == KDT_OK ? "" : ": ", s == KDT_OK ? "" : kdt_last_error());
        kdt_drafter_free(c.inner);
    }
    free(reqs);
    free(out);
    free(ref);
    return ref_ok;
}
