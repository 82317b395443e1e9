/* The MTP drafter (src/spec/mtp.c) and the MTP layer (kdt_model_load_mtp) on the tiny DeepSeek-V3
 * checkpoint with one MTP layer, tests/fixtures/mtp (python/make_mtp_fixture.py):
 *  - the target's final hidden states against transformers', and the MTP layer's logits over
 *    (h_i, t_{i+1}) rows against python/mtp_ref.py;
 *  - the loader's refusals (no MTP layer, a partial one, CUDA) and a forward without mtp_hidden;
 *  - speculative decoding with it equals plain greedy for several (D, K, N), batch 3, and every
 *    proposal inside the loop equals a fresh drafter's over a fresh target forward of the history.
 * CPU only: the MTP path has no CUDA side yet. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "kdt/kdtr.h"
#include "kdt/spec.h"

static char fx_root[1024], mtp_dir[1100];

static float max_rel_diff(const float *a, const float *b, int64_t n) {
    float m = 0.0f, scale = 0.0f;
    for (int64_t i = 0; i < n; i++) scale = fmaxf(scale, fabsf(b[i]));
    for (int64_t i = 0; i < n; i++) m = fmaxf(m, fabsf(a[i] - b[i]));
    return m / (scale > 0 ? scale : 1.0f);
}

/* Target forward over tokens [n] in a fresh cache: the final hidden states [n, hid]. */
static kdt_status target_hidden(kdt_model *m, const int32_t *tokens, int32_t n, float *hidden) {
    kdt_cache *c = NULL;
    kdt_status s = kdt_cache_create(m, 1, n + 1, 0, &c);
    const int32_t req = 0;
    const kdt_batch bt = {.B = 1, .req = &req, .n_rows = &n, .tokens = tokens, .logits_rows = KDT_LOGITS_LAST};
    if (s == KDT_OK) s = kdt_model_forward(m, c, &bt, NULL, hidden, NULL);
    kdt_cache_free(c);
    return s;
}

static void check_reference(kdt_model *target) {
    char path[1200];
    snprintf(path, sizeof path, "%s/expected.kdtr", mtp_dir);
    kdt_kdtr *exp = NULL;
    kdt_tensor_view prompt, hid, logits;
    kdt_status s = kdt_kdtr_open_file(path, &exp);
    if (s == KDT_OK) s = kdt_kdtr_find_typed(exp, "prompt", KDT_I32, 1, NULL, &prompt);
    if (s == KDT_OK) s = kdt_kdtr_find_typed(exp, "hidden", KDT_F32, 2, NULL, &hid);
    if (s == KDT_OK) s = kdt_kdtr_find_typed(exp, "logits", KDT_F32, 2, NULL, &logits);
    kdt_model *mtp = NULL;
    if (s == KDT_OK) s = kdt_model_load_mtp(mtp_dir, KDT_BACKEND_CPU, &mtp);
    if (s != KDT_OK) {
        kt_fail("mtp reference: %s", kdt_last_error());
        kdt_kdtr_close(exp);
        return;
    }
    const int32_t P = (int32_t)prompt.dims[0], H = (int32_t)hid.dims[1], V = (int32_t)logits.dims[1], n = P - 1;
    float *h = malloc((size_t)P * H * sizeof *h), *lg = malloc((size_t)n * V * sizeof *lg);
    s = target_hidden(target, prompt.data, P, h);
    const float he = s == KDT_OK ? max_rel_diff(h, hid.data, (int64_t)P * H) : INFINITY;
    kt_check(he < 1e-5f, "target final hidden states against transformers': max rel diff %.2e", he);
    kdt_cache *c = NULL;
    const int32_t req = 0;
    const kdt_batch bt = {.B = 1, .req = &req, .n_rows = &n, .tokens = (const int32_t *)prompt.data + 1,
                          .logits_rows = KDT_LOGITS_ALL, .mtp_hidden = hid.data};
    s = kdt_cache_create(mtp, 1, P, 0, &c);
    if (s == KDT_OK) s = kdt_model_forward(mtp, c, &bt, lg, NULL, NULL);
    const float le = s == KDT_OK ? max_rel_diff(lg, logits.data, (int64_t)n * V) : INFINITY;
    kt_check(le < 1e-5f, "MTP layer logits of %d rows (h_i, t_i+1) against the PyTorch reference: max rel diff %.2e%s%s", n, le,
             s == KDT_OK ? "" : ": ", s == KDT_OK ? "" : kdt_last_error());
    const kdt_batch no_h = {.B = 1, .req = &req, .n_rows = &n, .tokens = (const int32_t *)prompt.data + 1, .logits_rows = KDT_LOGITS_ALL};
    kdt_cache_reset(c, 0);
    s = kdt_model_forward(mtp, c, &no_h, lg, NULL, NULL);
    kt_check(s == KDT_ERR_INVALID_ARG, "an MTP forward without mtp_hidden is refused (%s)", kdt_last_error());
    kdt_cache_free(c);
    kdt_model_free(mtp);
    free(h);
    free(lg);
    kdt_kdtr_close(exp);
}

