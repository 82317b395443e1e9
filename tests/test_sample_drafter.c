/* Losslessness of speculative sampling with the model drafter's sampled children, end to end:
 * the target is tests/fixtures/model/bf16 (f32 compute), the drafter its first layer
 * (kdt_draft_model_load), so the draft distribution q differs from the target's p. Many requests
 * with one prompt and their own seeds generate three tokens each through kdt_spec_generate
 * (t1 from the prefill, t2 and t3 from speculative steps: the root's sampled children, then an
 * accepted child's); the counts of (t1, t2, t3) are compared by a chi-square test with the
 * target's exact joint distribution, computed here in double from the target's logits after
 * prompt, prompt + t1 and prompt + t1 + t2 (softmax(l / T) over the top_k largest, as
 * docs/interfaces.md 2.4 words it), independently of the library's integer weights.
 *
 * Checks: (a) the counts fit the target (p > 1e-4); the test's power on its own counts: the target
 * with 2% of probability moved between its two likeliest outcomes (the least visible 2% bias) is
 * rejected; (b) no token outside top_k appears; (c) the drafter's children were accepted (the path
 * under test ran); (d) a wrong drafter that draws from q but reports the uniform distribution as
 * its draft_probs (so acceptance uses min(1, p / uniform)) is rejected by the same test.
 * Sizes: T = 0.8, top_k = 4 (64 outcomes), D = 2, K = 3, N = 4; 40960 requests on cpu, 81920 on
 * cuda; the seeds are fixed, so the verdicts are the same every run. The general bound on the
 * noncentrality of a 2% bias in total variation, n (2 d)^2 = 66 at n = 40960, would not alone assure
 * a rejection at ~61 degrees of freedom (critical value ~102 at p = 1e-4); the power check measures
 * the bias that matters here: the counts against the target with 2% moved between its two
 * likeliest outcomes give chi2 ~560 on cpu. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/device.h"
#include "common/internal.h"
#include "harness.h"
#include "kdt/spec.h"

enum { PROMPT = 6, NEW = 3, TOPK = 4, BATCH = 256, MAXV = 128 };
static const float kT = 0.8f;
static const int32_t kPrompt[PROMPT] = {3, 17, 42, 5, 60, 11};
static const double kAlpha = 1e-4;

static const char *fixture(void) {
    const char *d = getenv("KDT_MODEL_FIXTURES");
    static char path[512];
    snprintf(path, sizeof path, "%s/bf16", d && *d ? d : "tests/fixtures/model");
    return path;
}

/* The target's filtered distribution at one logits row: softmax(l / T) over the TOPK largest (ties
 * at the cut kept), in double; tok[i] and p[i] for i < TOPK (the row has no ties at the cut here:
 * checked). Returns 0 on a tie. */
static int filtered(const float *row, int V, int32_t *tok, double *p) {
    int32_t idx[MAXV];
    for (int v = 0; v < V; v++) idx[v] = v;
    for (int i = 0; i <= TOPK && i < V; i++) /* partial selection sort, descending */
        for (int j = i + 1; j < V; j++)
            if (row[idx[j]] > row[idx[i]]) { const int32_t t = idx[i]; idx[i] = idx[j]; idx[j] = t; }
    if (row[idx[TOPK - 1]] == row[idx[TOPK]]) return 0;
    double z = 0;
    for (int i = 0; i < TOPK; i++) z += p[i] = exp(((double)row[idx[i]] - row[idx[0]]) / kT), tok[i] = idx[i];
    for (int i = 0; i < TOPK; i++) p[i] /= z;
    return 1;
}

typedef struct target {
    int V;
    int32_t tok1[TOPK], tok2[TOPK][TOPK], tok3[TOPK][TOPK][TOPK];
    double p[TOPK * TOPK * TOPK]; /* joint of (i, j, k): tok1[i], tok2[i][j], tok3[i][j][k] */
} target;

/* Logits of the last row after feeding toks (n) to request 0 of cache c truncated to keep rows. */
static kdt_status next_row(kdt_model *m, kdt_cache *c, int32_t keep, const int32_t *toks, int32_t n, float *row) {
    kdt_status s = kdt_cache_truncate(c, 0, keep);
    const int32_t req = 0;
    const kdt_batch bt = {.B = 1, .req = &req, .n_rows = &n, .tokens = toks, .logits_rows = KDT_LOGITS_LAST};
    return s == KDT_OK ? kdt_model_forward(m, c, &bt, row, NULL, NULL) : s;
}

