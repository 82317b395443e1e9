/* The DFlash and MTP drafters on CUDA (src/spec/cuda/dflash.cu, src/spec/mtp.c's device path),
 * against their CPU versions (which tests/test_spec_dflash.c and test_spec_mtp.c check against
 * the PyTorch references), on the committed fixtures, targets in f32 on both backends:
 *  - the target's intermediate layer states written by the CUDA forward into device memory
 *    against the CPU forward's;
 *  - a fresh drafter's proposal on the device (every candidate: K = vocab) against the CPU
 *    drafter's log-probabilities of the same tokens (DFlash in f32; MTP's layer is bf16 on CUDA, its
 *    chained depths compared while the earlier depths' top tokens agree);
 *  - speculative decoding on CUDA with each drafter equals plain greedy decoding on CUDA, token
 *    for token, for several (D, K, N), batch 3 of different prompt lengths.
 * SKIPs without a CUDA device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/device.h"
#include "drafter_check.h"
#include "harness.h"
#include "kdt/spec.h"

static char target_dir[1024], dflash_dir[1100], mtp_dir[1100];

typedef kdt_status (*make_fn)(kdt_model *target, kdt_backend be, kdt_drafter **dr);

static kdt_status make_dflash(kdt_model *t, kdt_backend be, kdt_drafter **dr) { (void)be; return kdt_drafter_dflash(t, dflash_dir, dr); }
static kdt_status make_mtp(kdt_model *t, kdt_backend be, kdt_drafter **dr) { (void)t; return kdt_drafter_mtp(mtp_dir, be, dr); }

/* A fresh drafter's D x K proposal for history hist [len] on the target's backend, on the host. */
static kdt_status propose(kdt_model *m, make_fn make, const int32_t *hist, int32_t len, int32_t D, int32_t K, float *scores, int32_t *tokens) {
    const kdt_model_config *cf = kdt_model_get_config(m);
    const kdt_backend be = kdt_model_backend(m);
    kdt_drafter *dr = NULL;
    kdt_status s = make(m, be, &dr);
    if (s != KDT_OK) return s;
    const size_t W = (size_t)(dr->n_hidden_layers > 0 ? dr->n_hidden_layers : 1) * cf->hidden_size, n = (size_t)D * K;
    float *hid = NULL, *d_sc = NULL;
    int32_t *d_tk = NULL;
    if (be == KDT_BACKEND_CPU) {
        hid = malloc((size_t)len * W * sizeof *hid);
        s = hid ? KDT_OK : KDT_ERR_NOMEM;
    } else {
        s = kdt_dev_alloc((void **)&hid, (size_t)len * W * sizeof *hid);
        if (s == KDT_OK) s = kdt_dev_alloc((void **)&d_sc, n * sizeof *d_sc);
        if (s == KDT_OK) s = kdt_dev_alloc((void **)&d_tk, n * sizeof *d_tk);
    }
    if (s == KDT_OK) s = kt_target_states(m, dr, hist, len - 1, hid);
    if (s == KDT_OK)
        s = kt_draft_fresh(dr, cf, be, hist, len, D, K, hid, be == KDT_BACKEND_CPU ? scores : d_sc, be == KDT_BACKEND_CPU ? tokens : d_tk);
    if (s == KDT_OK && be != KDT_BACKEND_CPU) s = kdt_dev_d2h(scores, d_sc, n * sizeof *scores);
    if (s == KDT_OK && be != KDT_BACKEND_CPU) s = kdt_dev_d2h(tokens, d_tk, n * sizeof *tokens);
    if (be == KDT_BACKEND_CPU) free(hid);
    else kdt_dev_free(hid), kdt_dev_free(d_sc), kdt_dev_free(d_tk);
    kdt_drafter_free(dr);
    return s;
}

