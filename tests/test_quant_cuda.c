/* Quantized checkpoints on the CUDA backend with their weights kept quantized on the device
 * (src/model/cuda/linear.cu, the quantized experts of moe.cu): the FP8 fixture (DeepSeek-V3's
 * layout) and the INT4 one (Kimi K2.6's), each against its dequantized twin run on the same
 * backend in bf16 and against the CPU's exact f32 forward of the quantized checkpoint. Every
 * path runs: a prefill (prompt rows, quant_gemm's decode GEMM), decode steps of one row (the
 * device MoE, captured and replayed as CUDA graphs), and a batch of two requests of prompt +
 * continuation (past KDT_LIN_QGEMM_ROWS rows: dequantize + cuBLAS, and per-expert products
 * sized on the host). Checks: logits within bf16 tolerance of both references, transformers'
 * greedy continuation, and the device bytes per layer (quantized, against bf16). SKIP without a
 * CUDA device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kdt/model.h"
#include "model/internal.h"

#define TOL 2e-2 /* relative L2 per logit row: bf16 (tests/test_model_cuda.c's TOL_BF16) */

typedef struct run {
    float *tf;                   /* [P + N, V]: prefill of the prompt, then N decode steps of the continuation */
    float *batch;                /* [2 (P + N), V]: two requests of prompt + continuation in one forward */
    size_t now[4], bf16[4];      /* device bytes by part, summed over the layers (CUDA) */
} run;

static kdt_status forward(kdt_model *m, kdt_cache *c, int32_t B, const int32_t *req, const int32_t *n, const int32_t *tok,
                          float *logits) {
    kdt_batch b = {.B = B, .req = req, .n_rows = n, .tokens = tok, .logits_rows = KDT_LOGITS_ALL};
    return kdt_model_forward(m, c, &b, logits, NULL, NULL);
}

static kdt_status run_model(const char *dir, kdt_backend be, int32_t P, int32_t N, const int32_t *tok, int32_t V, run *r) {
    *r = (run){.tf = kt_poisoned((size_t)(P + N) * V), .batch = kt_poisoned((size_t)2 * (P + N) * V)};
    kdt_model *m = NULL;
    kdt_cache *c = NULL;
    kdt_status s = kdt_model_load_as(dir, be, be == KDT_BACKEND_CUDA ? KDT_BF16 : KDT_F32, &m);
    if (s == KDT_OK) s = kdt_cache_create(m, 3, P + N + 8, 0, &c);
    const int32_t req[3] = {0, 1, 2}, one = 1, both[2] = {P + N, P + N};
    if (s == KDT_OK) s = forward(m, c, 1, req, &P, tok, r->tf);
    for (int32_t i = 0; i < N && s == KDT_OK; i++) s = forward(m, c, 1, req, &one, tok + P + i, r->tf + (size_t)(P + i) * V);
    int32_t *two = malloc((size_t)2 * (P + N) * sizeof *two);
    if (two) memcpy(two, tok, (size_t)(P + N) * 4), memcpy(two + P + N, tok, (size_t)(P + N) * 4);
    if (s == KDT_OK) s = two ? forward(m, c, 2, req + 1, both, two, r->batch) : KDT_ERR_NOMEM;
    free(two);
    for (int32_t l = 0; s == KDT_OK && be == KDT_BACKEND_CUDA && l < m->cfg.num_hidden_layers; l++) {
        size_t now[4], bf[4];
        kdt_model_layer_bytes(m, l, now, bf);
        for (int i = 0; i < 4; i++) r->now[i] += now[i], r->bf16[i] += bf[i];
    }
    kdt_cache_free(c);
    kdt_model_free(m);
    return s;
}

/* Rows of got farther from want than TOL, plus, where twin is given, the twin's own distance from
 * want (against the CPU's f32: bf16 activations alone put rows of these fixtures at up to 2.5e-2
 * from f32, and |got - want| <= |got - twin| + |twin - want|); *worst is the largest excess. */
static int64_t rows_over(const float *got, const float *want, const float *twin, int64_t rows, int32_t V, double *worst) {
    int64_t bad = 0;
    *worst = 0;
    for (int64_t r = 0; r < rows; r++) {
        const double e = kt_rel_l2(got + r * V, want + r * V, V) - (twin ? kt_rel_l2(twin + r * V, want + r * V, V) : 0);
        bad += !(e <= TOL);
        *worst = isnan(e) || e > *worst ? e : *worst;
    }
    return bad;
}

