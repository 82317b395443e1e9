/* The grouped bf16 expert kernels (src/model/cuda/moe_bf16.cu) against a double reference on the
 * host: random bf16 experts (and a shared expert of the same width), random bf16 rows routed to K
 * distinct experts each, the grouping (counts, offsets, perm) built here. act = silu(x . gate^T) *
 * (x . up^T) within bf16 rounding (4e-3 relative, plus 1e-5 of the largest |act| where sums cancel);
 * ye = act . down^T on the kernel's own act within 1e-4 of the largest |ye| (f32 sums in another
 * order). Cases: 1 to 64 rows (8, 16, 24 and 32 rows a pass), experts without rows, an expert with
 * more rows than one pass holds, Kimi K2's expert sizes. Outputs are NaN-poisoned before each run; two runs must be bit-identical,
 * and so must a row's act and ye run alone (R = 1, its own K experts) and inside the batch.
 * Then the forward's dispatch: a random bf16 model whose experts are "large" (37.7 MB), with the default
 * flags (moe.cu's kernels for decode, the grouped kernels for a 17-row chain with the shared expert folded in, graphs) against
 * the same model with the MoE on cuBLAS per expert (flags without KDT_MODEL_MOE_DEVICE and
 * KDT_MODEL_GRAPHS): logits within 2e-2 relative L2 a row; the 17-row chain run three times (direct,
 * captured, replayed) gives the same bits, and its rows match 17 one-row decode steps of the same tokens
 * within 2e-2 (the bit-identical rows counted). Without a CUDA device it prints a SKIP line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "harness.h"
}
#include "kdt/model.h"
#include "model/internal.h"
#include "model/cuda/moe_bf16.h"

namespace {

typedef __nv_bfloat16 bf16;

uint64_t g_seed = 0x5eed0021ull;
float uniform() { return (float)(kt_splitmix64(&g_seed) >> 40) * (2.f / 16777216.f) - 1.f; } /* [-1, 1) */

bool cuda_ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) kt_fail("moe_bf16: %s: %s", what, cudaGetErrorString(e));
    return e == cudaSuccess;
}

/* n random bf16 values of scale sc, on the host and (when d) copied to the device. */
bf16 *rand_bf16(size_t n, float sc, void **d) {
    bf16 *h = (bf16 *)malloc(n * sizeof(bf16));
    for (size_t i = 0; i < n; i++) h[i] = __float2bfloat16_rn(sc * uniform());
    if (d && !(cuda_ok(cudaMalloc(d, n * 2), "malloc") && cuda_ok(cudaMemcpy(*d, h, n * 2, cudaMemcpyHostToDevice), "copy"))) *d = nullptr;
    return h;
}

/* A layer on the device: experts [E, 2I, hid] and [E, hid, I], the shared expert (or none). */
struct Layer {
    int E, hid, I;
    bf16 *gu, *dn, *sgu, *sdn; /* host */
    void *d_gu, *d_dn, *d_sgu, *d_sdn;
};

/* The grouping of R rows' K experts idx [R K] (kdt_mk_moe_plan's): counts [E], offs [E], perm [R K]. */
struct Plan {
    int *counts, *offs, *perm;
    int32_t *d; /* counts, offs, perm on the device */
};

Plan make_plan(const int *idx, int R, int K, int E) {
    const int n = R * K;
    Plan p = {(int *)calloc(E, sizeof(int)), (int *)malloc(E * sizeof(int)), (int *)malloc(n * sizeof(int)), nullptr};
    for (int i = 0; i < n; i++) p.counts[idx[i]]++;
    for (int e = 0, o = 0; e < E; o += p.counts[e], e++) p.offs[e] = o;
    for (int e = 0, q = 0; e < E; e++)
        for (int i = 0; i < n; i++)
            if (idx[i] == e) p.perm[q++] = i;
    if (!(cuda_ok(cudaMalloc(&p.d, (size_t)(2 * E + n) * 4), "malloc") &&
          cuda_ok(cudaMemcpy(p.d, p.counts, E * 4, cudaMemcpyHostToDevice), "copy") &&
          cuda_ok(cudaMemcpy(p.d + E, p.offs, E * 4, cudaMemcpyHostToDevice), "copy") &&
          cuda_ok(cudaMemcpy(p.d + 2 * E, p.perm, n * 4, cudaMemcpyHostToDevice), "copy")))
        p.d = nullptr;
    return p;
}