/* The exact joint distribution of (t1, t2, t3). */
static kdt_status exact(kdt_model *m, target *t) {
    t->V = kdt_model_get_config(m)->vocab_size;
    if (t->V > MAXV) return kdt_fail(KDT_ERR_INVALID_ARG, "test: vocabulary %d > %d", t->V, MAXV);
    kdt_cache *c = NULL;
    float row[MAXV];
    double p1[TOPK], p2[TOPK], p3[TOPK];
    kdt_status s = kdt_cache_create(m, 1, PROMPT + NEW + 1, 0, &c);
    if (s == KDT_OK) s = next_row(m, c, 0, kPrompt, PROMPT, row);
    if (s == KDT_OK && !filtered(row, t->V, t->tok1, p1)) s = kdt_fail(KDT_ERR_INTERNAL, "test: a tie at the top-k cut");
    for (int i = 0; s == KDT_OK && i < TOPK; i++) {
        s = next_row(m, c, PROMPT, &t->tok1[i], 1, row);
        if (s == KDT_OK && !filtered(row, t->V, t->tok2[i], p2)) s = kdt_fail(KDT_ERR_INTERNAL, "test: a tie at the top-k cut");
        for (int j = 0; s == KDT_OK && j < TOPK; j++) {
            s = next_row(m, c, PROMPT + 1, &t->tok2[i][j], 1, row);
            if (s == KDT_OK && !filtered(row, t->V, t->tok3[i][j], p3)) s = kdt_fail(KDT_ERR_INTERNAL, "test: a tie at the top-k cut");
            for (int k = 0; s == KDT_OK && k < TOPK; k++) t->p[(i * TOPK + j) * TOPK + k] = p1[i] * p2[j] * p3[k];
        }
    }
    kdt_cache_free(c);
    return s;
}

/* The outcome index of (t1, t2, t3), or -1 when a token is outside the target's top_k. */
static int outcome(const target *t, const int32_t *o) {
    for (int i = 0; i < TOPK; i++) {
        if (t->tok1[i] != o[0]) continue;
        for (int j = 0; j < TOPK; j++) {
            if (t->tok2[i][j] != o[1]) continue;
            for (int k = 0; k < TOPK; k++)
                if (t->tok3[i][j][k] == o[2]) return (i * TOPK + j) * TOPK + k;
        }
    }
    return -1;
}

/* The wrong drafter of (d): the model drafter's draws, with the uniform distribution reported. */
typedef struct liar {
    kdt_drafter *inner;
    kdt_backend be;
    int32_t D, V;
    float *uniform; /* [BATCH, D, V] host */
} liar;

static kdt_status liar_begin(void *st, const kdt_draft_setup *set) {
    liar *l = st;
    l->D = set->D, l->V = set->vocab_size;
    free(l->uniform);
    if (!(l->uniform = malloc((size_t)set->slots * set->D * set->vocab_size * sizeof(float))))
        return kdt_fail(KDT_ERR_NOMEM, "test: out of memory");
    for (size_t i = 0; i < (size_t)set->slots * set->D * set->vocab_size; i++) l->uniform[i] = 1.0f / (float)set->vocab_size;
    return l->inner->begin(l->inner->state, set);
}

static kdt_status liar_propose(void *st, const kdt_draft_ctx *ctx, float *scores, int32_t *tokens) {
    liar *l = st;
    kdt_status s = l->inner->propose(l->inner->state, ctx, scores, tokens);
    const size_t n = (size_t)ctx->B * l->D * l->V * sizeof(float);
    if (s != KDT_OK || !ctx->probs) return s;
    if (l->be == KDT_BACKEND_CPU) memcpy(ctx->probs, l->uniform, n);
    else s = kdt_dev_h2d(ctx->probs, l->uniform, n);
    return s;
}

static kdt_status liar_observe(void *st, const kdt_draft_ctx *ctx, const kdt_draft_feedback *fb) {
    const liar *l = st;
    return l->inner->observe(l->inner->state, ctx, fb);
}

/* Outcome counts of n requests (seeds base + 1 ..); *accepted: draft tokens accepted. */
static kdt_status sample(kdt_model *m, kdt_drafter *dr, const target *t, int n, uint64_t base, long *count, long *outside,
                         long *accepted) {
    kdt_spec_request req[BATCH];
    int32_t out[BATCH][NEW];
    const kdt_spec_params p = {.depth = 2, .topk = 3, .budget = 4, .eos = -1};
    kdt_status s = KDT_OK;
    for (int at = 0; at < n && s == KDT_OK; at += BATCH) {
        for (int b = 0; b < BATCH; b++)
            req[b] = (kdt_spec_request){.prompt = kPrompt, .prompt_len = PROMPT, .max_new = NEW, .out = out[b],
                                        .temperature = kT, .top_k = TOPK, .top_p = 1.0f, .seed = base + (uint64_t)(at + b) + 1};
        if ((s = kdt_spec_generate(m, dr, &p, BATCH, req, NULL, NULL)) != KDT_OK) break;
        for (int b = 0; b < BATCH; b++) {
            const int o = req[b].n_out == NEW ? outcome(t, out[b]) : -1;
            if (o < 0) (*outside)++;
            else count[o]++;
            *accepted += req[b].accepted;
        }
    }
    return s;
}

