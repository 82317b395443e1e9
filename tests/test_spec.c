/* The speculative loop (include/kdt/spec.h) against plain greedy decoding: for every drafter and
 * many (D, K, N), a batch of requests with different prompt lengths must come out token for token
 * as the reference, computed one request at a time through the model API alone (greedy_ref.c)
 * (and, on the transformers fixtures, the full prompt's continuation must be transformers' own).
 * Drafters: prompt lookup, the model drafter (the target itself: every draft token is right; the
 * target cut to fewer layers; another model), and test drafters: an oracle (the true tokens at
 * rank 0: exact acceptance counts), an adversary (never the true token: nothing accepted) and
 * random proposals (tokens and scores, -inf tails, empty trees). Also: the lookup drafter's
 * candidates against a brute-force count, the model drafter's candidates after its cache
 * rollbacks against a fresh draft forward, the hidden states given to observe against the
 * reference sequence's, and eos. CPU always; where a CUDA device is present also the loop's
 * kernels against their host versions, and the loop on the device in f32 and bf16: speculative
 * against plain greedy decoding on the device, greedy on the device against the CPU, each equal
 * or parting only where the CPU reference's logits of the two tokens nearly tie (printed).
 * KDT_SEED replays a run's random prompts and proposals. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/device.h"
#include "greedy_ref.h"
#include "harness.h"
#include "kdt/spec.h"
#include "spec/internal.h"

#define EXTRA 10    /* reference tokens past max_new: an oracle looks up to D ahead */
#define POISON (-7)

static uint64_t rng_state;

static uint64_t rnd(void) { return kt_splitmix64(&rng_state); }
static int32_t rnd_below(int32_t n) { return (int32_t)(rnd() % (uint64_t)n); }

static const char *fixture_root(void) {
    const char *d = getenv("KDT_MODEL_FIXTURES");
    return d && *d ? d : "tests/fixtures/model";
}

/* A batch of requests and their references. */
typedef struct reqset {
    int32_t B, V, hid;
    int32_t P[8], max_new[8];
    int32_t *seq[8];            /* [P + max_new + EXTRA] prompt then the greedy continuation */
    float *hidden[8];           /* [P + max_new + EXTRA - 1, hid] */
} reqset;

static void reqset_free(reqset *rs) {
    for (int32_t b = 0; b < rs->B; b++) {
        free(rs->seq[b]);
        free(rs->hidden[b]);
    }
}

/* Prompts: random tokens, with a stretch repeated so that lookup finds matches. */
static kdt_status reqset_make(kdt_model *m, reqset *rs, int32_t B, const int32_t *P, const int32_t *max_new,
                              const int32_t *prompt0) {
    const kdt_model_config *cf = kdt_model_get_config(m);
    memset(rs, 0, sizeof *rs);
    rs->B = B;
    rs->V = cf->vocab_size;
    rs->hid = cf->hidden_size;
    kdt_status s = KDT_OK;
    for (int32_t b = 0; b < B && s == KDT_OK; b++) {
        rs->P[b] = P[b];
        rs->max_new[b] = max_new[b];
        const int32_t len = P[b] + max_new[b] + EXTRA;
        rs->seq[b] = malloc((size_t)len * sizeof(int32_t));
        rs->hidden[b] = malloc((size_t)len * cf->hidden_size * sizeof(float));
        if (!rs->seq[b] || !rs->hidden[b]) return KDT_ERR_NOMEM;
        for (int32_t i = 0; i < P[b]; i++) {
            if (b == 0 && prompt0) rs->seq[b][i] = prompt0[i];
            else if (i >= 6 && rnd_below(3) > 0) rs->seq[b][i] = rs->seq[b][i - 6 + rnd_below(3)];
            else rs->seq[b][i] = rnd_below(rs->V);
        }
        s = kt_greedy_ref(m, rs->seq[b], P[b], max_new[b] + EXTRA, rs->hidden[b]);
    }
    return s;
}

/* ---- test drafters ---- */

typedef enum { TD_ORACLE, TD_WRONG, TD_RANDOM } td_mode;

typedef struct tdraft {
    td_mode mode;
    const reqset *rs;
    kdt_draft_setup set;
    float *sc;                  /* [slots, D, K] (CPU only) */
    int32_t *tk;
    /* Hidden-state check (wants_hidden): rows compared with the reference and how many differed. */
    int64_t hidden_rows, hidden_bad;
} tdraft;

static kdt_status td_begin(void *state, const kdt_draft_setup *set) {
    tdraft *t = state;
    if (set->backend != KDT_BACKEND_CPU) return KDT_ERR_UNSUPPORTED;
    t->set = *set;
    free(t->sc);
    free(t->tk);
    const size_t n = (size_t)set->slots * set->D * set->K;
    t->sc = malloc(n * sizeof *t->sc);
    t->tk = malloc(n * sizeof *t->tk);
    return t->sc && t->tk ? KDT_OK : KDT_ERR_NOMEM;
}

static kdt_status td_propose(void *state, const kdt_draft_ctx *ctx, float *scores, int32_t *tokens) {
    tdraft *t = state;
    const int32_t D = t->set.D, K = t->set.K, V = t->rs->V;
    for (int32_t b = 0; b < ctx->B; b++) {
        const int32_t s = ctx->slot[b], h = ctx->hist_len[b], len = t->rs->P[s] + t->rs->max_new[s] + EXTRA;
        for (int32_t d = 0; d < D; d++) {
            float *sc = t->sc + ((size_t)b * D + d) * K;
            int32_t *tk = t->tk + ((size_t)b * D + d) * K;
            const int32_t truth = h + d < len ? t->rs->seq[s][h + d] : rnd_below(V);
            if (t->mode == TD_RANDOM) {
                const int32_t finite = rnd_below(K + 1) - (rnd_below(4) == 0); /* sometimes none */
                float x = -(float)(rnd() % 1000) / 250.0f;
                for (int32_t k = 0; k < K; k++) {
                    tk[k] = rnd_below(3) == 0 ? truth : rnd_below(V);
                    sc[k] = k < finite ? x : -INFINITY;
                    x -= (float)(rnd() % 1000) / 500.0f;
                }
                continue;
            }
            for (int32_t k = 0; k < K; k++) {
                /* Decoys never equal the truth: truth + 1 + k modulo V, K < V. */
                tk[k] = t->mode == TD_ORACLE && k == 0 ? truth : (truth + 1 + k) % V;
                sc[k] = t->mode == TD_ORACLE ? (k == 0 ? 0.0f : -5.0f - (float)k) : -(float)k;
            }
        }
    }
    const size_t n = (size_t)ctx->B * D * K;
    memcpy(scores, t->sc, n * sizeof *scores);
    memcpy(tokens, t->tk, n * sizeof *tokens);
    return KDT_OK;
}

