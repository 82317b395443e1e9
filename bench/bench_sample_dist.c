/* bench_sample_dist: on a trained model, the first tokens generated from one prompt over many
 * seeds, plain sampling against speculative decoding (lookup, and the draft model with sampled
 * children), compared by two-sample chi-square tests: the pair (t1, t2) and the third token t3.
 * Speculation must change the speed, never the distribution (docs/sampling.md).
 *
 *   build/bench/bench_sample_dist --model DIR [--draft-model DIR] [--prompts FILE] [--prompt N]
 *        [--seeds 8192] [--temperature 1] [--top-k 0] [--top-p 1] [--backend cpu|cuda] [--out FILE]
 *
 * The prompt is line N (default 0) of FILE (default DIR/heldout_prompts.ids). The model runs in f32
 * on either backend, so that plain decoding and the tree forward see the same target (bf16 rounds
 * rows of different batches differently). Seeds 1 .. --seeds, batches of 256, D = 8, K = 2, N = 16.
 * The first token is the same draw in every mode (the prefill samples it through the same op and
 * seed), which makes the (t1, t2) test conservative. Categories expected below 10 are pooled; a p
 * below 1e-4 is a failure (printed FAIL). Exit status 0 when every test passes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "kdt/spec.h"

enum { NEW = 3, BATCH = 256 };

static void die(const char *what, kdt_status s) {
    fprintf(stderr, "bench_sample_dist: %s: %s (%s)\n", what, kdt_last_error(), kdt_status_name(s));
    exit(1);
}

static double chi2_sf(double x, int df) {
    const double k = df, z = (cbrt(x / k) - (1 - 2 / (9 * k))) / sqrt(2 / (9 * k));
    return 0.5 * erfc(z / sqrt(2.0));
}

static int cmp_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Two-sample chi-square of keys a and b (n each, sorted here): the p-value; *df, *chi2, *cats. */
static double compare(uint64_t *a, uint64_t *b, int n, double *chi2, int *df, int *cats) {
    qsort(a, (size_t)n, sizeof *a, cmp_u64);
    qsort(b, (size_t)n, sizeof *b, cmp_u64);
    double pa = 0, pb = 0;
    int i = 0, j = 0, bins = 0;
    *chi2 = 0, *cats = 0;
    while (i < n || j < n) {
        const uint64_t k = j >= n || (i < n && a[i] < b[j]) ? a[i] : b[j];
        double ca = 0, cb = 0;
        while (i < n && a[i] == k) ca++, i++;
        while (j < n && b[j] == k) cb++, j++;
        (*cats)++;
        const double e = (ca + cb) / 2;
        if (e < 10) { pa += ca, pb += cb; continue; }
        *chi2 += (ca - e) * (ca - e) / e + (cb - e) * (cb - e) / e, bins++;
    }
    if (pa + pb > 0) {
        const double e = (pa + pb) / 2;
        *chi2 += (pa - e) * (pa - e) / e + (pb - e) * (pb - e) / e, bins++;
    }
    *df = bins - 1;
    return *df > 0 ? chi2_sf(*chi2, *df) : 1.0;
}

typedef struct run_out {
    int32_t *tok;       /* [seeds, NEW] */
    double accepted;    /* mean accepted length */
} run_out;

static run_out sample(kdt_model *m, kdt_drafter *d, const int32_t *prompt, int32_t len, int seeds, float T, int32_t top_k,
                      float top_p) {
    run_out r = {.tok = malloc((size_t)seeds * NEW * sizeof(int32_t))};
    kdt_spec_request req[BATCH];
    const kdt_spec_params p = {.depth = 8, .topk = 2, .budget = 16, .eos = -1};
    int64_t steps = 0, acc = 0;
    for (int at = 0; at < seeds; at += BATCH) {
        const int nb = seeds - at < BATCH ? seeds - at : BATCH;
        for (int b = 0; b < nb; b++)
            req[b] = (kdt_spec_request){.prompt = prompt, .prompt_len = len, .max_new = NEW, .out = r.tok + (size_t)(at + b) * NEW,
                                        .temperature = T, .top_k = top_k, .top_p = top_p, .seed = (uint64_t)(at + b) + 1};
        kdt_spec_stats st;
        kdt_status s = kdt_spec_generate(m, d, &p, nb, req, &st, NULL);
        if (s != KDT_OK) die("kdt_spec_generate", s);
        steps += st.request_steps, acc += st.accepted;
    }
    r.accepted = steps ? (double)acc / (double)steps : 0;
    return r;
}