void free_plan(Plan &p) {
    free(p.counts), free(p.offs), free(p.perm);
    cudaFree(p.d);
}

/* Runs the kernels on R rows dx under plan p (outputs poisoned first); act [(R (K + 1)) I], ye [(R (K + 1)) hid] to the host. */
bool run(const Layer &L, bool shared, const void *dx, int R, int K, const Plan &p, bf16 *act, float *ye) {
    const size_t places = (size_t)R * (K + 1), act_n = places * L.I, ye_n = places * L.hid;
    void *dact = nullptr;
    float *dye = nullptr;
    bool ok = p.d && cuda_ok(cudaMalloc(&dact, act_n * 2), "malloc") && cuda_ok(cudaMalloc(&dye, ye_n * 4), "malloc") &&
              cuda_ok(cudaMemset(dact, 0xFF, act_n * 2), "poison") && cuda_ok(cudaMemset(dye, 0xFF, ye_n * 4), "poison");
    if (ok) {
        const kdt_status st = kdt_moe_bf16(R, dx, p.d + 2 * L.E, K, p.d, p.d + L.E, L.d_gu, L.d_dn, shared ? L.d_sgu : nullptr,
                                           shared ? L.d_sdn : nullptr, L.E, L.hid, L.I, dact, dye, 0);
        if (st != KDT_OK) kt_fail("moe_bf16: %s", kdt_last_error());
        ok = st == KDT_OK && cuda_ok(cudaDeviceSynchronize(), "run") && cuda_ok(cudaMemcpy(act, dact, act_n * 2, cudaMemcpyDeviceToHost), "copy") &&
             cuda_ok(cudaMemcpy(ye, dye, ye_n * 4, cudaMemcpyDeviceToHost), "copy");
    }
    cudaFree(dact), cudaFree(dye);
    return ok;
}

/* One case: R rows, K of E experts each (row r's first expert is expert 0 for r < hot_rows; experts
 * E - 2 and E - 1 never chosen), the shared expert or not. */
