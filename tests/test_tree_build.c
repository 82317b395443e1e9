/* tree_build (docs/interfaces.md 2.1) against the numpy bundles of python/gen_tree_build.py: every output
 * exact, on cpu and (where a device is present) cuda; the bad bundles must fail with the stated
 * status and a message naming the problem. Then, on fresh random inputs ($KDT_SEED, else the
 * clock): cuda against cpu byte for byte on sorted rows full of ties, -0.0, +inf heads and
 * -inf/NaN tails, requests of the kernel's parallel (threshold or merge) and sequential paths
 * mixed in each batch (the line names how many of each); both backends on unsorted garbage
 * through the C API (a well-formed tree, no write outside the outputs); and the C API's
 * argument errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "ops/io.h"

static const char *const outputs[] = {"num_nodes", "node_token", "node_parent", "node_depth", "node_cand",
                                      "node_score", "positions", "tree_mask", "first_child", "next_sibling"};
#define N_OUTPUTS (sizeof outputs / sizeof outputs[0])

static void check_good(const char *name, const kdt_kdtr *in, kdt_backend be) {
    kdt_tensor_view sc;
    int32_t budget = 0;
    kdt_kdtr *got = NULL;
    kdt_status s = kdt_kdtr_find(in, "scores", &sc);
    if (s == KDT_OK) s = kdt_kdtr_scalar_i32(in, "budget", &budget);
    if (s == KDT_OK) s = kt_run_op("tree_build", in, be, &got);
    if (s != KDT_OK) {
        kt_fail("%s [%s]  %s: %s", name, kdt_backend_name(be), kdt_status_name(s), kdt_last_error());
        return;
    }
    char msg[300] = "";
    int ok = kt_compare_outputs(got, in, outputs, N_OUTPUTS, msg, sizeof msg);
    kt_check(ok, "%s [%s]  B=%llu D=%llu K=%llu budget=%d%s%s", name, kdt_backend_name(be),
             (unsigned long long)sc.dims[0], (unsigned long long)sc.dims[1], (unsigned long long)sc.dims[2],
             budget, ok ? "" : "  ", msg);
    kdt_kdtr_close(got);
}

static void check_bad(const char *name, const kdt_kdtr *in, kdt_backend be) {
    int32_t want = 0;
    kdt_tensor_view text;
    if (kdt_kdtr_scalar_i32(in, "expected_status", &want) != KDT_OK ||
        kdt_kdtr_find_typed(in, "expected_error", KDT_U8, 1, NULL, &text) != KDT_OK) {
        kt_fail("%s [%s]  bundle lacks expected_status / expected_error", name, kdt_backend_name(be));
        return;
    }
    char needle[256];
    size_t len = text.nbytes < sizeof needle - 1 ? (size_t)text.nbytes : sizeof needle - 1;
    memcpy(needle, text.data, len);
    needle[len] = '\0';
    kdt_kdtr *got = NULL;
    kdt_status s = kt_run_op("tree_build", in, be, &got);
    kdt_kdtr_close(got);
    kt_check(s == (kdt_status)want && strstr(kdt_last_error(), needle) != NULL,
             "%s [%s]  %s (want %s naming \"%s\"): %s", name, kdt_backend_name(be), kdt_status_name(s),
             kdt_status_name((kdt_status)want), needle, s == KDT_OK ? "ran" : kdt_last_error());
}

static void check_bundle(const char *path, kdt_backend be) {
    const char *name = kt_basename(path);
    if (!kt_backend_usable(be, name)) return;
    kdt_kdtr *in = NULL;
    kdt_status s = kdt_kdtr_open_file(path, &in);
    if (s != KDT_OK) kt_fail("%s [%s]  %s: %s", name, kdt_backend_name(be), kdt_status_name(s), kdt_last_error());
    else if (strncmp(name, "tree_build_bad_", 15) == 0) check_bad(name, in, be);
    else check_good(name, in, be);
    kdt_kdtr_close(in);
}

/* ---- random inputs ---- */