static void check_refusals(void) {
    char dir[1200];
    kdt_model *m = NULL;
    snprintf(dir, sizeof dir, "%s/bf16", fx_root);
    kdt_status s = kdt_model_load_mtp(dir, KDT_BACKEND_CPU, &m);
    kt_check(s == KDT_ERR_NOT_FOUND && strstr(kdt_last_error(), "num_nextn_predict_layers"), "mtp loader: a checkpoint without an MTP layer is refused (%s)",
             kdt_last_error());
    snprintf(dir, sizeof dir, "%s/glm_flash", fx_root);
    s = kdt_model_load_mtp(dir, KDT_BACKEND_CPU, &m);
    kt_check(s == KDT_ERR_NOT_FOUND && strstr(kdt_last_error(), "model.layers.3."), "mtp loader: a partial MTP layer is refused, the tensor named (%s)",
             kdt_last_error());
    s = kdt_model_load_mtp(mtp_dir, KDT_BACKEND_CUDA, &m);
    kt_check(s == KDT_ERR_UNSUPPORTED, "mtp loader: the CUDA backend is refused for now (%s)", kdt_last_error());
    kdt_model_free(m);
}

/* A fresh drafter's proposal for one history. */
static kdt_status fresh_propose(kdt_model *target, const int32_t *hist, int32_t len, int32_t D, int32_t K, float *scores, int32_t *tokens) {
    const kdt_model_config *cf = kdt_model_get_config(target);
    kdt_drafter *dr = NULL;
    float *hid = malloc((size_t)len * cf->hidden_size * sizeof(float));
    kdt_status s = hid ? kdt_drafter_mtp(mtp_dir, KDT_BACKEND_CPU, &dr) : KDT_ERR_NOMEM;
    if (s == KDT_OK) s = target_hidden(target, hist, len - 1, hid);
    const kdt_draft_setup set = {.slots = 1, .max_len = len + 1, .D = D, .K = K, .vocab_size = cf->vocab_size,
                                 .hidden_size = cf->hidden_size, .backend = KDT_BACKEND_CPU};
    const int32_t slot = 0, n_new = 1, zero = 0, rows = len - 1;
    const int32_t *hp = hist;
    const kdt_draft_ctx ctx = {.B = 1, .slot = &slot, .history = &hp, .hist_len = &len};
    const kdt_draft_feedback fb = {.prefill = 1, .n_new = &n_new, .accept_len = &zero, .hidden = hid, .row_start = &zero, .n_rows = &rows};
    if (s == KDT_OK) s = dr->begin(dr->state, &set);
    if (s == KDT_OK) s = dr->observe(dr->state, &ctx, &fb);
    if (s == KDT_OK) s = dr->propose(dr->state, &ctx, scores, tokens);
    free(hid);
    kdt_drafter_free(dr);
    return s;
}

