/* The CUDA forward's options (KDT_MODEL_MOE_DEVICE, KDT_MODEL_GRAPHS, KDT_MODEL_FUSED; SKIP where no CUDA
 * device is present). One sequence of forwards per run: a prefill of every request, decode steps of one
 * token each, then verification of a 7-row tree per request three times (truncated back after
 * each), so that every decode and tree shape is seen, captured and replayed. Checks, at batch 1,
 * 8 and 32, f32 and bf16, on the built-in model and on a wider random model (several 2 KB chunks per
 * row in the MoE kernels, partial column tiles):
 * - run to run: the same sequence twice gives the same bits (plain, device MoE, graphs, the fused
 *   router with the device kernels at prefill sizes);
 * - graphs replay the device-MoE forward bit for bit, with logits in host or device memory, and
 *   with the small-batch projections (KDT_MODEL_GEMV), and replays did happen;
 * - programmatic dependent launch (KDT_MODEL_PDL) gives the fused path's bits, direct and in graphs,
 *   and its graphs were captured and replayed;
 * - the device MoE, with the small-batch projections or the fused router, against cuBLAS: every row
 *   within 1e-4 relative L2 in f32; in bf16 the median row within 2e-2 (another summation order
 *   can flip a router near-tie: test_model_cuda.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/device.h"
#include "harness.h"
#include "kdt/model.h"
#include "model/internal.h"

enum { P = 20, STEPS = 6, Q = 7, ROUNDS = 3 };
static const int32_t tree_parent[Q] = {-1, 0, 0, 2, 2, 4, 1};

static uint64_t g_rng = 0x5EED;
static uint32_t rnd(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(g_rng >> 33);
}

/* The inputs of one sequence for B requests. */
typedef struct seq {
    int32_t B, V;
    int32_t *prompt;             /* [B, P] */
    int32_t *dec;                /* [STEPS, B] */
    int32_t *ttok;               /* [B, Q] */
    uint8_t mask[Q * Q];         /* one tree, every request */
    int32_t depth[Q];
} seq;

static size_t seq_rows(const seq *q) { return (size_t)q->B * (1 + STEPS + ROUNDS * Q); }

static void seq_make(seq *q, int32_t B, int32_t V) {
    q->B = B;
    q->V = V;
    q->prompt = malloc((size_t)B * P * sizeof(int32_t));
    q->dec = malloc((size_t)STEPS * B * sizeof(int32_t));
    q->ttok = malloc((size_t)B * Q * sizeof(int32_t));
    for (int32_t i = 0; i < B * P; i++) q->prompt[i] = (int32_t)(rnd() % (uint32_t)V);
    for (int32_t i = 0; i < STEPS * B; i++) q->dec[i] = (int32_t)(rnd() % (uint32_t)V);
    for (int32_t i = 0; i < B * Q; i++) q->ttok[i] = (int32_t)(rnd() % (uint32_t)V);
    memset(q->mask, 0, sizeof q->mask);
    for (int32_t i = 0; i < Q; i++) {
        q->depth[i] = i ? q->depth[tree_parent[i]] + 1 : 0;
        for (int32_t a = i; a >= 0; a = tree_parent[a]) q->mask[i * Q + a] = 1;
    }
}

static void seq_free(seq *q) {
    free(q->prompt);
    free(q->dec);
    free(q->ttok);
}

/* One forward of B requests of n rows each into out (host), through a device buffer when dlog. */
static kdt_status step(kdt_model *m, kdt_cache *c, const seq *q, int32_t n, const int32_t *tok, const int32_t *pos,
                       const uint8_t *mask, kdt_logits_rows lr, float *out, float *dlog) {
    int32_t req[32], rows[32];
    for (int32_t b = 0; b < q->B; b++) req[b] = b, rows[b] = n;
    const kdt_batch bt = {.B = q->B, .req = req, .n_rows = rows, .tokens = tok, .positions = pos, .tree_mask = mask,
                          .logits_rows = lr};
    const size_t bytes = (size_t)(lr == KDT_LOGITS_ALL ? q->B * n : q->B) * q->V * sizeof(float);
    memset(out, 0xFF, bytes);
    kdt_status s = kdt_model_forward(m, c, &bt, dlog ? dlog : out, NULL, NULL);
    if (s == KDT_OK && dlog) s = kdt_dev_d2h(out, dlog, bytes);
    return s;
}