static uint64_t g_rng;
static uint32_t rnd(void) { return (uint32_t)(kt_splitmix64(&g_rng) >> 32); }
static float uniform(void) { return (float)(rnd() >> 8) / 16777216.0f; }

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* Sorted rows: values from a few levels (ties everywhere, -0.0 beside 0.0, sums equal across
 * depths and parents, zeros that make a child tie its parent) or continuous; most rows end in
 * -inf / NaN at a random point. Each request draws its kind: log-probabilities (no score above
 * 0: a parallel path of the kernel), or the same with +inf heads or positive scores in some
 * rows (its sequential path), so both paths run side by side in one launch. */
static void sorted_scores(float *sc, int B, int D, int K, int ties) {
    static const float levels[] = {0.0f, -0.0f, -0.5f, -1.0f, -0.6931472f, -2.0f};
    for (int b = 0; b < B; b++) {
        const int kind = (int)(rnd() % 4); /* 0, 1: log-probs; 2: +inf heads; 3: positive scores */
        const int nlev = rnd() % 2 ? 6 : 4;  /* 4: only {0, -0, -0.5, -1} */
        for (int d = 0; d < D; d++) {
            float *row = sc + ((size_t)b * D + d) * K;
            for (int k = 0; k < K; k++)
                row[k] = ties ? levels[rnd() % nlev] : -6.0f * uniform() * uniform();
            if (kind == 3 && rnd() % 4 == 0)
                for (int k = 0; k < K; k++) row[k] += ties ? 1.0f : 0.5f;
            qsort(row, K, sizeof *row, cmp_desc);
            if (kind == 2 && rnd() % 4 == 0) row[0] = INFINITY;
            int cut = rnd() % 4 == 0 ? (int)(rnd() % (K + 1)) : K;
            for (int k = cut; k < K; k++) row[k] = rnd() % 2 ? -INFINITY : NAN;
        }
    }
}

#if KDT_HAVE_CUDA
int kdt_tree_build_cuda_path(int D, int K, int N); /* src/cuda/tree_build.cu */
#endif

/* Requests the CUDA kernel runs on a parallel path (threshold or merge): rows sorted (always,
 * here) and no score above 0, when the shape has one. */
static int parallel_requests(const float *sc, int B, int D, int K, int N) {
#if KDT_HAVE_CUDA
    if (!kdt_tree_build_cuda_path(D, K, N)) return 0;
#else
    (void)N;
#endif
    int n = 0;
    for (int b = 0; b < B; b++) {
        int pos = 0;
        for (size_t i = 0; i < (size_t)D * K; i++) pos |= sc[(size_t)b * D * K + i] > 0.0f;
        n += !pos;
    }
    return n;
}

static void garbage_scores(float *sc, size_t n) {
    static const float special[] = {INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 3e38f, -3e38f};
    for (size_t i = 0; i < n; i++) sc[i] = rnd() % 4 == 0 ? special[rnd() % 7] : 8.0f * uniform() - 6.0f;
}

typedef struct inputs {
    int B, D, K, N;
    float *scores;
    int32_t *tokens, *root, *seq;
} inputs;

static void make_inputs(inputs *x, int B, int D, int K, int N) {
    x->B = B;
    x->D = D;
    x->K = K;
    x->N = N;
    size_t bdk = (size_t)B * D * K;
    x->scores = malloc(bdk * sizeof *x->scores + 1);
    x->tokens = malloc(bdk * sizeof *x->tokens + 1);
    x->root = malloc((size_t)B * 4 + 1);
    x->seq = malloc((size_t)B * 4 + 1);
    for (size_t i = 0; i < bdk; i++) x->tokens[i] = (int32_t)(rnd() % 163840);
    for (int b = 0; b < B; b++) {
        x->root[b] = (int32_t)(rnd() % 163840);
        x->seq[b] = (int32_t)(rnd() % 100000);
    }
}

static void free_inputs(inputs *x) {
    free(x->scores);
    free(x->tokens);
    free(x->root);
    free(x->seq);
}

