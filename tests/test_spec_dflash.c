/* The DFlash drafter (src/spec/dflash.c) on the tiny DeepseekV3 target tests/fixtures/model/bf16
 * with the random drafter tests/fixtures/dflash (python/make_dflash_fixture.py):
 *  - the target's intermediate hidden states (kdt_model_set_hidden_layers) against transformers';
 *  - the drafter's top-K log-probabilities, all K = vocab of them, against python/dflash_ref.py;
 *  - the loader's refusals (missing field, missing tensor, depth past the block, another target);
 *  - speculative decoding with it equals plain greedy decoding for several (D, K, N), batch 3,
 *    and every proposal inside the loop equals a fresh drafter's over a fresh target forward of
 *    the request's history (the context the loop fed back, tree rows and all, is the right one).
 * CPU only; the CUDA path is tests/test_spec_drafters_cuda.c. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "drafter_check.h"
#include "harness.h"
#include "kdt/kdtr.h"
#include "kdt/spec.h"

static char target_dir[1024], draft_dir[1024];

static float max_abs_diff(const float *a, const float *b, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) m = fmaxf(m, fabsf(a[i] - b[i]));
    return m;
}

/* A fresh drafter's proposal for one history: D x K scores and tokens. */
static kdt_status fresh_propose(kdt_model *m, const int32_t *hist, int32_t len, int32_t D, int32_t K, float *scores, int32_t *tokens) {
    const kdt_model_config *cf = kdt_model_get_config(m);
    kdt_drafter *dr = NULL;
    kdt_status s = kdt_drafter_dflash(m, draft_dir, &dr);
    float *hid = s == KDT_OK ? malloc((size_t)len * dr->n_hidden_layers * cf->hidden_size * sizeof(float)) : NULL;
    if (s == KDT_OK && !hid) s = KDT_ERR_NOMEM;
    if (s == KDT_OK) s = kt_target_states(m, dr, hist, len - 1, hid);
    if (s == KDT_OK) s = kt_draft_fresh(dr, cf, KDT_BACKEND_CPU, hist, len, D, K, hid, scores, tokens);
    free(hid);
    kdt_drafter_free(dr);
    return s;
}

static void check_reference(kdt_model *m) {
    char path[1200];
    snprintf(path, sizeof path, "%s/expected.kdtr", draft_dir);
    kdt_kdtr *exp = NULL;
    kdt_tensor_view prompt, root, feat, logits;
    kdt_status s = kdt_kdtr_open_file(path, &exp);
    if (s == KDT_OK) s = kdt_kdtr_find_typed(exp, "prompt", KDT_I32, 1, NULL, &prompt);
    if (s == KDT_OK) s = kdt_kdtr_find_typed(exp, "root", KDT_I32, 1, NULL, &root);
    if (s == KDT_OK) s = kdt_kdtr_find_typed(exp, "features", KDT_F32, 2, NULL, &feat);
    if (s == KDT_OK) s = kdt_kdtr_find_typed(exp, "logits", KDT_F32, 2, NULL, &logits);
    kdt_drafter *dr = NULL;
    if (s == KDT_OK) s = kdt_drafter_dflash(m, draft_dir, &dr);
    if (s != KDT_OK) {
        kt_fail("dflash reference: %s", kdt_last_error());
        kdt_kdtr_close(exp);
        return;
    }
    const int32_t P = (int32_t)prompt.dims[0], W = (int32_t)feat.dims[1], bs = (int32_t)logits.dims[0], V = (int32_t)logits.dims[1];
    float *hid = malloc((size_t)P * W * sizeof(float));
    s = kt_target_states(m, dr, prompt.data, P, hid);
    const float fe = s == KDT_OK ? max_abs_diff(hid, feat.data, (int64_t)P * W) : INFINITY;
    kt_check(s == KDT_OK && fe < 1e-4f, "target hidden states of layers %d, %d against transformers' hidden_states[l + 1]: max |diff| %.2e",
             dr->hidden_layers[0], dr->hidden_layers[1], fe);
    /* The drafter over transformers' features, every candidate (K = V) against the reference's log-softmax. */
    int32_t *hist = malloc((size_t)(P + 1) * sizeof *hist);
    memcpy(hist, prompt.data, (size_t)P * sizeof *hist);
    hist[P] = ((const int32_t *)root.data)[0];
    const int32_t D = bs - 1, len = P + 1;
    float *sc = malloc((size_t)D * V * sizeof *sc);
    int32_t *tk = malloc((size_t)D * V * sizeof *tk);
    s = fresh_propose(m, hist, len, D, V, sc, tk);
    float worst = s == KDT_OK ? 0.0f : INFINITY;
    int order_ok = s == KDT_OK;
    for (int32_t d = 0; s == KDT_OK && d < D; d++) {
        const float *row = (const float *)logits.data + (int64_t)(d + 1) * V;
        double mx = -INFINITY, sum = 0.0;
        for (int32_t v = 0; v < V; v++) mx = fmax(mx, row[v]);
        for (int32_t v = 0; v < V; v++) sum += expf(row[v] - (float)mx);
        const double lse = mx + log(sum);
        for (int32_t k = 0; k < V; k++) {
            worst = fmaxf(worst, fabsf(sc[d * V + k] - (float)(row[tk[d * V + k]] - lse)));
            if (k > 0 && sc[d * V + k] > sc[d * V + k - 1]) order_ok = 0;
        }
    }
    kt_check(s == KDT_OK && worst < 2e-4f && order_ok, "dflash drafter: D = %d depths x %d candidates against the PyTorch reference: max |log p diff| %.2e%s",
             D, V, worst, s == KDT_OK ? "" : kdt_last_error());
    free(sc); free(tk); free(hist); free(hid);
    kdt_drafter_free(dr);
    kdt_kdtr_close(exp);
}