/* With wants_hidden: the kept rows' hidden states must be the reference sequence's. Row j of the
 * prefill is position j; kept tree row t of a step is position h0 - 1 + t (the root is h0 - 1). */
static kdt_status td_observe(void *state, const kdt_draft_ctx *ctx, const kdt_draft_feedback *fb) {
    tdraft *t = state;
    if (!fb->hidden) return KDT_OK;
    const int32_t H = t->rs->hid;
    for (int32_t b = 0; b < ctx->B; b++) {
        const int32_t s = ctx->slot[b], h0 = ctx->hist_len[b] - fb->n_new[b];
        const int32_t kept = fb->prefill ? fb->n_rows[b] : fb->accept_len[b] + 1;
        for (int32_t i = 0; i < kept; i++) {
            const int32_t row = fb->row_start[b] + (fb->prefill ? i : fb->accept_index[(size_t)b * fb->Q + i]);
            const int32_t pos = fb->prefill ? i : h0 - 1 + i;
            t->hidden_rows++;
            t->hidden_bad += memcmp(fb->hidden + (size_t)row * H, t->rs->hidden[s] + (size_t)pos * H, (size_t)H * sizeof(float)) != 0;
        }
    }
    return KDT_OK;
}

static void td_destroy(void *state) {
    tdraft *t = state;
    free(t->sc);
    free(t->tk);
}

static kdt_drafter td_make(tdraft *t, td_mode mode, const reqset *rs, int wants_hidden) {
    memset(t, 0, sizeof *t);
    t->mode = mode;
    t->rs = rs;
    static const char *names[] = {"oracle", "wrong", "random"};
    return (kdt_drafter){.name = names[mode], .state = t, .wants_hidden = wants_hidden, .begin = td_begin,
                         .propose = td_propose, .observe = td_observe, .destroy = td_destroy};
}

/* ---- one run against the reference ---- */

typedef struct expect {
    int exact_accept;           /* every step accepts min(D, N) (oracle, or the target as its own drafter with K = 1) */
    int no_accept;              /* nothing is ever accepted */
    int some_accept;            /* at least one draft token accepted over the run */
    int every_step_accepts;     /* each step accepts >= 1 (the target drafting for itself) */
} expect;

/* Runs the loop and checks the output and the statistics; returns 1 on success. */
static int run_check(const char *what, kdt_model *m, kdt_drafter *dr, const reqset *rs, int32_t D, int32_t K, int32_t N,
                     int pad, int32_t eos, expect ex, kdt_spec_stats *st_out) {
    kdt_spec_request req[8];
    int32_t *out[8];
    for (int32_t b = 0; b < rs->B; b++) {
        out[b] = malloc((size_t)rs->max_new[b] * sizeof(int32_t) + 1);
        for (int32_t i = 0; i < rs->max_new[b]; i++) out[b][i] = POISON;
        req[b] = (kdt_spec_request){.prompt = rs->seq[b], .prompt_len = rs->P[b], .max_new = rs->max_new[b], .out = out[b],
                                    .n_out = -1, .steps = -1, .accepted = -1};
    }
    const kdt_spec_params p = {.depth = D, .topk = K, .budget = N, .eos = eos, .pad_tree = pad};
    kdt_spec_stats st;
    kdt_status s = kdt_spec_generate(m, dr, &p, rs->B, req, &st, NULL);
    int ok = s == KDT_OK;
    if (!ok) kt_fail("%s: %s", what, kdt_last_error());
    char why[256] = "";
    int64_t tokens = 0, accepted = 0;
    const int32_t depth = dr ? (D < N ? D : N) : 0;
    for (int32_t b = 0; ok && b < rs->B; b++) {
        const int32_t *ref = rs->seq[b] + rs->P[b];
        int32_t want = rs->max_new[b];
        for (int32_t i = 0; eos >= 0 && i < want; i++)
            if (ref[i] == eos) want = i + 1;
        int32_t diff = -1;
        for (int32_t i = 0; i < want && diff < 0; i++)
            if (out[b][i] != ref[i]) diff = i;
        if (req[b].n_out != want || diff >= 0) {
            snprintf(why, sizeof why, "request %d: %d tokens (want %d), first difference at %d: got %d, want %d", b, req[b].n_out,
                     want, diff, diff >= 0 ? out[b][diff] : 0, diff >= 0 ? ref[diff] : 0);
            ok = 0;
        }
        tokens += req[b].n_out;
        accepted += req[b].accepted;
        const int32_t steps_exact = want > 1 ? (want - 1 + depth) / (depth + 1) : 0;
        if (ok && ex.exact_accept && (req[b].steps != steps_exact || req[b].accepted != (int64_t)req[b].steps * depth)) {
            snprintf(why, sizeof why, "request %d: %d steps accepting %d (want %d steps of %d)", b, req[b].steps, req[b].accepted,
                     steps_exact, depth);
            ok = 0;
        }
        if (ok && ex.every_step_accepts && req[b].accepted < req[b].steps) {
            snprintf(why, sizeof why, "request %d: %d steps accepted only %d", b, req[b].steps, req[b].accepted);
            ok = 0;
        }
        if (ok && (req[b].accepted < 0 || req[b].accepted > (int64_t)req[b].steps * depth)) {
            snprintf(why, sizeof why, "request %d: accepted %d over %d steps of depth %d", b, req[b].accepted, req[b].steps, depth);
            ok = 0;
        }
    }
    if (ok && (st.tokens != tokens || st.accepted != accepted || st.drafted < accepted || st.request_steps < st.steps)) {
        snprintf(why, sizeof why, "stats: tokens %lld (outputs %lld), accepted %lld (requests %lld), drafted %lld",
                 (long long)st.tokens, (long long)tokens, (long long)st.accepted, (long long)accepted, (long long)st.drafted);
        ok = 0;
    }
    if (ok && ex.no_accept && accepted != 0) snprintf(why, sizeof why, "accepted %lld draft tokens, want 0", (long long)accepted), ok = 0;
    if (ok && ex.some_accept && accepted == 0) snprintf(why, sizeof why, "accepted nothing"), ok = 0;
    if (s == KDT_OK)
        kt_check(ok, "%s D=%d K=%d N=%d %s%s: %lld tokens in %lld steps, mean accepted %.2f%s%s", what, D, K, N,
                 pad ? "padded" : "exact", eos >= 0 ? " eos" : "", (long long)st.tokens, (long long)st.steps,
                 st.request_steps ? (double)st.accepted / st.request_steps : 0.0, ok ? "" : ": ", why);
    if (st_out) *st_out = st;
    for (int32_t b = 0; b < rs->B; b++) free(out[b]);
    return ok;
}