void run_case(int R, int K, int E, int hid, int I, bool shared, int hot_rows) {
    char name[160];
    snprintf(name, sizeof name, "moe_bf16 R %d K %d E %d hid %d I %d%s", R, K, E, hid, I, shared ? " + shared" : "");
    Layer L = {E, hid, I, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
    const float s_in = 1.f / sqrtf((float)hid), s_mid = 1.f / sqrtf((float)I);
    L.gu = rand_bf16((size_t)E * 2 * I * hid, 2 * s_in, &L.d_gu);
    L.dn = rand_bf16((size_t)E * hid * I, 2 * s_mid, &L.d_dn);
    L.sgu = rand_bf16((size_t)2 * I * hid, 2 * s_in, &L.d_sgu);
    L.sdn = rand_bf16((size_t)hid * I, 2 * s_mid, &L.d_sdn);
    void *dx = nullptr;
    bf16 *x = rand_bf16((size_t)R * hid, 2.f, &dx);
    const int n = R * K, Eu = E - 2;
    int *idx = (int *)malloc(n * sizeof(int));
    for (int r = 0; r < R; r++)
        for (int k = 0; k < K; k++) {
            bool dup;
            do {
                idx[r * K + k] = k == 0 && r < hot_rows ? 0 : (int)(kt_splitmix64(&g_seed) % (uint64_t)Eu);
                dup = false;
                for (int j = 0; j < k; j++) dup |= idx[r * K + j] == idx[r * K + k];
            } while (dup);
        }
    Plan p = make_plan(idx, R, K, E);
    int most = 0;
    for (int e = 0; e < E; e++) most = p.counts[e] > most ? p.counts[e] : most;
    const size_t places = (size_t)R * (K + 1), act_n = places * I, ye_n = places * hid, used = (size_t)(shared ? R * (K + 1) : n);
    bf16 *act[2] = {(bf16 *)malloc(act_n * 2), (bf16 *)malloc(act_n * 2)};
    float *ye[2] = {(float *)malloc(ye_n * 4), (float *)malloc(ye_n * 4)};
    bool ok = L.d_gu && L.d_dn && L.d_sgu && L.d_sdn && dx && run(L, shared, dx, R, K, p, act[0], ye[0]) && run(L, shared, dx, R, K, p, act[1], ye[1]);
    if (ok) {
        /* Place q: assignment perm[q] (row perm[q] / K, expert idx[perm[q]]), or the shared expert's row q - R K. */
        size_t bad_act = 0, bad_ye = 0;
        double act_max = 0, ye_max = 0, ye_err = 0, act_err = 0;
        double *aref = (double *)malloc(used * I * sizeof(double)), *yref = (double *)malloc(used * hid * sizeof(double));
        for (size_t q = 0; q < used; q++) {
            const bool sh = q >= (size_t)n;
            const int r = sh ? (int)(q - n) : p.perm[q] / K, e = sh ? 0 : idx[p.perm[q]];
            const bf16 *wgu = sh ? L.sgu : L.gu + (size_t)e * 2 * I * hid, *wdn = sh ? L.sdn : L.dn + (size_t)e * hid * I;
            for (int c = 0; c < I; c++) {
                double a = 0, b = 0;
                for (int k = 0; k < hid; k++) {
                    const double xv = __bfloat162float(x[(size_t)r * hid + k]);
                    a += xv * __bfloat162float(wgu[(size_t)c * hid + k]), b += xv * __bfloat162float(wgu[(size_t)(I + c) * hid + k]);
                }
                aref[q * I + c] = a / (1 + exp(-a)) * b;
                act_max = fmax(act_max, fabs(aref[q * I + c]));
            }
            for (int c = 0; c < hid; c++) {
                double a = 0;
                for (int k = 0; k < I; k++) a += (double)__bfloat162float(act[0][q * I + k]) * __bfloat162float(wdn[(size_t)c * I + k]);
                yref[q * hid + c] = a;
                ye_max = fmax(ye_max, fabs(a));
            }
        }
        for (size_t i = 0; i < used * I; i++) {
            const double err = fabs(__bfloat162float(act[0][i]) - aref[i]);
            act_err = fmax(act_err, err / fmax(fabs(aref[i]), 1e-2 * act_max));
            if (!(err <= 4e-3 * fabs(aref[i]) + 1e-5 * act_max)) bad_act++;
        }
        for (size_t i = 0; i < used * hid; i++) {
            const double err = fabs(ye[0][i] - yref[i]);
            ye_err = fmax(ye_err, err);
            if (!(err <= 1e-4 * ye_max)) bad_ye++;
        }
        const bool same = !memcmp(act[0], act[1], used * I * 2) && !memcmp(ye[0], ye[1], used * hid * 4);
        kt_check(!bad_act && !bad_ye && same,
                 "%s (most rows an expert %d): act %zu of %zu outside 4e-3 (worst rel %.1e), ye %zu of %zu outside 1e-4 of max |ye| "
                 "%.2e (worst %.1e), runs %s",
                 name, most, bad_act, used * I, act_err, bad_ye, used * hid, ye_max, ye_err, same ? "bit-identical" : "DIFFER");
        free(aref), free(yref);

        /* Rows 0, R / 2 and R - 1 alone: the same bits at each of their places. */
        int differ = 0, checked = 0;
        bf16 *act1 = (bf16 *)malloc((size_t)(K + 1) * I * 2);
        float *ye1 = (float *)malloc((size_t)(K + 1) * hid * 4);
        for (int r : {0, R / 2, R - 1}) {
            void *dx1 = (char *)dx + (size_t)r * hid * 2;
            Plan p1 = make_plan(idx + r * K, 1, K, E);
            if (!run(L, shared, dx1, 1, K, p1, act1, ye1)) {
                differ++;
                free_plan(p1);
                continue;
            }
            for (int j = 0; j < K + (shared ? 1 : 0); j++) {
                int qb = n + r, q1 = K; /* the shared expert's places */
                if (j < K)
                    for (int q = 0; q < n; q++) {
                        if (p.perm[q] == r * K + j) qb = q;
                        if (q < K && p1.perm[q] == j) q1 = q;
                    }
                differ += memcmp(act[0] + (size_t)qb * I, act1 + (size_t)q1 * I, (size_t)I * 2) != 0 ||
                          memcmp(ye[0] + (size_t)qb * hid, ye1 + (size_t)q1 * hid, (size_t)hid * 4) != 0;
                checked++;
            }
            free_plan(p1);
        }
        kt_check(!differ, "%s: rows 0, R / 2, R - 1 alone and in the batch: %d of %d places %s", name, differ, checked,
                 differ ? "DIFFER" : "bit-identical");
        free(act1), free(ye1);
    } else kt_fail("%s: setup or run failed", name);
    free_plan(p);
    cudaFree(dx), cudaFree(L.d_gu), cudaFree(L.d_dn), cudaFree(L.d_sgu), cudaFree(L.d_sdn);
    free(x), free(L.gu), free(L.dn), free(L.sgu), free(L.sdn), free(idx);
    free(act[0]), free(act[1]), free(ye[0]), free(ye[1]);
}

/* A model of 2 layers (dense, then MoE: 8 experts of 1024 x 6144 bf16, top 4, a shared one of the same
 * width), Kimi K2's attention dims. Both models route the same (their router's input, layer 0's output, is
 * the same code's), so a near-tie cannot flip one's choice and not the other's. */
const char *kLargeExperts =
    "{\"vocab_size\": 2000, \"hidden_size\": 1024, \"intermediate_size\": 2048, \"moe_intermediate_size\": 6144,"
    "\"num_hidden_layers\": 2, \"num_attention_heads\": 16, \"q_lora_rank\": 384, \"kv_lora_rank\": 512,"
    "\"qk_nope_head_dim\": 128, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128, \"n_routed_experts\": 8,"
    "\"n_shared_experts\": 1, \"num_experts_per_tok\": 4, \"n_group\": 1, \"topk_group\": 1, \"first_k_dense_replace\": 1,"
    "\"norm_topk_prob\": true, \"routed_scaling_factor\": 2.827, \"max_position_embeddings\": 4096, \"rope_theta\": 50000.0}";

/* n rows of tok as a chain after what request 0 holds; logits [n, V] poisoned first. */
kdt_status chain(kdt_model *m, kdt_cache *c, int32_t n, const int32_t *tok, float *logits) {
    int32_t req = 0;
    kdt_batch b;
    memset(&b, 0, sizeof b);
    b.B = 1, b.req = &req, b.n_rows = &n, b.tokens = tok, b.logits_rows = KDT_LOGITS_ALL;
    memset(logits, 0xFF, (size_t)n * kdt_model_get_config(m)->vocab_size * sizeof(float));
    return kdt_model_forward(m, c, &b, logits, NULL, NULL);
}

/* Worst row's relative L2 of got against want, rows x V. */
double worst_row(const float *got, const float *want, int32_t rows, int32_t V) {
    double w = 0;
    for (int32_t r = 0; r < rows; r++) {
        const double e = kt_rel_l2(got + (size_t)r * V, want + (size_t)r * V, (size_t)V);
        w = isnan(e) || e > w ? (isnan(e) ? INFINITY : e) : w;
    }
    return w;
}

void forward_case() {
    kdt_model_config cfg;
    kdt_model *m[2] = {nullptr, nullptr}; /* cuBLAS per expert, default flags */
    kdt_cache *c[2] = {nullptr, nullptr};
    kdt_status st = kdt_model_config_parse(kLargeExperts, strlen(kLargeExperts), "large bf16 experts", &cfg);
    for (int k = 0; k < 2 && st == KDT_OK; k++) {
        st = kdt_model_random_cuda(&cfg, 21, KDT_BF16, &m[k]);
        if (st == KDT_OK && k == 0) st = kdt_model_set_flags(m[0], kdt_model_flags(m[0]) & ~(KDT_MODEL_MOE_DEVICE | KDT_MODEL_GRAPHS));
        if (st == KDT_OK) st = kdt_cache_create(m[k], 1, 128, 0, &c[k]);
    }
    const int32_t V = cfg.vocab_size, P = 40, N = 17; /* P K > 16 E: the prefill on cuBLAS in both */
    int32_t tok[P + 1 + N];
    for (int i = 0; i < P + 1 + N; i++) tok[i] = (int32_t)(kt_splitmix64(&g_seed) % (uint64_t)V);
    float *lg[2] = {(float *)malloc((size_t)P * V * 4), (float *)malloc((size_t)P * V * 4)}, *again = (float *)malloc((size_t)N * V * 4);
    double dec = 0, ver = 0, steps = 0;
    bool same = true;
    int same_rows = 0;
    for (int k = 0; k < 2 && st == KDT_OK; k++) st = chain(m[k], c[k], P, tok, lg[k]);
    for (int k = 0; k < 2 && st == KDT_OK; k++) st = chain(m[k], c[k], 1, tok + P, lg[k]);
    if (st == KDT_OK) dec = worst_row(lg[1], lg[0], 1, V);
    for (int k = 0; k < 2 && st == KDT_OK; k++) st = chain(m[k], c[k], N, tok + P + 1, lg[k]);
    if (st == KDT_OK) ver = worst_row(lg[1], lg[0], N, V);
    for (int run = 0; run < 2 && st == KDT_OK; run++) { /* captured, then replayed: the same bits */
        st = kdt_cache_truncate(c[1], 0, P + 1);
        if (st == KDT_OK) st = chain(m[1], c[1], N, tok + P + 1, again);
        same = same && st == KDT_OK && !memcmp(again, lg[1], (size_t)N * V * 4);
    }
    /* The chain's rows against N one-row decode steps of the same tokens. */
    if (st == KDT_OK) st = kdt_cache_truncate(c[1], 0, P + 1);
    for (int i = 0; i < N && st == KDT_OK; i++) {
        st = chain(m[1], c[1], 1, tok + P + 1 + i, again);
        if (st != KDT_OK) break;
        const double e = worst_row(again, lg[1] + (size_t)i * V, 1, V);
        steps = e > steps ? e : steps;
        same_rows += !memcmp(again, lg[1] + (size_t)i * V, (size_t)V * 4);
    }
    int64_t replays = 0, captures = 0;
    if (m[1]) kdt_model_graph_counts(m[1], &replays, &captures);
    if (st != KDT_OK) kt_fail("moe_bf16 forward (large bf16 experts): %s", kdt_last_error());
    else
        kt_check(dec <= 2e-2 && ver <= 2e-2 && steps <= 2e-2 && same && replays > 0,
                 "moe_bf16 forward (large bf16 experts, grouped kernels vs cuBLAS per expert): decode worst row rel L2 %.1e, "
                 "%d-row chain %.1e; the chain's rows vs %d decode steps %.1e (%d of %d bit-identical) (tol 2e-2); direct, captured, "
                 "replayed %s (%lld replays)",
                 dec, N, ver, N, steps, same_rows, N, same ? "bit-identical" : "DIFFER", (long long)replays);
    for (int k = 0; k < 2; k++) {
        kdt_cache_free(c[k]);
        kdt_model_free(m[k]);
        free(lg[k]);
    }
    free(again);
}

} // namespace

int main() {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        kt_skip("moe_bf16: grouped bf16 expert kernels: no CUDA device");
        return kt_exit_code();
    }
    /* R, K, E, hid, I, shared, rows whose first expert is expert 0 */
    run_case(1, 8, 16, 256, 128, true, 0);
    run_case(3, 4, 12, 512, 96, false, 0);
    run_case(8, 8, 16, 384, 160, true, 8);    /* an expert with all 8 rows */
    run_case(12, 4, 10, 256, 96, true, 12);   /* 16 rows a pass */
    run_case(17, 8, 16, 1024, 256, true, 17); /* a verify tree's rows (24 a pass): 17 rows on expert 0 */
    run_case(30, 3, 12, 192, 64, true, 30);   /* 32 rows a pass */
    run_case(64, 2, 8, 256, 64, false, 40);   /* 40 rows on expert 0: two passes of 32 */
    run_case(64, 6, 40, 320, 96, true, 0);
    run_case(2, 2, 4, 7168, 2048, true, 0);   /* Kimi K2's expert sizes */
    forward_case();
    return kt_exit_code();
}