/* The inputs as an in-memory KDTR reader. */
static kdt_status open_inputs(const inputs *x, kdt_kdtr **in) {
    const uint64_t bdk[3] = {(uint64_t)x->B, (uint64_t)x->D, (uint64_t)x->K}, b1[1] = {(uint64_t)x->B};
    const int32_t budget = x->N;
    kdt_kdtr_writer *w = NULL;
    void *buf = NULL;
    size_t size = 0;
    kdt_status s = kdt_kdtr_writer_create(&w);
    if (s == KDT_OK) s = kdt_kdtr_writer_add(w, "scores", KDT_F32, 3, bdk, x->scores);
    if (s == KDT_OK) s = kdt_kdtr_writer_add(w, "tokens", KDT_I32, 3, bdk, x->tokens);
    if (s == KDT_OK) s = kdt_kdtr_writer_add(w, "root_token", KDT_I32, 1, b1, x->root);
    if (s == KDT_OK) s = kdt_kdtr_writer_add(w, "seq_len", KDT_I32, 1, b1, x->seq);
    if (s == KDT_OK) s = kdt_kdtr_writer_add(w, "budget", KDT_I32, 0, NULL, &budget);
    if (s == KDT_OK) s = kdt_kdtr_writer_to_memory(w, &buf, &size);
    if (s == KDT_OK) s = kdt_kdtr_open_memory(buf, size, in);
    free(buf);
    kdt_kdtr_writer_free(w);
    return s;
}

/* A run's outputs renamed expected.<name>, so that kt_compare_exact can compare two runs. */
static kdt_status as_expected(const kdt_kdtr *run, kdt_kdtr **out) {
    kdt_kdtr_writer *w = NULL;
    void *buf = NULL;
    size_t size = 0;
    kdt_status s = kdt_kdtr_writer_create(&w);
    for (uint32_t i = 0; s == KDT_OK && i < kdt_kdtr_count(run); i++) {
        kdt_tensor_view v;
        char name[300];
        if ((s = kdt_kdtr_get(run, i, &v)) != KDT_OK) break;
        snprintf(name, sizeof name, "expected.%s", v.name);
        s = kdt_kdtr_writer_add(w, name, v.dtype, v.ndim, v.dims, v.data);
    }
    if (s == KDT_OK) s = kdt_kdtr_writer_to_memory(w, &buf, &size);
    if (s == KDT_OK) s = kdt_kdtr_open_memory(buf, size, out);
    free(buf);
    kdt_kdtr_writer_free(w);
    return s;
}