/* ---- the settings swept ---- */

typedef struct setting {
    int32_t D, K, N;
} setting;

/* N = 1, chains (K = 1), wider than deep, deep, and in between. */
static const setting SWEEP[] = {{1, 1, 1}, {3, 2, 1}, {4, 1, 4}, {6, 1, 3}, {2, 8, 16}, {8, 2, 16},
                                {4, 4, 16}, {5, 3, 7}, {3, 3, 27}, {2, 4, 5}};
#define N_SWEEP (int32_t)(sizeof SWEEP / sizeof SWEEP[0])

static void sweep_drafters(const char *name, kdt_model *m, const reqset *rs, kdt_model *self_draft, kdt_model *small_draft,
                           int full) {
    char what[160];
    kdt_drafter *lk = NULL, *self = NULL, *small = NULL;
    if (kdt_drafter_lookup(&lk) || kdt_drafter_model(self_draft, &self) || (small_draft && kdt_drafter_model(small_draft, &small))) {
        kt_fail("%s: drafters: %s", name, kdt_last_error());
        goto done;
    }
    for (int32_t i = 0; i < N_SWEEP; i++) {
        if (!full && i % 3 != 0) continue;
        const setting st = SWEEP[i];
        const int pad = i % 2;
        tdraft t;
        kdt_drafter td;
        snprintf(what, sizeof what, "%s lookup", name);
        run_check(what, m, lk, rs, st.D, st.K, st.N, pad, -1, (expect){0}, NULL);
        snprintf(what, sizeof what, "%s model (the target itself)", name);
        run_check(what, m, self, rs, st.D, st.K, st.N, !pad, -1, (expect){.exact_accept = st.K == 1, .every_step_accepts = 1}, NULL);
        if (small) {
            snprintf(what, sizeof what, "%s model (%d-layer draft)", name, kdt_model_get_config(small_draft)->num_hidden_layers);
            run_check(what, m, small, rs, st.D, st.K, st.N, pad, -1, (expect){0}, NULL);
        }
        td = td_make(&t, TD_ORACLE, rs, 0);
        snprintf(what, sizeof what, "%s oracle", name);
        run_check(what, m, &td, rs, st.D, st.K, st.N, pad, -1, (expect){.exact_accept = 1}, NULL);
        td.destroy(td.state);
        td = td_make(&t, TD_WRONG, rs, 0);
        snprintf(what, sizeof what, "%s adversarial (never the true token)", name);
        run_check(what, m, &td, rs, st.D, st.K, st.N, !pad, -1, (expect){.no_accept = 1}, NULL);
        td.destroy(td.state);
        td = td_make(&t, TD_RANDOM, rs, 0);
        snprintf(what, sizeof what, "%s random proposals", name);
        run_check(what, m, &td, rs, st.D, st.K, st.N, pad, -1, (expect){0}, NULL);
        td.destroy(td.state);
    }
done:
    kdt_drafter_free(lk);
    kdt_drafter_free(self);
    kdt_drafter_free(small);
}

/* The hidden states observe gets, eos, and plain greedy through the loop. */
static void check_extras(const char *name, kdt_model *m, const reqset *rs) {
    char what[160];
    tdraft t;
    kdt_drafter td = td_make(&t, TD_RANDOM, rs, 1);
    snprintf(what, sizeof what, "%s random proposals, hidden states", name);
    for (int pad = 0; pad < 2; pad++)
        run_check(what, m, &td, rs, 3, 2, 5, pad, -1, (expect){0}, NULL);
    kt_check(t.hidden_rows > 0 && t.hidden_bad == 0, "%s: observe's hidden states of %lld kept rows equal the reference's (%lld differ)",
             name, (long long)t.hidden_rows, (long long)t.hidden_bad);
    td.destroy(td.state);
    td = td_make(&t, TD_ORACLE, rs, 0);
    const int32_t eos = rs->seq[0][rs->P[0] + rs->max_new[0] / 2];
    snprintf(what, sizeof what, "%s oracle", name);
    run_check(what, m, &td, rs, 4, 2, 8, 0, eos, (expect){0}, NULL);
    td.destroy(td.state);
    snprintf(what, sizeof what, "%s no drafter (greedy)", name);
    run_check(what, m, NULL, rs, 1, 1, 1, 0, -1, (expect){.no_accept = 1}, NULL);
}

/* ---- the lookup drafter against a brute-force count ---- */

/* Depth by depth: every earlier occurrence of the context's last n-gram (n = 4, 3, 2, 1, the first
 * with a match; no draft at all when depth 0's is a single token), its continuations ranked by
 * count, then by latest occurrence. */
static void lookup_brute(const int32_t *hist, int32_t h, int32_t D, int32_t K, float *sc, int32_t *tk) {
    int32_t *ctx = malloc((size_t)(h + D) * sizeof *ctx);
    memcpy(ctx, hist, (size_t)h * sizeof *ctx);
    for (int32_t i = 0; i < D * K; i++) sc[i] = -INFINITY, tk[i] = 0;
    for (int32_t d = 0; d < D; d++) {
        const int32_t len = h + d;
        int32_t cnt[64], last[64], tok[64], nc = 0, matches = 0, n = 4;
        for (; n >= 1 && matches == 0; n--) {
            if (len < n) continue;
            for (int32_t e = n - 1; e + 1 < h; e++) {
                if (memcmp(hist + e - n + 1, ctx + len - n, (size_t)n * sizeof *ctx) != 0) continue;
                int32_t c = 0;
                while (c < nc && tok[c] != hist[e + 1]) c++;
                if (c == nc) tok[nc] = hist[e + 1], cnt[nc] = 0, nc++;
                cnt[c]++;
                last[c] = e;
                matches++;
            }
        }
        if (matches == 0 || (d == 0 && n + 1 < 2)) break; /* n + 1: the n that matched */
        for (int32_t k = 0; k < K && k < nc; k++) {
            int32_t best = -1;
            for (int32_t c = 0; c < nc; c++)
                if (cnt[c] > 0 && (best < 0 || cnt[c] > cnt[best] || (cnt[c] == cnt[best] && last[c] > last[best]))) best = c;
            sc[d * K + k] = (float)log((double)cnt[best] / matches);
            tk[d * K + k] = tok[best];
            if (k == 0) ctx[len] = tok[best];
            cnt[best] = 0;
        }
    }
    free(ctx);
}

