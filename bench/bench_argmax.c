/* bench_argmax: how often a tree-shaped forward (speculative verification) and a decode-shaped
 * one (a row a step) disagree on the argmax of the same row, on real weights. For each prompt:
 * greedy decoding of --steps tokens one row per forward (the decode argmaxes), then, after the same
 * prefill again, the same tokens verified in chains of --tree rows, each one forward with a tree
 * mask (each row sees the rows before it) and explicit positions, as the speculative loop's
 * verification does. A row disagrees when the two argmaxes differ; the top-2 margin of the decode
 * logits at disagreements says whether they were near-ties. The forward's options come from
 * $KDT_MODEL_FLAGS (include/kdt/model.h), so one binary compares them.
 *
 *   build/bench/bench_argmax [--model models/kdt-small] [--prompts FILE] [--limit 16] [--steps 64]
 *        [--tree 16] [--backend cuda|cpu] [--out FILE]
 *
 * Prints one line per prompt and a total: rows compared, disagreements, the first disagreement's
 * step, the largest top-2 margin among them. Exit 1 on a library error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_prompts.h"
#include "kdt/kdt.h"
#include "kdt/model.h"

static void die(const char *what) {
    fprintf(stderr, "bench_argmax: %s: %s\n", what, kdt_last_error());
    exit(1);
}

/* The argmax of row [V] (lower index on ties) and its margin over the runner-up. */
static int32_t argmax(const float *row, int32_t V, float *margin) {
    int32_t best = 0;
    float b1 = -INFINITY, b2 = -INFINITY;
    for (int32_t j = 0; j < V; j++) {
        if (row[j] > b1) b2 = b1, b1 = row[j], best = j;
        else if (row[j] > b2) b2 = row[j];
    }
    *margin = b1 - b2;
    return best;
}

/* One forward of request 0: n rows (tokens, positions, mask may be NULL), logits of every row. */
static void forward(kdt_model *m, kdt_cache *c, int32_t n, const int32_t *tok, const int32_t *pos, const uint8_t *mask,
                    kdt_logits_rows lr, float *logits) {
    const int32_t req = 0;
    const kdt_batch bt = {.B = 1, .req = &req, .n_rows = &n, .tokens = tok, .positions = pos, .tree_mask = mask,
                          .logits_rows = lr};
    if (kdt_model_forward(m, c, &bt, logits, NULL, NULL) != KDT_OK) die("forward");
}