typedef struct checker {
    kdt_drafter *inner;
    kdt_model *m;
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
        if ((s = fresh_propose(c->m, ctx->history[b], ctx->hist_len[b], c->D, c->K, fs, ft)) != KDT_OK) break;
        float e = 0.0f;
        for (int32_t i = 0; i < n; i++)
            if (isfinite(fs[i]) || isfinite(scores[(int64_t)b * n + i])) e = fmaxf(e, fabsf(fs[i] - scores[(int64_t)b * n + i]));
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

static void check_lossless(kdt_model *m) {
    const int32_t cases[][3] = {{1, 1, 1}, {1, 4, 4}, {4, 4, 16}, {3, 8, 24}, {6, 2, 8}, {2, 64, 100}};
    const int32_t B = 3, plen[3] = {1, 6, 14}, max_new = 20;
    int32_t prompts[3][16], ref[3][20], out[3][20];
    for (int32_t b = 0; b < B; b++)
        for (int32_t i = 0; i < plen[b]; i++) prompts[b][i] = 2 + (b * 29 + i * 13) % 90;
    kdt_spec_request reqs[3];
    kdt_spec_params p = {.depth = 1, .topk = 1, .budget = 1, .eos = -1};
    for (int32_t b = 0; b < B; b++) reqs[b] = (kdt_spec_request){.prompt = prompts[b], .prompt_len = plen[b], .max_new = max_new, .out = ref[b]};
    kdt_status s = kdt_spec_generate(m, NULL, &p, B, reqs, NULL, NULL);
    if (!kt_check(s == KDT_OK, "plain greedy reference: %s", s == KDT_OK ? "ok" : kdt_last_error())) return;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        checker c = {.m = m};
        kdt_drafter wrap = {.name = "mtp-checked", .state = &c, .wants_hidden = 1, .begin = chk_begin, .propose = chk_propose, .observe = chk_observe};
        s = kdt_drafter_mtp(mtp_dir, KDT_BACKEND_CPU, &c.inner);
        p = (kdt_spec_params){.depth = cases[i][0], .topk = cases[i][1], .budget = cases[i][2], .eos = -1};
        for (int32_t b = 0; b < B; b++) reqs[b] = (kdt_spec_request){.prompt = prompts[b], .prompt_len = plen[b], .max_new = max_new, .out = out[b]};
        kdt_spec_stats st;
        if (s == KDT_OK) s = kdt_spec_generate(m, &wrap, &p, B, reqs, &st, NULL);
        int same = s == KDT_OK;
        for (int32_t b = 0; same && b < B; b++) same = reqs[b].n_out == max_new && memcmp(out[b], ref[b], sizeof out[b]) == 0;
        kt_check(same && c.bad == 0 && c.compared > 0,
                 "mtp D=%d K=%d N=%d: speculative output equals greedy (%lld steps, %lld accepted); %lld proposals equal a fresh "
                 "drafter's over the history (max |diff| %.1e, %lld differ)%s%s",
                 cases[i][0], cases[i][1], cases[i][2], s == KDT_OK ? (long long)st.steps : -1LL, s == KDT_OK ? (long long)st.accepted : -1LL,
                 (long long)c.compared, c.worst, (long long)c.bad, s == KDT_OK ? "" : ": ", s == KDT_OK ? "" : kdt_last_error());
        kdt_drafter_free(c.inner);
    }
}

int main(void) {
    const char *fx = getenv("KDT_MODEL_FIXTURES");
    snprintf(fx_root, sizeof fx_root, "%s", fx && *fx ? fx : "tests/fixtures/model");
    snprintf(mtp_dir, sizeof mtp_dir, "%s/../mtp", fx_root);
    if (access(mtp_dir, R_OK) != 0) {
        kt_skip("mtp: fixture %s not found", mtp_dir);
        return kt_exit_code();
    }
    kdt_model *m = NULL;
    if (kdt_model_load_as(mtp_dir, KDT_BACKEND_CPU, KDT_F32, &m) != KDT_OK) {
        kt_fail("mtp: target %s: %s", mtp_dir, kdt_last_error());
        return kt_exit_code();
    }
    check_reference(m);
    check_refusals();
    check_lossless(m);
    kdt_model_free(m);
    return kt_exit_code();
}
