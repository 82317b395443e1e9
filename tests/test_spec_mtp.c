/* The MTP drafter (src/spec/mtp.c) and the MTP layer (kdt_model_load_mtp) on the tiny DeepSeek-V3
 * checkpoint with one MTP layer, tests/fixtures/mtp (python/make_mtp_fixture.py):
 *  - the target's final hidden states against transformers', and the MTP layer's logits over
 *    (h_i, t_{i+1}) rows against python/mtp_ref.py;
 *  - the loader's refusals (no MTP layer, a partial one) and a forward without mtp_hidden;
 *  - speculative decoding with it equals plain greedy for several (D, K, N), batch 3, and every
 *    proposal inside the loop equals a fresh drafter's over a fresh target forward of the history.
 * CPU only; the CUDA path is tests/test_spec_drafters_cuda.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "drafter_check.h"
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
    kdt_model_free(m);
}

/* A fresh drafter's proposal for one history. */
static kdt_status fresh_propose(kdt_model *target, const int32_t *hist, int32_t len, int32_t D, int32_t K, float *scores, int32_t *tokens) {
    const kdt_model_config *cf = kdt_model_get_config(target);
    kdt_drafter *dr = NULL;
    float *hid = malloc((size_t)len * cf->hidden_size * sizeof(float));
    kdt_status s = hid ? kdt_drafter_mtp(mtp_dir, KDT_BACKEND_CPU, &dr) : KDT_ERR_NOMEM;
    if (s == KDT_OK) s = target_hidden(target, hist, len - 1, hid);
    if (s == KDT_OK) s = kt_draft_fresh(dr, cf, KDT_BACKEND_CPU, hist, len, D, K, hid, scores, tokens);
    free(hid);
    kdt_drafter_free(dr);
    return s;
}

static kdt_status make_mtp(kdt_model *m, kdt_drafter **dr) {
    (void)m;
    return kdt_drafter_mtp(mtp_dir, KDT_BACKEND_CPU, dr);
}

static void check_lossless(kdt_model *m) {
    const int32_t cases[][3] = {{1, 1, 1}, {1, 4, 4}, {4, 4, 16}, {3, 8, 24}, {6, 2, 8}, {2, 64, 100}};
    const int32_t B = 3, plen[3] = {1, 6, 14};
    int32_t prompts[3][16];
    for (int32_t b = 0; b < B; b++)
        for (int32_t i = 0; i < plen[b]; i++) prompts[b][i] = 2 + (b * 29 + i * 13) % 90;
    const int32_t *const pp[3] = {prompts[0], prompts[1], prompts[2]};
    kt_check_lossless(m, "mtp", make_mtp, fresh_propose, cases, sizeof cases / sizeof *cases, B, pp, plen, 20);
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