static void check_lookup_unit(void) {
    enum { B = 3, D = 4, K = 3, MAXH = 160 };
    kdt_drafter *lk = NULL;
    int ok = kdt_drafter_lookup(&lk) == KDT_OK;
    const kdt_draft_setup set = {.slots = B, .max_len = MAXH, .D = D, .K = K, .vocab_size = 8, .backend = KDT_BACKEND_CPU};
    ok = ok && lk->begin(lk->state, &set) == KDT_OK;
    int32_t hist[B][MAXH], len[B], slot[B] = {0, 1, 2}, n_new[B], acc[B] = {0};
    const int32_t *hp[B] = {hist[0], hist[1], hist[2]};
    float sc[B * D * K], want_sc[D * K];
    int32_t tk[B * D * K], want_tk[D * K];
    int64_t cells = 0, bad = 0, finite = 0;
    for (int32_t b = 0; b < B; b++) {
        len[b] = 1 + rnd_below(12);
        for (int32_t i = 0; i < MAXH; i++) hist[b][i] = rnd_below(b == 2 ? 3 : 6); /* small alphabets: many matches */
        n_new[b] = len[b];
    }
    kdt_draft_ctx ctx = {.B = B, .slot = slot, .history = hp, .hist_len = len};
    kdt_draft_feedback fb = {.prefill = 1, .n_new = n_new, .accept_len = acc};
    ok = ok && lk->observe(lk->state, &ctx, &fb) == KDT_OK;
    fb.prefill = 0;
    for (int step = 0; ok && step < 30; step++) {
        ok = lk->propose(lk->state, &ctx, sc, tk) == KDT_OK;
        for (int32_t b = 0; ok && b < B; b++) {
            lookup_brute(hist[b], len[b], D, K, want_sc, want_tk);
            for (int32_t i = 0; i < D * K; i++) {
                const float *g = &sc[b * D * K + i];
                cells++;
                finite += isfinite(want_sc[i]) != 0;
                if ((isfinite(want_sc[i]) && (*g != want_sc[i] || tk[b * D * K + i] != want_tk[i])) ||
                    (!isfinite(want_sc[i]) && *g != -INFINITY))
                    bad++;
            }
            n_new[b] = 1 + rnd_below(4);
            if (len[b] + n_new[b] > MAXH) n_new[b] = 0;
            len[b] += n_new[b];
        }
        ok = ok && lk->observe(lk->state, &ctx, &fb) == KDT_OK;
    }
    if (!ok) kt_fail("lookup drafter: %s", kdt_last_error());
    else kt_check(bad == 0 && finite > cells / 4, "lookup drafter: %lld candidate cells (%lld finite) equal a brute-force count (%lld differ)",
                  (long long)cells, (long long)finite, (long long)bad);
    kdt_drafter_free(lk);
}

/* ---- the model drafter against a fresh draft forward ---- */

/* Wraps the model drafter: after each propose, recomputes every request's candidates with the
 * draft model from an empty cache (the history, then its greedy chain) and counts differences. */
typedef struct wrap {
    kdt_drafter *inner;
    kdt_model *draft;
    kdt_draft_setup set;
    int64_t cells, bad;
} wrap;

static kdt_status wrap_begin(void *state, const kdt_draft_setup *set) {
    wrap *w = state;
    w->set = *set;
    return w->inner->begin(w->inner->state, set);
}

static kdt_status wrap_propose(void *state, const kdt_draft_ctx *ctx, float *scores, int32_t *tokens) {
    wrap *w = state;
    kdt_status s = w->inner->propose(w->inner->state, ctx, scores, tokens);
    const int32_t D = w->set.D, K = w->set.K, V = w->set.vocab_size;
    float *logits = malloc((size_t)V * sizeof *logits);
    int32_t *seq = malloc(((size_t)w->set.max_len + D) * sizeof *seq);
    for (int32_t b = 0; s == KDT_OK && b < ctx->B; b++) {
        kdt_cache *c = NULL;
        const int32_t h = ctx->hist_len[b], req = 0;
        memcpy(seq, ctx->history[b], (size_t)h * sizeof *seq);
        s = kdt_cache_create(w->draft, 1, h + D, 0, &c);
        for (int32_t d = 0, fed = 0; s == KDT_OK && d < D; d++) {
            const int32_t rows = h + d - fed;
            const kdt_batch bt = {.B = 1, .req = &req, .n_rows = &rows, .tokens = seq + fed, .logits_rows = KDT_LOGITS_LAST};
            if ((s = kdt_model_forward(w->draft, c, &bt, logits, NULL, NULL)) != KDT_OK) break;
            fed += rows;
            /* Independent top-K: K passes of the best not yet taken, log-softmax in double. */
            double mx = -INFINITY, sum = 0;
            for (int32_t v = 0; v < V; v++) mx = logits[v] > mx ? logits[v] : mx;
            for (int32_t v = 0; v < V; v++) sum += exp((double)logits[v] - mx);
            for (int32_t k = 0; k < K; k++) {
                int32_t best = -1;
                for (int32_t v = 0; v < V; v++)
                    if (logits[v] != -INFINITY && (best < 0 || logits[v] > logits[best])) best = v;
                const size_t at = ((size_t)b * D + d) * K + k;
                const float want = (float)((double)logits[best] - (mx + log(sum)));
                w->cells++;
                w->bad += tokens[at] != best || fabsf(scores[at] - want) > 1e-6f;
                if (k == 0) seq[h + d] = best;
                logits[best] = -INFINITY;
            }
        }
        kdt_cache_free(c);
    }
    free(logits);
    free(seq);
    return s;
}

static kdt_status wrap_observe(void *state, const kdt_draft_ctx *ctx, const kdt_draft_feedback *fb) {
    wrap *w = state;
    return w->inner->observe(w->inner->state, ctx, fb);
}

static void check_model_drafter_unit(const char *name, kdt_model *m, kdt_model *draft, const reqset *rs) {
    wrap w = {.draft = draft};
    if (kdt_drafter_model(draft, &w.inner) != KDT_OK) {
        kt_fail("%s: model drafter: %s", name, kdt_last_error());
        return;
    }
    kdt_drafter d = {.name = "wrapped model", .state = &w, .begin = wrap_begin, .propose = wrap_propose, .observe = wrap_observe};
    char what[160];
    snprintf(what, sizeof what, "%s model drafter (checked against fresh draft forwards)", name);
    run_check(what, m, &d, rs, 4, 3, 9, 0, -1, (expect){0}, NULL);
    kt_check(w.cells > 0 && w.bad == 0, "%s: the model drafter's %lld candidates after cache rollbacks equal a fresh draft forward's (%lld differ)",
             name, (long long)w.cells, (long long)w.bad);
    kdt_drafter_free(w.inner);
}