/* A copy of the drafter folder with config.json replaced by text, model.safetensors linked or not. */
static kdt_status load_edited(kdt_model *m, const char *config, int link_weights) {
    char dir[] = "/tmp/kdt_dflash_XXXXXX", p[1200], src[1200];
    if (!mkdtemp(dir)) return KDT_ERR_IO;
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    if (f) { fputs(config, f); fclose(f); }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    snprintf(src, sizeof src, "%s/model.safetensors", draft_dir);
    char abs[PATH_MAX]; /* realpath writes up to PATH_MAX bytes */
    if (link_weights && realpath(src, abs)) (void)!symlink(abs, p);
    kdt_drafter *dr = NULL;
    kdt_status s = kdt_drafter_dflash(m, dir, &dr);
    kdt_drafter_free(dr);
    unlink(p);
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    rmdir(dir);
    return s;
}

static void check_refusals(kdt_model *m) {
    const char *base = "\"hidden_size\": 32, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                       "\"head_dim\": 8, \"intermediate_size\": 64, \"vocab_size\": 96, \"block_size\": 5";
    char cfg[1024];
    snprintf(cfg, sizeof cfg, "{%s, \"num_hidden_layers\": 2, \"dflash_config\": {\"target_layer_ids\": [0, 1]}}", base);
    kdt_status s = load_edited(m, cfg, 1);
    kt_check(s == KDT_ERR_NOT_FOUND && strstr(kdt_last_error(), "mask_token_id"), "loader: a config without mask_token_id is refused (%s)", kdt_last_error());
    snprintf(cfg, sizeof cfg, "{%s, \"num_hidden_layers\": 2, \"dflash_config\": {\"mask_token_id\": 95, \"target_layer_ids\": [0, 3]}}", base);
    s = load_edited(m, cfg, 1);
    kt_check(s == KDT_ERR_INVALID_ARG && strstr(kdt_last_error(), "target_layer_ids[1]"), "loader: a target layer past the target's is refused (%s)", kdt_last_error());
    snprintf(cfg, sizeof cfg, "{%s, \"num_hidden_layers\": 3, \"dflash_config\": {\"mask_token_id\": 95, \"target_layer_ids\": [0, 1]}}", base);
    s = load_edited(m, cfg, 1);
    kt_check(s == KDT_ERR_NOT_FOUND && strstr(kdt_last_error(), "layers.2."), "loader: a missing tensor is named (%s)", kdt_last_error());
    snprintf(cfg, sizeof cfg, "{%s, \"num_hidden_layers\": 2, \"layer_types\": [\"sliding_attention\", \"full_attention\"], \"dflash_config\": {\"mask_token_id\": 95, \"target_layer_ids\": [0, 1]}}", base);
    s = load_edited(m, cfg, 1);
    kt_check(s == KDT_ERR_UNSUPPORTED, "loader: sliding-window layers are refused (%s)", kdt_last_error());
    snprintf(cfg, sizeof cfg, "{%s, \"num_hidden_layers\": 2, \"dflash_config\": {\"mask_token_id\": 95, \"target_layer_ids\": [0, 1]}}", base);
    s = load_edited(m, cfg, 0);
    kt_check(s != KDT_OK, "loader: a folder without weights is refused (%s)", kdt_last_error());
    kdt_model *other = NULL;
    kdt_drafter *dr = NULL;
    s = kdt_model_builtin(1, KDT_BACKEND_CPU, &other);
    if (s == KDT_OK) s = kdt_drafter_dflash(other, draft_dir, &dr);
    kt_check(s == KDT_ERR_INVALID_ARG, "loader: a target of another hidden size / vocabulary is refused (%s)", kdt_last_error());
    kdt_drafter_free(dr);
    kdt_model_free(other);
}

