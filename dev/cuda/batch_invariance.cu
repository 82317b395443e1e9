/* Which op gives a row other bits in a 1-row decode step than inside a larger verify (issue 21's
 * equality: bench_spec's oracle trees of 17 rows part from greedy, its 5-row chains do not). On
 * bench_spec's model (Kimi K2's dims, 4 layers: a dense one then 3 MoE layers of 16 experts, vocab
 * 163840, random bf16 weights, seed 7 as bench_spec's), after a 64-token prefill, the same token at
 * the same position as a decode step and as row 0 of a chain of 5 and of 17 rows and of a 17-row tree
 * (row 0 the root, 16 children): row 0's hidden state after each layer (kdt_model_set_hidden_layers)
 * and its logits against the decode step's, bit for bit (else the largest |d| over the largest |x|);
 * the same again with $KDT_VA_SM90=0 (verify_attn's general kernel in place of the sm90 one). Then
 * cuBLAS alone (kdt_lin_gemm, the forward's GEMM, with the forward's 32 MB workspace) on each of the
 * model's weight shapes at M = 1, 5, 17: row 0's output at M = 5 and 17 against M = 1.
 *
 *   make BUILD=build build/dev/batch_invariance   (links build/libkdt.a)
 *   build/dev/batch_invariance */
#include <math.h>

#include <cublas_v2.h>

#include "../../bench/bench_common.h"
#include "model/cuda.h"
#include "model/cuda/linear.h"
#include "model/internal.h"

namespace {

constexpr int kP = 64, kLayers = 4, kMaxRows = 17;

/* "same", or the largest |a - b| over the largest |b| of n floats. */
const char *cmp(const float *a, const float *b, size_t n, char *buf, size_t cap) {
    if (!memcmp(a, b, n * sizeof(float))) return "same";
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i])), m = fmax(m, fabs((double)b[i]));
    snprintf(buf, cap, "DIFFERS (%.1e)", m > 0 ? d / m : d);
    return buf;
}

/* One forward of n rows of request 0 after its kP prompt rows, row 0 = tok at position kP; tree: rows 1 ..
 * n - 1 children of row 0 (else a chain). Row 0's hidden states [kLayers, hid] and logits [V] to the host;
 * the cache is cut back to the prompt. */
void run_row0(kdt_model *m, kdt_cache *c, int n, bool tree, int32_t tok, float *hid_dev, float *hid0, float *logits0) {
    const kdt_model_config *cf = kdt_model_get_config(m);
    const int32_t V = cf->vocab_size, H = cf->hidden_size;
    int32_t req = 0, rows = n, toks[kMaxRows], pos[kMaxRows];
    uint8_t mask[kMaxRows * kMaxRows] = {};
    for (int i = 0; i < n; i++) {
        toks[i] = i ? (tok + 7919 * i) % V : tok;
        pos[i] = kP + (tree ? (i > 0) : i);
        mask[i * n] = mask[i * n + i] = 1;
        for (int j = 0; !tree && j < i; j++) mask[i * n + j] = 1;
    }
    kdt_batch b;
    memset(&b, 0, sizeof b);
    b.B = 1, b.req = &req, b.n_rows = &rows, b.tokens = toks, b.logits_rows = KDT_LOGITS_ALL;
    if (tree) b.positions = pos, b.tree_mask = mask;
    float *lg = (float *)malloc((size_t)n * V * sizeof(float));
    KCK(kdt_model_forward(m, c, &b, lg, hid_dev, NULL));
    CK(cudaMemcpy(hid0, hid_dev, (size_t)kLayers * H * sizeof(float), cudaMemcpyDeviceToHost)); /* row 0 */
    memcpy(logits0, lg, (size_t)V * sizeof(float));
    free(lg);
    KCK(kdt_cache_truncate(c, 0, kP));
}

void model_rows(kdt_model *m, kdt_cache *c, float *hid_dev, const char *what) {
    const kdt_model_config *cf = kdt_model_get_config(m);
    const int32_t V = cf->vocab_size, H = cf->hidden_size, tok = 4242 % V;
    const struct {
        const char *name;
        int n;
        bool tree;
    } shapes[] = {{"chain 5", 5, false}, {"chain 17", 17, false}, {"tree 17", 17, true}};
    float *h1 = (float *)malloc((size_t)kLayers * H * 4), *l1 = (float *)malloc((size_t)V * 4);
    float *hn = (float *)malloc((size_t)kLayers * H * 4), *ln = (float *)malloc((size_t)V * 4);
    run_row0(m, c, 1, false, tok, hid_dev, h1, l1);
    char buf[64];
    for (const auto &sh : shapes) {
        run_row0(m, c, sh.n, sh.tree, tok, hid_dev, hn, ln);
        printf("%s: row 0 of a %s against a decode step:", what, sh.name);
        for (int l = 0; l < kLayers; l++) printf(" layer %d %s,", l, cmp(hn + (size_t)l * H, h1 + (size_t)l * H, (size_t)H, buf, sizeof buf));
        printf(" logits %s\n", cmp(ln, l1, (size_t)V, buf, sizeof buf));
    }
    free(h1), free(l1), free(hn), free(ln);
}