/* ---- models ---- */

static void check_builtin(void) {
    kdt_model *m = NULL, *other = NULL;
    if (kdt_model_builtin(11, KDT_BACKEND_CPU, &m) || kdt_model_builtin(12, KDT_BACKEND_CPU, &other)) {
        kt_fail("builtin: %s", kdt_last_error());
        kdt_model_free(m);
        return;
    }
    reqset rs;
    const int32_t P[3] = {5, 12, 19}, max_new[3] = {11, 16, 7};
    if (reqset_make(m, &rs, 3, P, max_new, NULL) != KDT_OK) {
        kt_fail("builtin: reference: %s", kdt_last_error());
    } else {
        tdraft t;
        kdt_drafter *lkp = NULL, *self = NULL, *oth = NULL;
        if (kdt_drafter_lookup(&lkp) || kdt_drafter_model(m, &self) || kdt_drafter_model(other, &oth)) {
            kt_fail("builtin: drafters: %s", kdt_last_error());
        } else {
            run_check("builtin lookup", m, lkp, &rs, 4, 2, 8, 0, -1, (expect){0}, NULL);
            run_check("builtin model (the target itself)", m, self, &rs, 4, 1, 4, 1, -1, (expect){.exact_accept = 1}, NULL);
            run_check("builtin model (another seed)", m, oth, &rs, 3, 2, 6, 0, -1, (expect){0}, NULL);
            kdt_drafter td = td_make(&t, TD_WRONG, &rs, 0);
            run_check("builtin adversarial (never the true token)", m, &td, &rs, 8, 2, 16, 1, -1, (expect){.no_accept = 1}, NULL);
            td.destroy(td.state);
            td = td_make(&t, TD_RANDOM, &rs, 0);
            run_check("builtin random proposals", m, &td, &rs, 2, 8, 16, 0, -1, (expect){0}, NULL);
            td.destroy(td.state);
            td = td_make(&t, TD_ORACLE, &rs, 0);
            run_check("builtin oracle", m, &td, &rs, 3, 3, 9, 1, -1, (expect){.exact_accept = 1}, NULL);
            td.destroy(td.state);
            run_check("builtin no drafter (greedy)", m, NULL, &rs, 1, 1, 1, 0, -1, (expect){.no_accept = 1}, NULL);
        }
        kdt_drafter_free(lkp);
        kdt_drafter_free(self);
        kdt_drafter_free(oth);
    }
    reqset_free(&rs);
    kdt_model_free(m);
    kdt_model_free(other);
}

/* A fixture: its prompt is request 0 (its continuation must be transformers'), two more prompts
 * of other lengths; the draft models are the target itself and the target cut to 1 layer. */
static void check_fixture(const char *dir, int full) {
    const char *name = kt_basename(dir);
    char path[1100];
    snprintf(path, sizeof path, "%s/expected.kdtr", dir);
    kdt_kdtr *exp = NULL;
    kdt_model *m = NULL, *small = NULL;
    kdt_tensor_view prompt, cont;
    kdt_status s = kdt_kdtr_open_file(path, &exp);
    if (s == KDT_OK) s = kdt_kdtr_find_typed(exp, "prompt", KDT_I32, 1, NULL, &prompt);
    if (s == KDT_OK) s = kdt_kdtr_find_typed(exp, "continuation", KDT_I32, 1, NULL, &cont);
    if (s == KDT_OK) s = kdt_model_load(dir, KDT_BACKEND_CPU, &m);
    if (s == KDT_OK) s = kdt_draft_model_load(dir, 1, KDT_BACKEND_CPU, &small);
    if (s != KDT_OK) {
        kt_fail("fixture %s: %s", name, kdt_last_error());
        goto done;
    }
    reqset rs;
    const int32_t P0 = (int32_t)prompt.numel, N0 = (int32_t)cont.numel;
    const int32_t P[3] = {P0, 3 + rnd_below(4), P0 + 5 + rnd_below(8)}, max_new[3] = {N0 < 24 ? N0 : 24, 17, 9};
    if (reqset_make(m, &rs, 3, P, max_new, prompt.data) != KDT_OK) {
        kt_fail("fixture %s: reference: %s", name, kdt_last_error());
        reqset_free(&rs);
        goto done;
    }
    kt_check(memcmp(rs.seq[0] + P0, cont.data, (size_t)max_new[0] * sizeof(int32_t)) == 0,
             "fixture %s: the reference greedy continuation is transformers' (%d tokens)", name, max_new[0]);
    kt_check(kdt_model_get_config(small)->num_hidden_layers == 1, "fixture %s: kdt_draft_model_load keeps 1 of %d layers", name,
             kdt_model_get_config(m)->num_hidden_layers);
    sweep_drafters(name, m, &rs, m, small, full);
    if (full) {
        check_extras(name, m, &rs);
        check_model_drafter_unit(name, m, small, &rs);
    }
    reqset_free(&rs);
done:
    kdt_model_free(m);
    kdt_model_free(small);
    kdt_kdtr_close(exp);
}

/* On a prompt whose greedy continuation falls into a loop (random models do), lookup accepts. */
static void check_lookup_repetitive(const char *dir) {
    kdt_model *m = NULL;
    if (kdt_model_load(dir, KDT_BACKEND_CPU, &m) != KDT_OK) {
        kt_fail("lookup repetitive: %s", kdt_last_error());
        return;
    }
    reqset rs;
    const int32_t P[2] = {12, 8}, max_new[2] = {96, 64};
    const int32_t prompt[12] = {5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8};
    kdt_drafter *lk = NULL;
    if (reqset_make(m, &rs, 2, P, max_new, prompt) != KDT_OK || kdt_drafter_lookup(&lk) != KDT_OK) {
        kt_fail("lookup repetitive: %s", kdt_last_error());
    } else {
        kdt_spec_stats st;
        if (run_check("lookup on a looping continuation", m, lk, &rs, 6, 2, 12, 0, -1, (expect){.some_accept = 1}, &st))
            kt_check(st.steps < 96 - 1, "lookup on a looping continuation: %lld steps for 96 + 64 tokens (mean accepted %.2f)",
                     (long long)st.steps, (double)st.accepted / st.request_steps);
    }
    kdt_drafter_free(lk);
    reqset_free(&rs);
    kdt_model_free(m);
}