int main(int argc, char **argv) {
    const char *model_dir = NULL, *draft_dir = NULL, *prompts_path = NULL, *out_path = NULL;
    int line = 0, seeds = 8192, top_k = 0;
    float T = 1.0f, top_p = 1.0f;
    kdt_backend be = kdt_cuda_available() ? KDT_BACKEND_CUDA : KDT_BACKEND_CPU;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--model")) model_dir = v;
        else if (!strcmp(a, "--draft-model")) draft_dir = v;
        else if (!strcmp(a, "--prompts")) prompts_path = v;
        else if (!strcmp(a, "--prompt")) line = atoi(v);
        else if (!strcmp(a, "--seeds")) seeds = atoi(v);
        else if (!strcmp(a, "--temperature")) T = (float)atof(v);
        else if (!strcmp(a, "--top-k")) top_k = atoi(v);
        else if (!strcmp(a, "--top-p")) top_p = (float)atof(v);
        else if (!strcmp(a, "--out")) out_path = v;
        else if (!strcmp(a, "--backend")) be = !strcmp(v, "cuda") ? KDT_BACKEND_CUDA : KDT_BACKEND_CPU;
        else { fprintf(stderr, "bench_sample_dist: unknown option %s\n", a); return 2; }
    }
    if (!model_dir || seeds < 2 || !(T > 0.0f) || argc % 2 == 0) {
        fprintf(stderr, "usage: bench_sample_dist --model DIR [--draft-model DIR] [--prompts FILE] [--prompt N] [--seeds 8192]\n"
                        "       [--temperature T > 0] [--top-k K] [--top-p P] [--backend cpu|cuda] [--out FILE]\n");
        return 2;
    }
    char path[1024];
    if (!prompts_path) snprintf(path, sizeof path, "%s/heldout_prompts.ids", model_dir), prompts_path = path;
    FILE *f = fopen(prompts_path, "r");
    if (!f) { fprintf(stderr, "bench_sample_dist: cannot read %s\n", prompts_path); return 1; }
    static char buf[1 << 16];
    int32_t prompt[4096], len = 0;
    for (int l = 0; l <= line; l++)
        if (!fgets(buf, sizeof buf, f)) { fprintf(stderr, "bench_sample_dist: %s has no line %d\n", prompts_path, line); return 1; }
    fclose(f);
    for (char *t = strtok(buf, " ,\n"); t && len < 4096; t = strtok(NULL, " ,\n")) prompt[len++] = atoi(t);
    if (!len) { fprintf(stderr, "bench_sample_dist: prompt %d is empty\n", line); return 1; }

    kdt_model *m = NULL, *dm = NULL;
    kdt_status s = kdt_model_load_as(model_dir, be, KDT_F32, &m);
    if (s != KDT_OK) die(model_dir, s);
    if (draft_dir && (s = kdt_model_load_as(draft_dir, be, KDT_F32, &dm)) != KDT_OK) die(draft_dir, s);
    struct { const char *name; kdt_drafter *d; } dr[3] = {{"none", NULL}, {"lookup", NULL}, {"model", NULL}};
    int n_dr = 2;
    if ((s = kdt_drafter_lookup(&dr[1].d)) != KDT_OK) die("lookup", s);
    if (dm && (s = kdt_drafter_model(dm, &dr[n_dr++].d)) != KDT_OK) die("model drafter", s);

    FILE *out = out_path ? fopen(out_path, "w") : NULL;
    bench_emit(out,
               "\n### %s, prompt %d (%d tokens), T=%g top_k=%d top_p=%g, %d seeds per mode, %s f32\n\n"
               "| mode | mean accepted | (t1, t2): pairs, chi2, df, p | t3: tokens, chi2, df, p | verdict |\n|---|---:|---|---|---|\n",
               model_dir, line, len, (double)T, top_k, (double)top_p, seeds, kdt_backend_name(be));
    run_out plain = sample(m, NULL, prompt, len, seeds, T, top_k, top_p);
    uint64_t *ka = malloc((size_t)seeds * sizeof *ka), *kb = malloc((size_t)seeds * sizeof *kb);
    int failed = 0;
    for (int d = 1; d < n_dr; d++) {
        run_out spec = sample(m, dr[d].d, prompt, len, seeds, T, top_k, top_p);
        double c2[2], pv[2];
        int df[2], cats[2];
        for (int t = 0; t < 2; t++) {
            for (int i = 0; i < seeds; i++) {
                const int32_t *x = plain.tok + (size_t)i * NEW, *y = spec.tok + (size_t)i * NEW;
                ka[i] = t ? (uint64_t)x[2] : (uint64_t)x[0] << 32 | (uint32_t)x[1];
                kb[i] = t ? (uint64_t)y[2] : (uint64_t)y[0] << 32 | (uint32_t)y[1];
            }
            pv[t] = compare(ka, kb, seeds, &c2[t], &df[t], &cats[t]);
        }
        const int ok = pv[0] > 1e-4 && pv[1] > 1e-4;
        failed |= !ok;
        bench_emit(out, "| plain vs %s | %.2f | %d, %.1f, %d, %.3g | %d, %.1f, %d, %.3g | %s |\n", dr[d].name, spec.accepted, cats[0],
                   c2[0], df[0], pv[0], cats[1], c2[1], df[1], pv[1], ok ? "PASS" : "FAIL");
        free(spec.tok);
    }
    if (out) fclose(out);
    free(ka), free(kb), free(plain.tok);
    for (int d = 1; d < n_dr; d++) kdt_drafter_free(dr[d].d);
    kdt_model_free(dm);
    kdt_model_free(m);
    return failed;
}