int main(int argc, char **argv) {
    const char *model_dir = "models/kdt-small", *prompts_path = NULL, *out_path = NULL, *backend = "cuda";
    int limit = 16, steps = 64, tree = 16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "bench_argmax: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "--model")) model_dir = v;
        else if (!strcmp(a, "--prompts")) prompts_path = v;
        else if (!strcmp(a, "--limit")) limit = atoi(v);
        else if (!strcmp(a, "--steps")) steps = atoi(v);
        else if (!strcmp(a, "--tree")) tree = atoi(v);
        else if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "--out")) out_path = v;
        else { fprintf(stderr, "bench_argmax: unknown option %s\n", a); return 2; }
        i++;
    }
    if (limit < 1 || steps < 1 || tree < 1 || tree > KDT_MODEL_MAX_TREE) {
        fprintf(stderr, "bench_argmax: --limit, --steps and --tree (at most %d) must be positive\n", KDT_MODEL_MAX_TREE);
        return 2;
    }
    kdt_model *m = NULL;
    if (kdt_model_load(model_dir, strcmp(backend, "cpu") ? KDT_BACKEND_CUDA : KDT_BACKEND_CPU, &m) != KDT_OK) die(model_dir);
    const int32_t V = kdt_model_get_config(m)->vocab_size;
    char path[1024];
    snprintf(path, sizeof path, "%s/heldout_prompts.ids", model_dir);
    prompts p = {0};
    if (read_prompts("bench_argmax", prompts_path ? prompts_path : path, limit, V, &p) || !p.n) return 1;
    FILE *out = out_path ? fopen(out_path, "w") : NULL;
    int32_t max_len = 0;
    for (int i = 0; i < p.n; i++) max_len = p.len[i] > max_len ? p.len[i] : max_len;
    kdt_cache *c = NULL;
    if (kdt_cache_create(m, 1, max_len + steps + tree + 1, 0, &c) != KDT_OK) die("cache");
    float *logits = malloc((size_t)tree * V * sizeof(float));
    int32_t *toks = malloc((size_t)(steps + 1) * sizeof(int32_t)), *dec = malloc((size_t)steps * sizeof(int32_t));
    float *dmargin = malloc((size_t)steps * sizeof(float));
    int32_t *pos = malloc((size_t)tree * sizeof(int32_t));
    uint8_t *mask = malloc((size_t)tree * tree);
    if (!logits || !toks || !dec || !dmargin || !pos || !mask) return 1;
    long rows = 0, differ = 0;
    float worst_margin = 0;
    const char *flags = getenv("KDT_MODEL_FLAGS");
    fprintf(stdout, "bench_argmax: %s, %s, flags %u%s, %d prompts, %d steps, chains of %d rows\n", model_dir, backend,
            kdt_model_flags(m), flags ? " ($KDT_MODEL_FLAGS)" : "", p.n, steps, tree);
    if (out) fprintf(out, "| prompt | rows | disagreements | first at step | largest top-2 margin there |\n|---|---|---|---|---|\n");
    for (int i = 0; i < p.n; i++) {
        float mg;
        if (kdt_cache_reset(c, 0) != KDT_OK) die("reset");
        forward(m, c, p.len[i], p.ids[i], NULL, NULL, KDT_LOGITS_LAST, logits);
        toks[0] = argmax(logits, V, &mg);
        for (int s = 0; s < steps; s++) { /* dec[s]: the argmax after toks[s], decode-shaped */
            forward(m, c, 1, &toks[s], NULL, NULL, KDT_LOGITS_LAST, logits);
            dec[s] = toks[s + 1] = argmax(logits, V, &dmargin[s]);
        }
        if (kdt_cache_reset(c, 0) != KDT_OK) die("reset");
        forward(m, c, p.len[i], p.ids[i], NULL, NULL, KDT_LOGITS_LAST, logits);
        int n_diff = 0, first = -1;
        float margin = 0;
        for (int s0 = 0; s0 < steps; s0 += tree) {
            const int32_t q = steps - s0 < tree ? steps - s0 : tree, base = kdt_cache_len(c, 0);
            for (int32_t a = 0; a < q; a++) { /* a chain: each row sees the rows before it */
                pos[a] = base + a;
                for (int32_t b = 0; b < q; b++) mask[a * q + b] = b <= a;
            }
            forward(m, c, q, &toks[s0], pos, mask, KDT_LOGITS_ALL, logits);
            for (int32_t r = 0; r < q; r++) {
                if (argmax(logits + (size_t)r * V, V, &mg) == dec[s0 + r]) continue;
                n_diff++;
                if (first < 0) first = s0 + r;
                if (dmargin[s0 + r] > margin) margin = dmargin[s0 + r];
            }
        }
        rows += steps;
        differ += n_diff;
        if (margin > worst_margin) worst_margin = margin;
        fprintf(stdout, "prompt %3d: %d rows, %d disagree%s", i, steps, n_diff, first >= 0 ? "" : "\n");
        if (first >= 0) fprintf(stdout, ", first at step %d, largest top-2 margin %.3g\n", first, margin);
        if (out) fprintf(out, "| %d | %d | %d | %d | %.3g |\n", i, steps, n_diff, first, margin);
    }
    fprintf(stdout, "total: %ld rows, %ld disagree (%.2f%%), largest top-2 margin at a disagreement %.3g\n", rows, differ,
            rows ? 100.0 * differ / rows : 0.0, worst_margin);
    if (out) {
        fprintf(out, "\nTotal: %ld rows, %ld disagree (%.2f%%); flags %u.\n", rows, differ, rows ? 100.0 * differ / rows : 0.0,
                kdt_model_flags(m));
        fclose(out);
    }
    for (int i = 0; i < p.n; i++) free(p.ids[i]);
    free(p.ids);
    free(p.len);
    free(logits), free(toks), free(dec), free(dmargin), free(pos), free(mask);
    kdt_cache_free(c);
    kdt_model_free(m);
    return 0;
}