/* A drafter whose first candidate is outside the vocabulary. */
static kdt_status bad_begin(void *state, const kdt_draft_setup *set) {
    *(kdt_draft_setup *)state = *set;
    return KDT_OK;
}
static kdt_status bad_propose(void *state, const kdt_draft_ctx *ctx, float *scores, int32_t *tokens) {
    const kdt_draft_setup *set = state;
    for (int32_t i = 0; i < ctx->B * set->D * set->K; i++) {
        scores[i] = i % set->K == 0 ? 0.0f : -INFINITY;
        tokens[i] = set->vocab_size + 5;
    }
    return KDT_OK;
}
static kdt_status bad_observe(void *state, const kdt_draft_ctx *ctx, const kdt_draft_feedback *fb) {
    (void)state, (void)ctx, (void)fb;
    return KDT_OK;
}

/* Refusals: bad parameters name the field; a drafter proposing tokens outside the vocabulary
 * is refused by the forward, never a crash. */
static void check_refusals(void) {
    kdt_model *m = NULL;
    if (kdt_model_builtin(3, KDT_BACKEND_CPU, &m) != KDT_OK) {
        kt_fail("refusals: %s", kdt_last_error());
        return;
    }
    int32_t prompt[3] = {1, 2, 3}, out[4];
    kdt_spec_request r = {.prompt = prompt, .prompt_len = 3, .max_new = 4, .out = out};
    kdt_drafter *lk = NULL;
    kdt_drafter_lookup(&lk);
    kdt_spec_params p = {.depth = 0, .topk = 2, .budget = 4, .eos = -1};
    kdt_status s = kdt_spec_generate(m, lk, &p, 1, &r, NULL, NULL);
    kt_check(s == KDT_ERR_INVALID_ARG && strstr(kdt_last_error(), "depth"), "depth 0 is refused: %s", kdt_last_error());
    p = (kdt_spec_params){.depth = 2, .topk = 2, .budget = 1025, .eos = -1};
    s = kdt_spec_generate(m, lk, &p, 1, &r, NULL, NULL);
    kt_check(s == KDT_ERR_INVALID_ARG && strstr(kdt_last_error(), "budget"), "budget 1025 is refused: %s", kdt_last_error());
    r.prompt_len = 0;
    p.budget = 4;
    s = kdt_spec_generate(m, lk, &p, 1, &r, NULL, NULL);
    kt_check(s == KDT_ERR_INVALID_ARG && strstr(kdt_last_error(), "prompt_len"), "an empty prompt is refused: %s", kdt_last_error());
    kdt_draft_setup bad_state;
    kdt_drafter bad = {.name = "out of vocabulary", .state = &bad_state, .begin = bad_begin, .propose = bad_propose,
                       .observe = bad_observe};
    r.prompt_len = 3;
    p = (kdt_spec_params){.depth = 2, .topk = 2, .budget = 3, .eos = -1};
    s = kdt_spec_generate(m, &bad, &p, 1, &r, NULL, NULL);
    kt_check(s == KDT_ERR_INVALID_ARG && strstr(kdt_last_error(), "517") && r.n_out == 1,
             "a drafter proposing token 517 of a 512-token vocabulary is refused after the first token: %s", kdt_last_error());
    kdt_model *big = NULL;
    s = kdt_draft_model_load(fixture_root(), 1, KDT_BACKEND_CPU, &big);
    kt_check(s != KDT_OK && !big, "a folder without config.json is refused as a draft model: %s", kdt_last_error());
    kdt_drafter_free(lk);
    kdt_model_free(m);
}

/* ---- CUDA ---- */

/* The loop's argmax and top-K kernels against the host versions, on rows with ties, -inf and
 * NaN, at the built-in vocabulary, at one not a multiple of 4 (the argmax's scalar reads) and at
 * Kimi K2's. */
static void check_kernels_cuda(void) {
    if (!kt_backend_usable(KDT_BACKEND_CUDA, "spec argmax / top-k kernels")) return;
    const int32_t Vs[3] = {512, 509, 163840}, R = 6, K = 8;
    for (int v = 0; v < 3; v++) {
        const int32_t V = Vs[v];
        float *x = malloc((size_t)R * V * sizeof *x), sc[R * K], dsc[R * K];
        int32_t am[R], dam[R], tk[R * K], dtk[R * K], top1[R];
        for (int64_t i = 0; i < (int64_t)R * V; i++) x[i] = (float)(rnd_below(2000) - 1000) / 64.0f; /* many ties */
        for (int32_t j = 0; j < V; j += 7) x[j] = NAN;                /* row 0: NaNs */
        for (int32_t j = 0; j < V; j++) x[(int64_t)V + j] = -INFINITY; /* row 1: all -inf but 3 */
        x[(int64_t)V + 5] = 1, x[(int64_t)V + 9] = 1, x[(int64_t)V + V - 1] = 2;
        for (int32_t j = 0; j < V; j++) x[(int64_t)2 * V + j] = NAN;   /* row 2: all NaN */
        kdt_spec_argmax_host(x, R, V, am);
        kdt_spec_topk_host(x, R, V, K, sc, tk, K);
        float *dx = NULL, *ds = NULL;
        int32_t *dp = NULL, *dt = NULL, *d1 = NULL;
        kdt_status s = kdt_dev_alloc((void **)&dx, (size_t)R * V * sizeof *dx);
        if (s == KDT_OK) s = kdt_dev_alloc((void **)&ds, sizeof dsc);
        if (s == KDT_OK) s = kdt_dev_alloc((void **)&dp, sizeof dam);
        if (s == KDT_OK) s = kdt_dev_alloc((void **)&dt, sizeof dtk);
        if (s == KDT_OK) s = kdt_dev_alloc((void **)&d1, sizeof top1);
        if (s == KDT_OK) s = kdt_dev_h2d(dx, x, (size_t)R * V * sizeof *dx);
        if (s == KDT_OK) s = kdt_spec_argmax_cuda(dx, V, R, 1, NULL, dp, NULL);
        if (s == KDT_OK) s = kdt_spec_topk_cuda(dx, R, V, K, ds, dt, K, d1, NULL);
        if (s == KDT_OK) s = kdt_dev_d2h(dam, dp, sizeof dam);
        if (s == KDT_OK) s = kdt_dev_d2h(dsc, ds, sizeof dsc);
        if (s == KDT_OK) s = kdt_dev_d2h(dtk, dt, sizeof dtk);
        if (s == KDT_OK) s = kdt_dev_d2h(top1, d1, sizeof top1);
        if (s != KDT_OK) {
            kt_fail("spec kernels [cuda] V=%d: %s", V, kdt_last_error());
        } else {
            int bad_am = 0, bad_tk = 0;
            double worst = 0;
            for (int32_t r = 0; r < R; r++) {
                bad_am += am[r] != dam[r];
                bad_tk += top1[r] != tk[r * K];
                for (int32_t k = 0; k < K; k++) {
                    const int32_t i = r * K + k;
                    bad_tk += tk[i] != dtk[i] || isfinite(sc[i]) != isfinite(dsc[i]);
                    if (isfinite(sc[i])) worst = fmax(worst, fabs((double)sc[i] - dsc[i]));
                }
            }
            kt_check(bad_am == 0 && bad_tk == 0 && worst <= 1e-5,
                     "spec kernels [cuda] V=%d: argmax (%d differ) and top-%d tokens (%d differ) equal the host's, scores within %.1e",
                     V, bad_am, K, bad_tk, worst);
        }
        kdt_dev_free(dx); kdt_dev_free(ds); kdt_dev_free(dp); kdt_dev_free(dt); kdt_dev_free(d1);
        free(x);
    }
}