static void check_hidden(kdt_model *mc, kdt_model *mg) {
    kdt_drafter *dr = NULL;
    kdt_status s = kdt_drafter_dflash(mc, dflash_dir, &dr);
    if (s != KDT_OK) { kt_fail("dflash drafter: %s", kdt_last_error()); return; }
    const int32_t n = 11, W = dr->n_hidden_layers * kdt_model_get_config(mc)->hidden_size;
    int32_t tok[11];
    for (int32_t i = 0; i < n; i++) tok[i] = 3 + i * 7 % 80;
    float *hc = malloc((size_t)n * W * sizeof *hc), *hg = malloc((size_t)n * W * sizeof *hg), *d = NULL;
    s = kt_target_states(mc, dr, tok, n, hc);
    if (s == KDT_OK) s = kdt_dev_alloc((void **)&d, (size_t)n * W * sizeof *d);
    if (s == KDT_OK) s = kt_target_states(mg, dr, tok, n, d);
    if (s == KDT_OK) s = kdt_dev_d2h(hg, d, (size_t)n * W * sizeof *hg);
    float e = s == KDT_OK ? 0.0f : INFINITY, scale = 0.0f;
    for (int64_t i = 0; s == KDT_OK && i < (int64_t)n * W; i++) e = fmaxf(e, fabsf(hc[i] - hg[i])), scale = fmaxf(scale, fabsf(hc[i]));
    kt_check(s == KDT_OK && e <= 1e-3f * fmaxf(scale, 1.0f), "cuda forward: layers %d, %d's states into device memory against the CPU's: max |diff| %.2e (max |x| %.1f)%s",
             dr->hidden_layers[0], dr->hidden_layers[1], e, scale, s == KDT_OK ? "" : kdt_last_error());
    kdt_dev_free(d);
    free(hc), free(hg);
    kdt_drafter_free(dr);
}

/* Every candidate (K = V) of the device drafter against the CPU drafter's score of the same token. */
static void check_propose(const char *name, make_fn make, kdt_model *mc, kdt_model *mg, int32_t D, float tol) {
    const int32_t V = kdt_model_get_config(mc)->vocab_size, len = 13;
    int32_t hist[13];
    for (int32_t i = 0; i < len; i++) hist[i] = 2 + (i * 29 + 5) % 90;
    const size_t n = (size_t)D * V;
    float *sc = malloc(n * sizeof *sc), *sg = malloc(n * sizeof *sg), *by_tok = malloc((size_t)V * sizeof *by_tok);
    int32_t *tc = malloc(n * sizeof *tc), *tg = malloc(n * sizeof *tg);
    for (size_t i = 0; i < n; i++) sg[i] = NAN, tg[i] = -1; /* poisoned */
    kdt_status s = propose(mc, make, hist, len, D, V, sc, tc);
    if (s == KDT_OK) s = propose(mg, make, hist, len, D, V, sg, tg);
    float worst = s == KDT_OK ? 0.0f : INFINITY;
    int order_ok = s == KDT_OK, top_ok = 1, depths = 0;
    /* a chained drafter's depth d follows depth d - 1's top token: compared while those agree */
    for (int32_t d = 0; s == KDT_OK && d < D && (d == 0 || tg[(size_t)(d - 1) * V] == tc[(size_t)(d - 1) * V]); d++, depths++) {
        for (int32_t k = 0; k < V; k++) by_tok[tc[(size_t)d * V + k]] = sc[(size_t)d * V + k];
        for (int32_t k = 0; k < V; k++) {
            const int32_t t = tg[(size_t)d * V + k];
            const float g = sg[(size_t)d * V + k];
            if (t < 0 || t >= V || isnan(g)) { worst = INFINITY; break; }
            worst = fmaxf(worst, fabsf(g - by_tok[t]));
            if (k > 0 && g > sg[(size_t)d * V + k - 1]) order_ok = 0;
        }
        /* the top token agrees unless the CPU's two best are within the tolerance */
        if (tg[(size_t)d * V] != tc[(size_t)d * V] && sc[(size_t)d * V] - sc[(size_t)d * V + 1] > tol) top_ok = 0;
    }
    kt_check(s == KDT_OK && worst <= tol && order_ok && top_ok,
             "%s cuda: %d of %d depths x %d candidates against the CPU drafter: max |log p diff| %.2e (tolerance %.0e)%s%s", name, depths,
             D, V, worst, tol, s == KDT_OK ? "" : ": ", s == KDT_OK ? "" : kdt_last_error());
    free(sc), free(sg), free(tc), free(tg), free(by_tok);
}