/* Chi-square of counts against p (categories expected below 20 pooled): the p-value. */
static double fit(const long *count, const double *p, int cats, double *chi2, int *df) {
    long n = 0;
    for (int c = 0; c < cats; c++) n += count[c];
    double po = 0, pe = 0;
    int bins = 0;
    *chi2 = 0;
    for (int c = 0; c < cats; c++) {
        const double e = p[c] * n;
        if (e < 20) { po += count[c], pe += e; continue; }
        *chi2 += (count[c] - e) * (count[c] - e) / e, bins++;
    }
    if (pe > 0) *chi2 += (po - pe) * (po - pe) / pe, bins++;
    *df = bins - 1;
    return *df > 0 ? kt_chi2_sf(*chi2, *df) : 1.0;
}

static void run(kdt_backend be) {
    char what[96];
    snprintf(what, sizeof what, "sampled model drafter [%s]", kdt_backend_name(be));
    if (!kt_backend_usable(be, what)) return;
    const int n = be == KDT_BACKEND_CPU ? 40960 : 81920;
    enum { CATS = TOPK * TOPK * TOPK };
    kdt_model *m = NULL, *dm = NULL;
    kdt_drafter *dr = NULL;
    target t;
    long count[CATS] = {0}, wrong[CATS] = {0}, outside = 0, w_outside = 0, accepted = 0, w_accepted = 0;
    kdt_status s = kdt_model_load_as(fixture(), be, KDT_F32, &m);
    if (s == KDT_OK) s = kdt_draft_model_load(fixture(), 1, be, &dm);
    if (s == KDT_OK) s = kdt_drafter_model(dm, &dr);
    if (s == KDT_OK) s = exact(m, &t);
    if (s == KDT_OK) s = sample(m, dr, &t, n, 0, count, &outside, &accepted);
    liar l = {.inner = dr, .be = be};
    kdt_drafter wrong_dr = {.name = "liar", .state = &l, .sampled = 1, .begin = liar_begin, .propose = liar_propose,
                            .observe = liar_observe};
    if (s == KDT_OK) s = sample(m, &wrong_dr, &t, n, 0, wrong, &w_outside, &w_accepted);
    if (s != KDT_OK) {
        kt_fail("%s: %s: %s", what, kdt_status_name(s), kdt_last_error());
    } else {
        double chi2, shifted[CATS];
        int df, a = 0, b = -1;
        double pv = fit(count, t.p, CATS, &chi2, &df);
        kt_check(pv > kAlpha, "%s (a) (t1, t2, t3) over %d seeds against the target's exact joint: chi2 %.1f df %d p %.3g", what, n,
                 chi2, df, pv);
        for (int c = 0; c < CATS; c++) a = t.p[c] > t.p[a] ? c : a;
        for (int c = 0; c < CATS; c++) b = c != a && (b < 0 || t.p[c] > t.p[b]) ? c : b;
        for (int c = 0; c < CATS; c++) shifted[c] = t.p[c];
        shifted[a] -= 0.02, shifted[b] += 0.02;
        pv = fit(count, shifted, CATS, &chi2, &df);
        kt_check(pv < kAlpha, "%s (a) power: the same counts against the target with 2%% moved between its two likeliest: "
                 "chi2 %.1f p %.3g (must reject)", what, chi2, pv);
        kt_check(outside == 0, "%s (b) tokens outside top_k %d: %ld of %d requests", what, TOPK, outside, n);
        kt_check(accepted > n / 20, "%s (c) draft tokens accepted: %ld over %d requests (%.2f a request)", what, accepted, n,
                 (double)accepted / n);
        pv = fit(wrong, t.p, CATS, &chi2, &df);
        kt_check(pv < kAlpha && w_outside == 0, "%s (d) wrong drafter (draws from q, reports uniform): chi2 %.1f df %d p %.3g "
                 "(must reject), %ld outside top_k", what, chi2, df, pv, w_outside);
    }
    free(l.uniform);
    kdt_drafter_free(dr);
    kdt_model_free(dm);
    kdt_model_free(m);
}

int main(void) {
    run(KDT_BACKEND_CPU);
    run(KDT_BACKEND_CUDA);
    return kt_exit_code();
}