/* The gap |logit[a] - logit[b]| of the CPU reference after prompt + out[0 .. i). */
static double cpu_gap(kdt_model *cpu, const int32_t *prompt, int32_t P, const int32_t *out, int32_t i, int32_t a, int32_t b) {
    const int32_t V = kdt_model_get_config(cpu)->vocab_size, n = P + i, req = 0;
    int32_t *seq = malloc((size_t)n * sizeof *seq);
    float *logits = malloc((size_t)V * sizeof *logits);
    memcpy(seq, prompt, (size_t)P * sizeof *seq);
    memcpy(seq + P, out, (size_t)i * sizeof *seq);
    kdt_cache *c = NULL;
    const kdt_batch bt = {.B = 1, .req = &req, .n_rows = &n, .tokens = seq, .logits_rows = KDT_LOGITS_LAST};
    double gap = INFINITY;
    if (kdt_cache_create(cpu, 1, n, 0, &c) == KDT_OK && kdt_model_forward(cpu, c, &bt, logits, NULL, NULL) == KDT_OK)
        gap = fabs((double)logits[a] - logits[b]);
    kdt_cache_free(c);
    free(seq);
    free(logits);
    return gap;
}

/* got against want for each request: equal, or parting only where the CPU reference has a near
 * tie (gap <= tol) between the two tokens. Prints each parting. */
static int same_or_near_tie(kdt_model *cpu, const char *what, int32_t B, int32_t *const *prompts, const int32_t *P,
                            int32_t *const *got, int32_t *const *want, const int32_t *n, double tol) {
    int ok = 1;
    for (int32_t b = 0; b < B; b++) {
        int32_t i = 0;
        while (i < n[b] && got[b][i] == want[b][i]) i++;
        if (i == n[b]) continue;
        const double gap = cpu_gap(cpu, prompts[b], P[b], want[b], i, got[b][i], want[b][i]);
        printf("        %s, request %d: parts at token %d of %d (%d vs %d), CPU logit gap %.2e\n", what, b, i, n[b], got[b][i],
               want[b][i], gap);
        ok &= gap <= tol;
    }
    return ok;
}

/* Lookup with its candidates copied to device memory (host_candidates 0): the loop then builds and
 * accepts its trees with the CUDA kernels, where the lookup drafter itself has them built and
 * accepted on the host. */
typedef struct devlk {
    kdt_drafter *inner;
    size_t dk;                  /* D * K */
    float *sc;                  /* [slots, D, K] host staging */
    int32_t *tk;
} devlk;

static kdt_status devlk_begin(void *state, const kdt_draft_setup *set) {
    devlk *w = state;
    free(w->sc);
    free(w->tk);
    w->dk = (size_t)set->D * set->K;
    w->sc = malloc(set->slots * w->dk * sizeof *w->sc);
    w->tk = malloc(set->slots * w->dk * sizeof *w->tk);
    return w->sc && w->tk ? w->inner->begin(w->inner->state, set) : KDT_ERR_NOMEM;
}

static kdt_status devlk_propose(void *state, const kdt_draft_ctx *ctx, float *scores, int32_t *tokens) {
    devlk *w = state;
    kdt_status s = w->inner->propose(w->inner->state, ctx, w->sc, w->tk);
    const size_t n = (size_t)ctx->B * w->dk;
    if (s == KDT_OK) s = kdt_dev_h2d(scores, w->sc, n * sizeof *scores);
    return s == KDT_OK ? kdt_dev_h2d(tokens, w->tk, n * sizeof *tokens) : s;
}

static kdt_status devlk_observe(void *state, const kdt_draft_ctx *ctx, const kdt_draft_feedback *fb) {
    devlk *w = state;
    return w->inner->observe(w->inner->state, ctx, fb);
}

/* The lookup run just made (req's outputs, stats) again with its trees built and accepted on the
 * device: the same tokens, steps and acceptance, bit for bit. */
static void check_device_tree(kdt_model *m, kdt_drafter *lk, const kdt_spec_params *p, int32_t B, const kdt_spec_request *req,
                              const kdt_spec_stats *st, const char *what) {
    devlk w = {.inner = lk};
    kdt_drafter d = {.name = "lookup (device tree)", .state = &w, .begin = devlk_begin, .propose = devlk_propose,
                     .observe = devlk_observe};
    kdt_spec_request r2[8];
    int32_t out[8][64];
    int same = B <= 8;
    for (int32_t b = 0; same && b < B; b++) {
        same = req[b].max_new <= 64;
        r2[b] = req[b];
        r2[b].out = out[b];
        for (int32_t i = 0; i < 64; i++) out[b][i] = POISON;
    }
    kdt_spec_stats st2;
    kdt_status s = same ? kdt_spec_generate(m, &d, p, B, r2, &st2, NULL) : KDT_ERR_INVALID_ARG;
    for (int32_t b = 0; s == KDT_OK && same && b < B; b++)
        same = r2[b].n_out == req[b].n_out && !memcmp(out[b], req[b].out, (size_t)req[b].n_out * sizeof **out);
    if (s != KDT_OK) kt_fail("%s, trees on the device: %s", what, kdt_last_error());
    else kt_check(same && st2.steps == st->steps && st2.accepted == st->accepted && st2.drafted == st->drafted,
                  "%s: trees built and accepted on the device give the host's tokens, %lld steps (%lld), %lld accepted (%lld)",
                  what, (long long)st2.steps, (long long)st->steps, (long long)st2.accepted, (long long)st->accepted);
    free(w.sc);
    free(w.tk);
}