/* Speculative decoding on CUDA with the drafter equals plain greedy on CUDA. */
static void check_lossless(const char *name, make_fn make, kdt_model *mg) {
    const int32_t cases[][3] = {{1, 1, 1}, {4, 1, 4}, {4, 4, 16}, {3, 8, 8}, {2, 3, 5}};
    enum { B = 3, NEW = 24 };
    const int32_t plen[B] = {1, 7, 15};
    int32_t prompts[B][16], ref[B][NEW], out[B][NEW];
    for (int32_t b = 0; b < B; b++)
        for (int32_t i = 0; i < plen[b]; i++) prompts[b][i] = 2 + (b * 31 + i * 17) % 90;
    kdt_spec_request reqs[B];
    kdt_spec_params p = {.depth = 1, .topk = 1, .budget = 1, .eos = -1, .pad_tree = 1};
    for (int32_t b = 0; b < B; b++) reqs[b] = (kdt_spec_request){.prompt = prompts[b], .prompt_len = plen[b], .max_new = NEW, .out = ref[b]};
    kdt_status s = kdt_spec_generate(mg, NULL, &p, B, reqs, NULL, NULL);
    if (!kt_check(s == KDT_OK, "%s cuda: plain greedy reference: %s", name, s == KDT_OK ? "ok" : kdt_last_error())) return;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        kdt_drafter *dr = NULL;
        memset(out, 0xFF, sizeof out);
        p = (kdt_spec_params){.depth = cases[c][0], .topk = cases[c][1], .budget = cases[c][2], .eos = -1, .pad_tree = 1};
        for (int32_t b = 0; b < B; b++) reqs[b] = (kdt_spec_request){.prompt = prompts[b], .prompt_len = plen[b], .max_new = NEW, .out = out[b]};
        kdt_spec_stats st = {0};
        s = make(mg, KDT_BACKEND_CUDA, &dr);
        if (s == KDT_OK) s = kdt_spec_generate(mg, dr, &p, B, reqs, &st, NULL);
        int same = s == KDT_OK;
        for (int32_t b = 0; same && b < B; b++) same = reqs[b].n_out == NEW && memcmp(out[b], ref[b], sizeof ref[b]) == 0;
        kt_check(same, "%s cuda D=%d K=%d N=%d: speculative output equals greedy on CUDA (%lld steps, %lld accepted)%s%s", name,
                 cases[c][0], cases[c][1], cases[c][2], (long long)st.steps, (long long)st.accepted, s == KDT_OK ? "" : ": ",
                 s == KDT_OK ? "" : kdt_last_error());
        kdt_drafter_free(dr);
    }
}

int main(void) {
    const char *fx = getenv("KDT_MODEL_FIXTURES");
    const char *root = fx && *fx ? fx : "tests/fixtures/model";
    snprintf(target_dir, sizeof target_dir, "%s/bf16", root);
    snprintf(dflash_dir, sizeof dflash_dir, "%s/../dflash", root);
    snprintf(mtp_dir, sizeof mtp_dir, "%s/../mtp", root);
    if (!kdt_cuda_available()) {
        kt_skip("drafters cuda: no CUDA device");
        return kt_exit_code();
    }
    if (access(target_dir, R_OK) || access(dflash_dir, R_OK) || access(mtp_dir, R_OK)) {
        kt_skip("drafters cuda: fixtures under %s not found", root);
        return kt_exit_code();
    }
    kdt_model *mc = NULL, *mg = NULL;
    if (kdt_model_load_as(target_dir, KDT_BACKEND_CPU, KDT_F32, &mc) != KDT_OK ||
        kdt_model_load_as(target_dir, KDT_BACKEND_CUDA, KDT_F32, &mg) != KDT_OK) {
        kt_fail("drafters cuda: target %s: %s", target_dir, kdt_last_error());
        return kt_exit_code();
    }
    check_hidden(mc, mg);
    check_propose("dflash", make_dflash, mc, mg, 4, 1e-3f);
    check_lossless("dflash", make_dflash, mg);
    kdt_model_free(mc);
    kdt_model_free(mg);
    mc = mg = NULL;
    if (kdt_model_load_as(mtp_dir, KDT_BACKEND_CPU, KDT_F32, &mc) != KDT_OK ||
        kdt_model_load_as(mtp_dir, KDT_BACKEND_CUDA, KDT_F32, &mg) != KDT_OK) {
        kt_fail("drafters cuda: target %s: %s", mtp_dir, kdt_last_error());
    } else {
        check_propose("mtp", make_mtp, mc, mg, 3, 1e-1f); /* the MTP layer runs in bf16 on CUDA */
        check_lossless("mtp", make_mtp, mg);
    }
    kdt_model_free(mc);
    kdt_model_free(mg);
    return kt_exit_code();
}