/* Row 0 of y = x . W^T at M = 5 and 17 against M = 1 (W [N, K] bf16, random; y f32). */
void gemm_rows(cublasHandle_t h, const char *name, int N, int K, void *w, void *x, float *y) {
    KCK(kdt_cuda_fill_uniform(w, KDT_BF16, (size_t)N * K, 31 + N, 0.f, 1.f / sqrtf((float)K)));
    KCK(kdt_cuda_fill_uniform(x, KDT_BF16, (size_t)kMaxRows * K, 37 + K, 0.f, 1.f));
    float *r1 = (float *)malloc((size_t)N * 4), *rm = (float *)malloc((size_t)N * 4);
    char buf[64];
    printf("cublas %s [%d, %d]:", name, N, K);
    for (int M : {1, 5, 17}) {
        KCK(kdt_lin_gemm(h, M, N, K, w, CUDA_R_16BF, K, x, CUDA_R_16BF, K, y, CUDA_R_32F, N, 0.f));
        CK(cudaMemcpy(M == 1 ? r1 : rm, y, (size_t)N * 4, cudaMemcpyDeviceToHost));
        if (M > 1) printf(" M=%d %s%s", M, cmp(rm, r1, (size_t)N, buf, sizeof buf), M == 17 ? "\n" : ",");
    }
    free(r1), free(rm);
}

} // namespace

int main() {
    if (!kdt_cuda_available()) {
        fprintf(stderr, "batch_invariance: no CUDA device\n");
        return 1;
    }
    kdt_model_config cfg;
    bench_kimi_config(kLayers, 16, 163840, &cfg);
    kdt_model *m = NULL;
    KCK(kdt_model_random_cuda(&cfg, 7, KDT_BF16, &m));
    const int32_t layers[kLayers] = {0, 1, 2, 3};
    KCK(kdt_model_set_hidden_layers(m, kLayers, layers));
    kdt_cache *c = NULL;
    KCK(kdt_cache_create(m, 1, 256, 0, &c));
    int32_t req = 0, n = kP, prompt[kP];
    for (int i = 0; i < kP; i++) prompt[i] = (int32_t)((i * 104729 + 17) % cfg.vocab_size);
    kdt_batch b;
    memset(&b, 0, sizeof b);
    b.B = 1, b.req = &req, b.n_rows = &n, b.tokens = prompt, b.logits_rows = KDT_LOGITS_LAST;
    float *last = (float *)malloc((size_t)cfg.vocab_size * 4), *hid_dev;
    CK(cudaMalloc(&hid_dev, (size_t)kP * kLayers * cfg.hidden_size * 4));
    KCK(kdt_model_forward(m, c, &b, last, hid_dev, NULL));
    model_rows(m, c, hid_dev, "sm90 verify_attn");
    setenv("KDT_VA_SM90", "0", 1);
    model_rows(m, c, hid_dev, "general verify_attn");
    unsetenv("KDT_VA_SM90");
    kdt_cache_free(c);
    kdt_model_free(m);

    cublasHandle_t h;
    void *ws, *w, *x;
    float *y;
    CK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown);
    CK(cudaMalloc(&ws, 32u << 20));
    CK(cublasSetWorkspace(h, ws, 32u << 20) == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown);
    const struct {
        const char *name;
        int N, K;
    } shapes[] = {{"q_a + kv_a", 2112, 7168}, {"q_b", 12288, 1536}, {"o", 7168, 8192}, {"dense gate_up", 36864, 7168},
                  {"dense down", 7168, 18432}, {"shared gate_up", 4096, 7168}, {"shared down", 7168, 2048}, {"lm_head", 163840, 7168}};
    CK(cudaMalloc(&w, (size_t)163840 * 7168 * 2));
    CK(cudaMalloc(&x, (size_t)kMaxRows * 18432 * 2));
    CK(cudaMalloc(&y, (size_t)kMaxRows * 163840 * 4));
    for (const auto &s : shapes) gemm_rows(h, s.name, s.N, s.K, w, x, y);
    return 0;
}