/* The sequence's logits [seq_rows, V] under flags; NULL on failure (reported). */
static float *run_seq(kdt_model *m, uint32_t flags, const seq *q, int dev_logits, const char *what) {
    const size_t V = (size_t)q->V, B = (size_t)q->B;
    float *out = malloc(seq_rows(q) * V * sizeof(float)), *dlog = NULL;
    int32_t *pos = malloc(B * Q * sizeof(int32_t));
    uint8_t *mask = malloc(B * Q * Q);
    kdt_cache *c = NULL;
    kdt_status s = kdt_model_set_flags(m, flags);
    if (s == KDT_OK) s = kdt_cache_create(m, q->B, P + STEPS + Q + 8, 0, &c);
    if (s == KDT_OK && dev_logits) s = kdt_dev_alloc((void **)&dlog, B * Q * V * sizeof(float));
    float *o = out;
    if (s == KDT_OK) s = step(m, c, q, P, q->prompt, NULL, NULL, KDT_LOGITS_LAST, o, dlog);
    o += B * V;
    for (int32_t i = 0; s == KDT_OK && i < STEPS; i++, o += B * V)
        s = step(m, c, q, 1, q->dec + (size_t)i * B, NULL, NULL, KDT_LOGITS_ALL, o, dlog);
    for (int32_t r = 0; s == KDT_OK && r < ROUNDS; r++, o += B * Q * V) {
        const int32_t base = kdt_cache_len(c, 0);
        for (size_t b = 0; b < B; b++) {
            memcpy(mask + b * Q * Q, q->mask, Q * Q);
            for (int32_t i = 0; i < Q; i++) pos[b * Q + (size_t)i] = base + q->depth[i];
        }
        s = step(m, c, q, Q, q->ttok, pos, mask, KDT_LOGITS_ALL, o, dlog);
        for (int32_t b = 0; s == KDT_OK && b < q->B; b++) s = kdt_cache_truncate(c, b, base);
    }
    if (s != KDT_OK) kt_fail("%s: %s", what, kdt_last_error());
    kdt_cache_free(c);
    kdt_dev_free(dlog);
    free(pos);
    free(mask);
    (void)kdt_model_set_flags(m, 0);
    if (s != KDT_OK) {
        free(out);
        return NULL;
    }
    return out;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Per-row relative L2 of got against want: the worst row, the median row, rows above tol. */
static void rows_err(const float *got, const float *want, size_t rows, size_t V, double tol, double *worst, double *median,
                     size_t *above) {
    double *e = malloc(rows * sizeof *e);
    *worst = 0;
    *above = 0;
    for (size_t r = 0; r < rows; r++) {
        e[r] = kt_rel_l2(got + r * V, want + r * V, V);
        if (!(e[r] <= tol)) (*above)++, e[r] = isnan(e[r]) ? INFINITY : e[r];
        if (e[r] > *worst) *worst = e[r];
    }
    qsort(e, rows, sizeof *e, cmp_double);
    *median = rows ? e[(rows - 1) / 2] : 0;
    free(e);
}

static int same_bits(const float *a, const float *b, size_t n) { return a && b && !memcmp(a, b, n * sizeof(float)); }

static void check_model(kdt_model *m, const char *name, kdt_dtype dt, int32_t B) {
    seq q;
    seq_make(&q, B, kdt_model_get_config(m)->vocab_size);
    const size_t rows = seq_rows(&q), n = rows * (size_t)q.V;
    char what[160];
    snprintf(what, sizeof what, "%s %s, batch %d", name, dt == KDT_BF16 ? "bf16" : "f32", B);
    float *plain = run_seq(m, 0, &q, 0, what), *plain2 = run_seq(m, 0, &q, 0, what);
    float *dev = run_seq(m, KDT_MODEL_MOE_DEVICE, &q, 0, what), *dev2 = run_seq(m, KDT_MODEL_MOE_DEVICE, &q, 0, what);
    int64_t rep0, cap0, rep1, cap1;
    kdt_model_graph_counts(m, &rep0, &cap0);
    float *gr = run_seq(m, KDT_MODEL_GRAPHS, &q, 0, what), *grd = run_seq(m, KDT_MODEL_GRAPHS, &q, 1, what);
    kdt_model_graph_counts(m, &rep1, &cap1);
    float *gv = run_seq(m, KDT_MODEL_MOE_DEVICE | KDT_MODEL_GEMV, &q, 0, what);
    float *gvg = run_seq(m, KDT_MODEL_GRAPHS | KDT_MODEL_GEMV, &q, 1, what);
    float *fu = run_seq(m, KDT_MODEL_MOE_DEVICE | KDT_MODEL_FUSED, &q, 0, what);
    float *fu2 = run_seq(m, KDT_MODEL_MOE_DEVICE | KDT_MODEL_FUSED, &q, 0, what);
    float *fug = run_seq(m, KDT_MODEL_GRAPHS | KDT_MODEL_FUSED, &q, 1, what);
    float *pd = run_seq(m, KDT_MODEL_MOE_DEVICE | KDT_MODEL_FUSED | KDT_MODEL_PDL, &q, 0, what);
    int64_t rep2, cap2, rep3, cap3;
    kdt_model_graph_counts(m, &rep2, &cap2);
    float *pdg = run_seq(m, KDT_MODEL_GRAPHS | KDT_MODEL_FUSED | KDT_MODEL_PDL, &q, 1, what);
    kdt_model_graph_counts(m, &rep3, &cap3);
    kt_check(same_bits(plain, plain2, n), "%s: cuBLAS MoE path, run to run: identical bits", what);
    kt_check(same_bits(dev, dev2, n), "%s: device MoE, run to run: identical bits", what);
    kt_check(same_bits(gr, dev, n), "%s: graphs (host logits) = device MoE without graphs, bit for bit", what);
    kt_check(same_bits(grd, dev, n), "%s: graphs (device logits) = device MoE without graphs, bit for bit", what);
    kt_check(same_bits(gvg, gv, n), "%s: small-batch projections: graphs = without graphs, bit for bit", what);
    kt_check(same_bits(fu, fu2, n), "%s: fused router, run to run: identical bits", what);
    kt_check(same_bits(fug, fu, n), "%s: fused router: graphs (device logits) = without graphs, bit for bit", what);
    kt_check(same_bits(pd, fu, n), "%s: programmatic dependent launch, direct runs (up to 64 rows) = without, bit for bit", what);
    kt_check(same_bits(pdg, fu, n) && rep3 - rep2 >= STEPS - 2 && cap3 > cap2,
             "%s: programmatic dependent launch in graphs (device logits) = without, bit for bit; %lld replays of %lld captures%s%s",
             what, (long long)(rep3 - rep2), (long long)(cap3 - cap2), cap3 > cap2 ? "" : "; last error: ", cap3 > cap2 ? "" : kdt_last_error());
    kt_check(rep1 - rep0 >= 2 * (STEPS - 2) && cap1 > cap0, "%s: %lld forwards replayed from %lld captured graphs%s%s", what,
             (long long)(rep1 - rep0), (long long)(cap1 - cap0), cap1 > cap0 ? "" : "; last error: ",
             cap1 > cap0 ? "" : kdt_last_error());
    const float *got[3] = {dev, gv, fu};
    const char *names[3] = {"device MoE", "device MoE + small-batch projections", "device MoE + fused router"};
    for (int k = 0; k < 3 && plain; k++) {
        if (!got[k]) continue;
        const double tol = dt == KDT_BF16 ? 2e-2 : 1e-4;
        double worst, median;
        size_t above;
        rows_err(got[k], plain, rows, (size_t)q.V, tol, &worst, &median, &above);
        if (dt == KDT_BF16)
            kt_check(median <= tol, "%s: %s vs cuBLAS: median row %.2e (<= %.0e), worst %.2e, %zu of %zu rows above", what,
                     names[k], median, tol, worst, above, rows);
        else
            kt_check(above == 0, "%s: %s vs cuBLAS: worst row %.2e (<= %.0e), median %.2e", what, names[k], worst, tol, median);
    }
    free(gv);
    free(gvg);
    free(fu);
    free(fu2);
    free(fug);
    free(pd);
    free(pdg);
    free(plain);
    free(plain2);
    free(dev);
    free(dev2);
    free(gr);
    free(grd);
    seq_free(&q);
}

/* Wider than the built-in model: hidden 1536 (a bf16 row is 1.5 staged chunks), expert width 1032
 * (a partial tile of gate/up columns), 8 experts, top 2. */
static const char *WIDE_CONFIG =
    "{\"vocab_size\": 1000, \"hidden_size\": 1536, \"intermediate_size\": 2048, \"moe_intermediate_size\": 1032,"
    "\"num_hidden_layers\": 3, \"num_attention_heads\": 8, \"q_lora_rank\": 256, \"kv_lora_rank\": 128,"
    "\"qk_nope_head_dim\": 64, \"qk_rope_head_dim\": 32, \"v_head_dim\": 64, \"n_routed_experts\": 8,"
    "\"n_shared_experts\": 1, \"num_experts_per_tok\": 2, \"n_group\": 1, \"topk_group\": 1, \"first_k_dense_replace\": 1,"
    "\"norm_topk_prob\": true, \"routed_scaling_factor\": 2.5, \"max_position_embeddings\": 4096, \"rope_theta\": 10000.0}";

int main(void) {
    if (!kdt_cuda_available()) {
        kt_skip("model graphs: no CUDA device");
        return kt_exit_code();
    }
    const kdt_dtype dts[2] = {KDT_F32, KDT_BF16};
    const int32_t batches[3] = {1, 8, 32};
    for (int i = 0; i < 2; i++) {
        kdt_model *m = NULL;
        if (kdt_model_builtin_as(0x4B44542D4B324DULL, KDT_BACKEND_CUDA, dts[i], &m) != KDT_OK) {
            kt_fail("built-in model: %s", kdt_last_error());
            continue;
        }
        for (int j = 0; j < 3; j++) check_model(m, "built-in model", dts[i], batches[j]);
        kdt_model_free(m);
    }
    kdt_model_config cfg;
    if (kdt_model_config_parse(WIDE_CONFIG, strlen(WIDE_CONFIG), "wide model", &cfg) != KDT_OK) {
        kt_fail("wide model config: %s", kdt_last_error());
        return kt_exit_code();
    }
    for (int i = 0; i < 2; i++) {
        kdt_model *m = NULL;
        if (kdt_model_random_cuda(&cfg, 11, dts[i], &m) != KDT_OK) {
            kt_fail("wide model: %s", kdt_last_error());
            continue;
        }
        for (int j = 0; j < 3; j++) check_model(m, "wide random model", dts[i], batches[j]);
        kdt_model_free(m);
    }
    return kt_exit_code();
}