static const int shapes[][4] = { /* B, D, K, N */
    {33, 9, 5, 40}, {7, 20, 3, 200}, {128, 4, 16, 33}, {3, 64, 64, 1024}, {5, 64, 2, 500},
    {16, 16, 8, 128}, {9, 1, 64, 64}, {2, 30, 1, 31}, {40, 6, 6, 257}, {24, 16, 8, 256}, {6, 12, 32, 160},
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

static void check_random_cuda_vs_cpu(uint64_t seed) {
    if (!kt_backend_usable(KDT_BACKEND_CUDA, "tree_build random inputs, cuda against cpu")) return;
    for (size_t c = 0; c < 4 * N_SHAPES; c++) {
        const int *sh = shapes[c % N_SHAPES], ties = (int)(c / N_SHAPES) % 2;
        char what[200];
        inputs x;
        make_inputs(&x, sh[0], sh[1], sh[2], sh[3]);
        sorted_scores(x.scores, x.B, x.D, x.K, ties);
        const int nm = parallel_requests(x.scores, x.B, x.D, x.K, x.N);
        snprintf(what, sizeof what, "tree_build random B=%d D=%d K=%d budget=%d %s paths parallel=%d sequential=%d seed=%llu",
                 sh[0], sh[1], sh[2], sh[3], ties ? "ties" : "continuous", nm, x.B - nm, (unsigned long long)seed);
        kdt_kdtr *in = NULL, *cpu = NULL, *want = NULL, *gpu = NULL;
        kdt_status s = open_inputs(&x, &in);
        if (s == KDT_OK) s = kt_run_op("tree_build", in, KDT_BACKEND_CPU, &cpu);
        if (s == KDT_OK) s = as_expected(cpu, &want);
        if (s == KDT_OK) s = kt_run_op("tree_build", in, KDT_BACKEND_CUDA, &gpu);
        char msg[300] = "";
        if (s != KDT_OK) kt_fail("%s [cuda vs cpu]  %s: %s", what, kdt_status_name(s), kdt_last_error());
        else {
            int ok = kt_compare_outputs(gpu, want, outputs, N_OUTPUTS, msg, sizeof msg);
            kt_check(ok, "%s [cuda vs cpu]%s%s", what, ok ? "" : "  ", msg);
        }
        kdt_kdtr_close(gpu);
        kdt_kdtr_close(want);
        kdt_kdtr_close(cpu);
        kdt_kdtr_close(in);
        free_inputs(&x);
    }
}

/* ---- unsorted garbage through the C API ---- */

typedef struct outputs_host {
    int32_t *num, *tok, *par, *dep, *cand, *pos, *fc, *ns;
    float *score;
    uint8_t *mask;
} outputs_host;

/* Where request b's outputs break docs/interfaces.md 2.1's structure, or NULL. Checks everything that holds
 * whatever the scores' order: parents before children, depths, tokens, scores as exact sums
 * (finite), no candidate twice, positions, fills, children lists and the mask. */
static const char *tree_fault(const inputs *x, const outputs_host *o, int b) {
    const int D = x->D, K = x->K, Q = x->N + 1;
    const size_t r = (size_t)b * Q;
    const int32_t n = o->num[b];
    if (n < 0 || n > x->N) return "num_nodes out of range";
    if (o->tok[r] != x->root[b] || o->par[r] != -1 || o->dep[r] != 0 || o->cand[r] != -1 || o->score[r] != 0.0f ||
        o->pos[r] != x->seq[b] || o->ns[r] != -1)
        return "root";
    for (int i = 1; i <= n; i++) {
        int32_t p = o->par[r + i], t = o->dep[r + i], k = o->cand[r + i];
        if (p < 0 || p >= i || t != o->dep[r + p] + 1 || t > D || k < 0 || k >= K) return "parent, depth or cand";
        size_t c = ((size_t)b * D + t - 1) * K + k;
        float sum = o->score[r + p] + x->scores[c];
        if (!isfinite(sum) || memcmp(&sum, &o->score[r + i], 4) != 0) return "node_score is not parent + score, or not finite";
        if (o->tok[r + i] != x->tokens[c] || o->pos[r + i] != x->seq[b] + t) return "token or position";
        for (int j = 1; j < i; j++)
            if (o->par[r + j] == p && o->cand[r + j] == k) return "a candidate selected twice";
    }
    for (int i = n + 1; i < Q; i++)
        if (o->tok[r + i] != -1 || o->par[r + i] != -1 || o->dep[r + i] != -1 || o->cand[r + i] != -1 ||
            o->score[r + i] != -INFINITY || o->pos[r + i] != -1 || o->fc[r + i] != -1 || o->ns[r + i] != -1)
            return "fill";
    for (int i = 0; i <= n; i++) { /* the list of i's children: every child, in increasing order */
        int32_t prev = i, c = o->fc[r + i], seen = 0;
        for (; c != -1; prev = c, c = o->ns[r + c], seen++)
            if (c <= prev || c > n || o->par[r + c] != i) return "children lists";
        for (int j = i + 1; j <= n; j++) seen -= o->par[r + j] == i;
        if (seen != 0) return "children lists miss a child";
    }
    const uint8_t *m = o->mask + (size_t)b * Q * Q; /* row i: ones at i and its ancestors only */
    for (int i = 0; i < Q; i++) {
        int ones = 0;
        for (int j = 0; j < Q; j++) ones += m[(size_t)i * Q + j] != 0;
        if (i > n) {
            if (ones) return "tree_mask fill row";
            continue;
        }
        for (int a = i; a >= 0; a = o->par[r + a])
            if (m[(size_t)i * Q + a] != 1) return "tree_mask misses an ancestor";
        if (ones != o->dep[r + i] + 1) return "tree_mask has a non-ancestor";
    }
    return NULL;
}

/* Runs the C API on x (host memory; staged with guard bytes for cuda) into o. */
static kdt_status run_direct(const inputs *x, kdt_backend be, outputs_host *o) {
    const int B = x->B, Q = x->N + 1;
    const size_t b4 = (size_t)B * 4, bdk4 = b4 * x->D * x->K, bq4 = b4 * Q, bqq = (size_t)B * Q * Q;
    kdt_tree_build_params p = {.B = B, .D = x->D, .K = x->K, .budget = x->N};
    kdt_stage st;
    kdt_stage_init(&st, be);
    kdt_status s;
    if ((s = kdt_stage_in(&st, "scores", x->scores, bdk4, (const void **)&p.scores)) ||
        (s = kdt_stage_in(&st, "tokens", x->tokens, bdk4, (const void **)&p.tokens)) ||
        (s = kdt_stage_in(&st, "root_token", x->root, b4, (const void **)&p.root_token)) ||
        (s = kdt_stage_in(&st, "seq_len", x->seq, b4, (const void **)&p.seq_len)) ||
        (s = kdt_stage_out(&st, "num_nodes", o->num, b4, (void **)&p.num_nodes)) ||
        (s = kdt_stage_out(&st, "node_token", o->tok, bq4, (void **)&p.node_token)) ||
        (s = kdt_stage_out(&st, "node_parent", o->par, bq4, (void **)&p.node_parent)) ||
        (s = kdt_stage_out(&st, "node_depth", o->dep, bq4, (void **)&p.node_depth)) ||
        (s = kdt_stage_out(&st, "node_cand", o->cand, bq4, (void **)&p.node_cand)) ||
        (s = kdt_stage_out(&st, "node_score", o->score, bq4, (void **)&p.node_score)) ||
        (s = kdt_stage_out(&st, "positions", o->pos, bq4, (void **)&p.positions)) ||
        (s = kdt_stage_out(&st, "tree_mask", o->mask, bqq, (void **)&p.tree_mask)) ||
        (s = kdt_stage_out(&st, "first_child", o->fc, bq4, (void **)&p.first_child)) ||
        (s = kdt_stage_out(&st, "next_sibling", o->ns, bq4, (void **)&p.next_sibling)) ||
        (s = kdt_tree_build(&p, be, NULL)) || (s = kdt_stage_finish(&st))) {
        kdt_stage_release(&st);
        return s;
    }
    kdt_stage_release(&st);
    return s;
}

static void check_garbage(kdt_backend be, uint64_t seed) {
    if (!kt_backend_usable(be, "tree_build unsorted garbage through the C API")) return;
    for (size_t c = 0; c < N_SHAPES; c++) {
        const int *sh = shapes[c];
        char what[160];
        snprintf(what, sizeof what, "tree_build unsorted garbage B=%d D=%d K=%d budget=%d seed=%llu", sh[0], sh[1],
                 sh[2], sh[3], (unsigned long long)seed);
        inputs x;
        make_inputs(&x, sh[0], sh[1], sh[2], sh[3]);
        garbage_scores(x.scores, (size_t)x.B * x.D * x.K);
        const size_t bq = (size_t)x.B * (x.N + 1);
        outputs_host o = {malloc(x.B * 4), malloc(bq * 4), malloc(bq * 4), malloc(bq * 4), malloc(bq * 4),
                          malloc(bq * 4), malloc(bq * 4), malloc(bq * 4), malloc(bq * 4), malloc(bq * (x.N + 1))};
        memset(o.num, 0xFF, x.B * 4);
        int32_t *arrays[] = {o.tok, o.par, o.dep, o.cand, o.pos, o.fc, o.ns, (int32_t *)o.score};
        for (int i = 0; i < 8; i++) memset(arrays[i], 0xFF, bq * 4);
        memset(o.mask, 0xFF, bq * (x.N + 1));
        kdt_status s = run_direct(&x, be, &o);
        const char *fault = NULL;
        int b = 0;
        for (; s == KDT_OK && !fault && b < x.B; b++) fault = tree_fault(&x, &o, b);
        if (s != KDT_OK) kt_fail("%s [%s]  %s: %s", what, kdt_backend_name(be), kdt_status_name(s), kdt_last_error());
        else if (fault) kt_fail("%s [%s]  request %d: %s", what, kdt_backend_name(be), b - 1, fault);
        else kt_pass("%s [%s]", what, kdt_backend_name(be));
        int32_t *all[] = {o.num, o.tok, o.par, o.dep, o.cand, o.pos, o.fc, o.ns};
        for (int i = 0; i < 8; i++) free(all[i]);
        free(o.score);
        free(o.mask);
        free_inputs(&x);
    }
}

static void check_api_errors(void) {
    int32_t i1[1] = {0};
    float f1[1] = {0};
    uint8_t u1[1] = {0};
    /* Valid but for the one field each case breaks (never run as is: the outputs are too small). */
    const kdt_tree_build_params ok = {
        .B = 1, .D = 1, .K = 1, .budget = 1, .scores = f1, .tokens = i1, .root_token = i1, .seq_len = i1,
        .num_nodes = i1, .node_token = i1, .node_parent = i1, .node_depth = i1, .node_cand = i1,
        .node_score = f1, .positions = i1, .tree_mask = u1, .first_child = i1, .next_sibling = i1};
    struct { const char *what; kdt_tree_build_params p; kdt_status want; } cases[] = {
        {"B = -1", ok, KDT_ERR_SHAPE},           {"D = 0", ok, KDT_ERR_SHAPE},
        {"D = 65", ok, KDT_ERR_SHAPE},           {"K = 65", ok, KDT_ERR_SHAPE},
        {"budget = 0", ok, KDT_ERR_INVALID_ARG}, {"budget = 1025", ok, KDT_ERR_INVALID_ARG},
        {"scores NULL", ok, KDT_ERR_INVALID_ARG}, {"tree_mask NULL", ok, KDT_ERR_INVALID_ARG},
    };
    cases[0].p.B = -1;
    cases[1].p.D = 0;
    cases[2].p.D = 65;
    cases[3].p.K = 65;
    cases[4].p.budget = 0;
    cases[5].p.budget = 1025;
    cases[6].p.scores = NULL;
    cases[7].p.tree_mask = NULL;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kdt_status s = kdt_tree_build(&cases[i].p, KDT_BACKEND_CPU, NULL);
        kt_check(s == cases[i].want, "tree_build C API: %s -> %s (%s)", cases[i].what, kdt_status_name(s),
                 kdt_last_error());
    }
    kdt_status s = kdt_tree_build(NULL, KDT_BACKEND_CPU, NULL);
    kt_check(s == KDT_ERR_INVALID_ARG, "tree_build C API: NULL params -> %s", kdt_status_name(s));
    kdt_tree_build_params empty = {.B = 0, .D = 1, .K = 1, .budget = 1};
    s = kdt_tree_build(&empty, KDT_BACKEND_CPU, NULL);
    kt_check(s == KDT_OK, "tree_build C API: B = 0 with NULL pointers runs -> %s", kdt_status_name(s));
}

int main(void) {
    char **paths = NULL;
    size_t n = kt_list_bundles("tree_build_", &paths);
    if (n == 0) kt_fail("tree_build: no tree_build_*.kdtr in %s (run python/gen_tree_build.py)", kt_data_dir());
    for (size_t i = 0; i < n; i++) {
        check_bundle(paths[i], KDT_BACKEND_CPU);
        check_bundle(paths[i], KDT_BACKEND_CUDA);
    }
    kt_free_list(paths, n);

    const char *env = getenv("KDT_SEED");
    uint64_t seed = env && *env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    g_rng = seed;
    check_random_cuda_vs_cpu(seed);
    check_garbage(KDT_BACKEND_CPU, seed);
    check_garbage(KDT_BACKEND_CUDA, seed);
    check_api_errors();
    return kt_exit_code();
}