static void check(const char *name, int fp8) {
    char dir[512], twin[600], path[600];
    snprintf(dir, sizeof dir, "tests/fixtures/model/%s", name);
    snprintf(twin, sizeof twin, "%s/twin", dir);
    snprintf(path, sizeof path, "%s/expected.kdtr", dir);
    kdt_kdtr *k = NULL;
    kdt_tensor_view tp, tc;
    if (kdt_kdtr_open_file(path, &k) != KDT_OK || kdt_kdtr_find(k, "prompt", &tp) != KDT_OK ||
        kdt_kdtr_find(k, "continuation", &tc) != KDT_OK) {
        kt_fail("%s: %s", path, kdt_last_error());
        kdt_kdtr_close(k);
        return;
    }
    const int32_t P = (int32_t)tp.numel, N = (int32_t)tc.numel, R = P + N;
    int32_t *tok = malloc((size_t)R * sizeof *tok);
    memcpy(tok, tp.data, (size_t)P * 4);
    memcpy(tok + P, tc.data, (size_t)N * 4);
    const int32_t *cont = tok + P;
    printf("%s prompt ids: ", name); /* for scripts/gpu_quant_wire.sh's kdt generate runs */
    for (int32_t i = 0; i < P; i++) printf("%s%d", i ? "," : "", tok[i]);
    printf("\n");
    kdt_model *probe = NULL;
    int32_t V = 0;
    if (kdt_model_load(dir, KDT_BACKEND_CPU, &probe) == KDT_OK) V = kdt_model_get_config(probe)->vocab_size;
    kdt_model_free(probe);
    run q = {0}, t = {0}, c = {0};
    kdt_status s = V ? run_model(dir, KDT_BACKEND_CUDA, P, N, tok, V, &q) : KDT_ERR_NOT_FOUND;
    if (s == KDT_OK) s = run_model(twin, KDT_BACKEND_CUDA, P, N, tok, V, &t);
    if (s == KDT_OK) s = run_model(dir, KDT_BACKEND_CPU, P, N, tok, V, &c);
    if (s != KDT_OK) {
        kt_fail("%s: %s", name, kdt_last_error());
    } else {
        printf("%s: device bytes over %s's layers, quantized / bf16: attention %zu / %zu, routed experts %zu / %zu, "
               "shared %zu / %zu, dense %zu / %zu\n", name, name, q.now[0], q.bf16[0], q.now[1], q.bf16[1], q.now[2], q.bf16[2],
               q.now[3], q.bf16[3]);
        kt_check(q.now[1] * 10 < q.bf16[1] * (fp8 ? 6 : 4) && t.now[1] == t.bf16[1] && (!fp8 || q.now[0] < q.bf16[0]),
                 "%s cuda: the routed experts%s stay quantized on the device: %zu bytes against %zu in bf16", name,
                 fp8 ? " and attention" : "", q.now[1], q.bf16[1]);
        double w;
        int64_t bad = rows_over(q.tf, t.tf, NULL, R, V, &w);
        kt_check(!bad, "%s cuda: prefill + %d decode steps within %.0e of the dequantized twin on cuda (bf16): %lld of %d rows over, "
                 "worst %.2e", name, N, TOL, (long long)bad, R, w);
        bad = rows_over(q.tf, c.tf, t.tf, R, V, &w);
        kt_check(!bad, "%s cuda: prefill + decode within %.0e plus the twin's own error of the CPU's exact f32 forward: %lld of %d rows "
                 "over, worst excess %.2e", name, TOL, (long long)bad, R, w);
        double w2;
        bad = rows_over(q.batch, t.batch, NULL, 2 * R, V, &w) + rows_over(q.batch, c.batch, t.batch, 2 * R, V, &w2);
        w = w2 > w ? w2 : w;
        kt_check(!bad, "%s cuda: a batch of 2 x %d rows (dequantize + cuBLAS, per-expert products) within %.0e of the twin and the "
                 "CPU (as above): %lld rows over, worst %.2e", name, R, TOL, (long long)bad, w);
        int32_t part = -1;
        for (int32_t i = 0; i < N && part < 0; i++)
            if (kt_argmax(q.tf + (size_t)(P - 1 + i) * V, V) != cont[i] || kt_argmax(q.batch + (size_t)(P - 1 + i) * V, V) != cont[i] ||
                kt_argmax(t.tf + (size_t)(P - 1 + i) * V, V) != cont[i])
                part = i;
        kt_check(part < 0, "%s cuda: greedy continuation of %d tokens equals transformers' (and the twin's)%s", name, N,
                 part < 0 ? "" : ", parts at a step");
    }
    free(q.tf), free(q.batch), free(t.tf), free(t.batch), free(c.tf), free(c.batch);
    free(tok);
    kdt_kdtr_close(k);
}

int main(void) {
    if (!kdt_cuda_available()) {
        kt_skip("quant cuda: no CUDA device");
        return kt_exit_code();
    }
    check("fp8", 1);
    check("int4_k26", 0);
    return kt_exit_code();
}