/* On the device, f32 and bf16: speculative decoding against plain greedy decoding on the same
 * device, and greedy against the CPU model of the same dtype (bf16: the CPU's emulation, which rounds
 * what the device stores in bf16), each equal or parting only at a near-tie. */
static void check_cuda(void) {
    check_kernels_cuda();
    if (!kt_backend_usable(KDT_BACKEND_CUDA, "speculative loop")) return;
    enum { B = 3, NEW = 40 };
    const kdt_dtype dts[2] = {KDT_F32, KDT_BF16};
    kdt_model *cpus[2] = {NULL, NULL};
    if (kdt_model_builtin_as(11, KDT_BACKEND_CPU, dts[0], &cpus[0]) != KDT_OK ||
        kdt_model_builtin_as(11, KDT_BACKEND_CPU, dts[1], &cpus[1]) != KDT_OK) {
        kt_fail("speculative loop [cuda]: %s", kdt_last_error());
        kdt_model_free(cpus[0]);
        return;
    }
    int32_t prompt_buf[B][24], *prompts[B], P[B], n_ref[B];
    for (int32_t b = 0; b < B; b++) {
        prompts[b] = prompt_buf[b];
        P[b] = 8 + 8 * b;
        for (int32_t i = 0; i < P[b]; i++) prompt_buf[b][i] = i >= 4 && rnd_below(3) ? prompt_buf[b][i - 4] : rnd_below(512);
    }
    static int32_t out_buf[2][B][NEW];
    int32_t *ref[B], *got[B];
    for (int32_t b = 0; b < B; b++) ref[b] = out_buf[0][b], got[b] = out_buf[1][b];
    /* The CPU's greedy output, the reference of the device's. */
    int32_t cpu_out[B][NEW], *cpu_ref[B];
    for (int32_t b = 0; b < B; b++) cpu_ref[b] = cpu_out[b];
    /* bf16: the device and the emulation round the same values but sum in other orders (logits of
     * std ~1.1); a gap past 0.05 is a different computation, not rounding. */
    const double tol[2] = {1e-3, 0.05};
    const setting set[5] = {{4, 2, 8}, {4, 1, 4}, {2, 8, 16}, {8, 2, 16}, {5, 3, 12}};
    const char *names[5] = {"lookup", "model (itself) K=1", "model (itself) wide", "model (itself) deep", "model (itself)"};
    for (int v = 0; v < 2; v++) {
        kdt_model *m = NULL;
        kdt_status s = kdt_model_builtin_as(11, KDT_BACKEND_CUDA, dts[v], &m);
        if (s != KDT_OK) {
            kt_fail("speculative loop [cuda %s]: %s", kdt_dtype_name(dts[v]), kdt_last_error());
            continue;
        }
        kdt_drafter *lk = NULL, *self = NULL;
        kdt_drafter_lookup(&lk);
        kdt_drafter_model(m, &self);
        kdt_model *cpu = cpus[v];
        for (int r = -1; r < 5 && s == KDT_OK; r++) {
            kdt_spec_request req[B];
            for (int32_t b = 0; b < B; b++)
                req[b] = (kdt_spec_request){.prompt = prompts[b], .prompt_len = P[b], .max_new = NEW - 8 * b, .out = r < 0 ? ref[b] : got[b]};
            const setting st = r < 0 ? (setting){1, 1, 1} : set[r];
            const kdt_spec_params p = {.depth = st.D, .topk = st.K, .budget = st.N, .eos = -1, .pad_tree = r != 4};
            kdt_spec_stats stats;
            if ((s = kdt_spec_generate(m, r < 0 ? NULL : r == 0 ? lk : self, &p, B, req, &stats, NULL)) != KDT_OK) {
                kt_fail("speculative loop [cuda %s] %s: %s", kdt_dtype_name(dts[v]), r < 0 ? "greedy" : names[r], kdt_last_error());
                break;
            }
            char what[160];
            for (int32_t b = 0; b < B; b++) n_ref[b] = req[b].n_out;
            if (r < 0) {
                for (int32_t b = 0; b < B; b++) req[b].out = cpu_out[b];
                if (kdt_spec_generate(cpu, NULL, &p, B, req, NULL, NULL) != KDT_OK) {
                    kt_fail("speculative loop [cpu %s reference]: %s", kdt_dtype_name(dts[v]), kdt_last_error());
                    break;
                }
                snprintf(what, sizeof what, "greedy [cuda %s] vs [cpu %s]", kdt_dtype_name(dts[v]), kdt_dtype_name(dts[v]));
                kt_check(same_or_near_tie(cpu, what, B, prompts, P, ref, cpu_ref, n_ref, tol[v]),
                         "%s: equal, or parting only at a near-tie (gap <= %.0e)", what, tol[v]);
                continue;
            }
            snprintf(what, sizeof what, "speculative [cuda %s] %s D=%d K=%d N=%d %s", kdt_dtype_name(dts[v]), names[r], st.D, st.K,
                     st.N, p.pad_tree ? "padded" : "exact");
            kt_check(same_or_near_tie(cpu, what, B, prompts, P, got, ref, n_ref, tol[v]) && (r == 0 || stats.accepted > 0),
                     "%s: equals greedy on the device, or parts only at a near-tie; mean accepted %.2f", what,
                     (double)stats.accepted / (stats.request_steps ? stats.request_steps : 1));
            if (r == 0) check_device_tree(m, lk, &p, B, req, &stats, what);
        }
        kdt_drafter_free(lk);
        kdt_drafter_free(self);
        kdt_model_free(m);
    }
    kdt_model_free(cpus[0]);
    kdt_model_free(cpus[1]);
}

int main(void) {
    const char *env = getenv("KDT_SEED");
    rng_state = env && *env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) ^ (uint64_t)getpid() << 20;
    printf("test_spec: random seed %llu (KDT_SEED replays it)\n", (unsigned long long)rng_state);
    check_lookup_unit();
    check_refusals();
    const char *fixtures[] = {"yarn", "moe_freq", "qproj_tied", "tf5", "bf16", "sharded"};
    char dir[1024];
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) {
        snprintf(dir, sizeof dir, "%s/%s", fixture_root(), fixtures[i]);
        if (access(dir, R_OK) != 0) {
            kt_skip("fixture %s: not found under %s", fixtures[i], fixture_root());
            continue;
        }
        check_fixture(dir, i < 2);
        if (i == 0) check_lookup_repetitive(dir);
    }
    check_builtin();
    check_cuda();
    return kt_exit_code();
}
