/* Sampling end to end on the built-in model: the first two generated tokens of one
 * prompt over many seeds, plain sampling against speculative decoding with the model drafter
 * (drafting with the target itself: its children are drawn from the unfiltered softmax at the
 * request's temperature, often accepted, and when rejected leave a residual that differs from the
 * target), compared by a two-sample chi-square test of the joint (t1, t2) counts; the first
 * token is the same draw in every mode (the prefill samples it through the same op and seed);
 * the same seeds give the same tokens run to run.
 *
 * Left out, as they would compare plain sampling with itself: the lookup drafter (after a sampled
 * first token that the prompt lacks it proposes nothing, and a tree of just the root gives plain
 * sampling's draw exactly). A draft model that differs from the target, against the target's exact
 * distribution, is tests/test_sample_drafter.c's.
 * Sizes: T = 0.5, top_k = 6, so (t1, t2) has at most 36 categories; n requests per mode (cpu
 * 256, cuda 6144), categories pooled below 10 expected, failing at p < 1e-4. The cpu size catches
 * gross errors only (a total-variation bias of ~20%); the cuda run on the GPU machine resolves
 * ~5%. The exact per-node losslessness is test_sample_stats.c's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kdt/spec.h"

enum { BATCH = 64, NEW = 2 };
static const int32_t kPrompt[] = {5, 6, 7, 5, 6, 7, 5, 6};

/* Tokens (t1, t2) of nseed requests with seeds 1 .. nseed into out[2 * i + j]. */
static kdt_status sample_pairs(kdt_model *m, kdt_drafter *dr, int nseed, int32_t *out) {
    kdt_spec_request req[BATCH];
    const kdt_spec_params p = {.depth = 2, .topk = 3, .budget = 4, .eos = -1};
    kdt_status s = KDT_OK;
    for (int base = 0; base < nseed && s == KDT_OK; base += BATCH) {
        for (int b = 0; b < BATCH; b++)
            req[b] = (kdt_spec_request){.prompt = kPrompt, .prompt_len = 8, .max_new = NEW, .out = out + 2 * (base + b),
                                        .temperature = 0.5f, .top_k = 6, .top_p = 1.0f, .seed = (uint64_t)(base + b + 1)};
        s = kdt_spec_generate(m, dr, &p, BATCH, req, NULL, NULL);
    }
    return s;
}

/* Two-sample chi-square of pair counts a and b (n each) over the pairs seen. */
static void compare(const char *what, const int32_t *a, const int32_t *b, int n, int V) {
    long *ca = calloc((size_t)V * V, sizeof *ca), *cb = calloc((size_t)V * V, sizeof *cb);
    for (int i = 0; i < n; i++) ca[(size_t)a[2 * i] * V + a[2 * i + 1]]++, cb[(size_t)b[2 * i] * V + b[2 * i + 1]]++;
    double chi2 = 0, pa = 0, pb = 0;
    int bins = 0, cats = 0;
    for (size_t k = 0; k < (size_t)V * V; k++) {
        if (!ca[k] && !cb[k]) continue;
        cats++;
        const double e = (ca[k] + cb[k]) / 2.0;
        if (e < 10) { pa += ca[k], pb += cb[k]; continue; }
        chi2 += (ca[k] - e) * (ca[k] - e) / e + (cb[k] - e) * (cb[k] - e) / e, bins++;
    }
    if (pa + pb > 0) {
        const double e = (pa + pb) / 2;
        chi2 += (pa - e) * (pa - e) / e + (pb - e) * (pb - e) / e, bins++;
    }
    const double pv = bins > 1 ? kt_chi2_sf(chi2, bins - 1) : 1.0;
    kt_check(pv > 1e-4, "%s: (t1, t2) over %d seeds each, %d pairs seen: chi2 %.1f df %d p %.3g", what, n, cats, chi2,
             bins - 1, pv);
    free(ca), free(cb);
}

static void run(kdt_backend be) {
    char what[128];
    snprintf(what, sizeof what, "sample e2e [%s]", kdt_backend_name(be));
    if (!kt_backend_usable(be, what)) return;
    const int n = be == KDT_BACKEND_CPU ? 256 : 6144;
    kdt_model *m = NULL;
    kdt_drafter *self = NULL;
    int32_t *out[3];
    for (int i = 0; i < 3; i++) out[i] = malloc((size_t)n * 2 * sizeof(int32_t));
    kdt_status s = kdt_model_builtin(21, be, &m);
    if (s == KDT_OK) s = kdt_drafter_model(m, &self);
    if (s == KDT_OK) s = sample_pairs(m, NULL, n, out[0]);
    if (s == KDT_OK) s = sample_pairs(m, self, n, out[1]);
    if (s == KDT_OK) s = sample_pairs(m, self, BATCH, out[2]); /* the same seeds again */
    if (s != KDT_OK) {
        kt_fail("%s  %s: %s", what, kdt_status_name(s), kdt_last_error());
    } else {
        const int V = kdt_model_get_config(m)->vocab_size;
        snprintf(what, sizeof what, "sample e2e [%s] plain vs spec model (the target as drafter)", kdt_backend_name(be));
        compare(what, out[0], out[1], n, V);
        int differ = 0, t1_differ = 0, t2_differ = 0;
        for (int i = 0; i < 2 * BATCH; i++) differ += out[1][i] != out[2][i];
        for (int i = 0; i < n; i++) t1_differ += out[0][2 * i] != out[1][2 * i], t2_differ += out[0][2 * i + 1] != out[1][2 * i + 1];
        kt_check(t2_differ > n / 10, "sample e2e [%s] speculation draws its own second tokens: %d of %d differ from plain's",
                 kdt_backend_name(be), t2_differ, n);
        kt_check(differ == 0, "sample e2e [%s] same seeds, same tokens run to run (spec model): %d differ", kdt_backend_name(be),
                 differ);
        kt_check(t1_differ == 0, "sample e2e [%s] the first token is the same draw plain and speculative: %d differ",
                 kdt_backend_name(be), t1_differ);
    }
    kdt_drafter_free(self);
    kdt_model_free(m);
    for (int i = 0; i < 3; i++) free(out[i]);
}

int main(void) {
    run(KDT_BACKEND_CPU);
    run(KDT_BACKEND_CUDA);
    return kt_exit_code();
}