static kdt_status make_dflash(kdt_model *m, kdt_drafter **dr) { return kdt_drafter_dflash(m, draft_dir, dr); }

static void check_lossless(kdt_model *m) {
    const int32_t cases[][3] = {{1, 1, 1}, {4, 4, 16}, {4, 8, 32}, {2, 3, 5}, {3, 64, 64}, {4, 2, 4}};
    const int32_t B = 3, plen[3] = {1, 7, 15};
    int32_t prompts[3][16], out[3][4];
    for (int32_t b = 0; b < B; b++)
        for (int32_t i = 0; i < plen[b]; i++) prompts[b][i] = 2 + (b * 31 + i * 17) % 90;
    const int32_t *const pp[3] = {prompts[0], prompts[1], prompts[2]};
    if (!kt_check_lossless(m, "dflash", make_dflash, fresh_propose, cases, sizeof cases / sizeof *cases, B, pp, plen, 24)) return;
    /* Depth past the block is refused at begin. */
    kdt_spec_request reqs[3];
    kdt_drafter *dr = NULL;
    const kdt_spec_params p = {.depth = 5, .topk = 2, .budget = 4, .eos = -1};
    for (int32_t b = 0; b < B; b++) reqs[b] = (kdt_spec_request){.prompt = prompts[b], .prompt_len = plen[b], .max_new = 4, .out = out[b]};
    kdt_status s = kdt_drafter_dflash(m, draft_dir, &dr);
    if (s == KDT_OK) s = kdt_spec_generate(m, dr, &p, B, reqs, NULL, NULL);
    kt_check(s == KDT_ERR_INVALID_ARG && strstr(kdt_last_error(), "block_size"), "dflash: depth 5 past block_size - 1 = 4 is refused (%s)", kdt_last_error());
    kdt_drafter_free(dr);
}

int main(void) {
    const char *fx = getenv("KDT_MODEL_FIXTURES");
    snprintf(target_dir, sizeof target_dir, "%s/bf16", fx && *fx ? fx : "tests/fixtures/model");
    snprintf(draft_dir, sizeof draft_dir, "%s/../dflash", fx && *fx ? fx : "tests/fixtures/model");
    if (access(target_dir, R_OK) != 0 || access(draft_dir, R_OK) != 0) {
        kt_skip("dflash: fixtures %s, %s not found", target_dir, draft_dir);
        return kt_exit_code();
    }
    kdt_model *m = NULL;
    if (kdt_model_load_as(target_dir, KDT_BACKEND_CPU, KDT_F32, &m) != KDT_OK) {
        kt_fail("dflash: target %s: %s", target_dir, kdt_last_error());
        return kt_exit_code();
    }
    check_reference(m);
    check_refusals(m);
    check_lossless(m);
    kdt_model_free(m);
    return kt_exit_code();
}
