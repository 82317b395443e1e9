/* bench_sample_accept: kernel time of tree_sample_accept (docs/interfaces.md 2.4) at Kimi K2's vocabulary,
 * beside a plain device copy of the same logits timed in the same run.
 *
 *   build/bench/bench_sample_accept [--out FILE] [--iters N]
 *
 * Inputs: B requests, N = 64 draft nodes (Q = 65), V = 163840; random trees (a node's parent is
 * the previous node with probability 0.6, else uniform below), logits uniform in [-3, 3] with
 * each node's children's tokens raised by 14 in the parent's row (mean accept lengths ~3 to 5).
 * A time is the median over --iters launches, each timed by CUDA events after a 256 MB memset
 * that flushes L2 (the rows a launch reads would otherwise stay in L2 from the last one).
 * The floor is the bytes of the rows the walk needs (sum of accept_len + 1 over the requests,
 * times V * 4) at the copy's read bandwidth; "read once" is the whole logits tensor at that
 * bandwidth (half the copy's time: a copy reads and writes). Configurations with top-k or top-p
 * or draft_probs are timed a second time with the previous kernel (radix selects over every row, the
 * draft row in a pass of its own: kdt_tree_sample_accept_cuda_radix), whose outputs must be the same. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "bench_common.h"
#include "kdt/ops.h"
#include "ops/backends.h" /* kdt_tree_sample_accept_cuda_radix: the filters' previous path, for before / after */

static FILE *g_out;
static int g_iters = 20;

__global__ void fill_uniform(float *x, size_t n, uint64_t key, float lo, float hi) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = lo + (hi - lo) * (float)(bench_mix64(key ^ (i * 0x9E3779B97F4A7C15ull)) >> 40) * 0x1p-24f;
}

__global__ void add_at(float *x, const int64_t *at, int n, float v) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[at[i]] += v;
}

typedef struct timer {
    cudaEvent_t e0, e1;
    void *flush;
} timer;

static const size_t kFlush = 256u << 20;

static float median(float *t, int n) {
    qsort(t, (size_t)n, sizeof *t, bench_cmp_float);
    return t[n / 2];
}

/* Median time in microseconds of `iters` runs of launch(), each after an L2 flush. */
template <class Launch> static float time_median(timer *tm, Launch launch) {
    float *t = (float *)malloc(sizeof(float) * g_iters);
    for (int i = 0; i < g_iters; i++) {
        CK(cudaMemsetAsync(tm->flush, i & 0xFF, kFlush, 0));
        CK(cudaEventRecord(tm->e0, 0));
        launch();
        CK(cudaEventRecord(tm->e1, 0));
        CK(cudaEventSynchronize(tm->e1));
        CK(cudaEventElapsedTime(&t[i], tm->e0, tm->e1));
    }
    const float m = median(t, g_iters) * 1e3f;
    free(t);
    return m;
}

static float time_op(timer *tm, const kdt_tree_sample_accept_params *p, int radix) {
    if (radix) return time_median(tm, [&] { KCK(kdt_tree_sample_accept_cuda_radix(p, NULL)); });
    return time_median(tm, [&] { KCK(kdt_tree_sample_accept(p, KDT_BACKEND_CUDA, NULL)); });
}

static float time_copy(timer *tm, void *dst, const void *src, size_t n) {
    return time_median(tm, [&] { CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, 0)); });
}

static void run_shape(timer *tm, int B, int N, int V, uint64_t *rng) {
    const int Q = N + 1;
    const size_t bq = (size_t)B * Q, bqv = bq * V;
    int32_t *tok = (int32_t *)malloc(bq * 4), *par = (int32_t *)malloc(bq * 4), *num = (int32_t *)malloc(B * 4);
    int64_t *at = (int64_t *)malloc(bq * 8);
    int n_at = 0;
    for (int b = 0; b < B; b++) {
        num[b] = N;
        for (int c = 0; c < Q; c++) {
            tok[(size_t)b * Q + c] = (int32_t)(bench_splitmix64(rng) % (uint64_t)V);
            par[(size_t)b * Q + c] = c == 0 ? -1 : (bench_splitmix64(rng) % 10 < 6) ? c - 1 : (int32_t)(bench_splitmix64(rng) % (uint64_t)c);
            if (c) at[n_at++] = ((int64_t)b * Q + par[(size_t)b * Q + c]) * V + tok[(size_t)b * Q + c];
        }
    }
    float *lg, *q, *copy, *temp;
    int32_t *d_tok, *d_par, *d_num, *topk, *out;
    float *topp;
    uint64_t *seed;
    int64_t *d_at;
    CK(cudaMalloc(&lg, bqv * 4));
    CK(cudaMalloc(&q, bqv * 4));
    CK(cudaMalloc(&copy, bqv * 4));
    CK(cudaMalloc(&d_tok, bq * 4));
    CK(cudaMalloc(&d_par, bq * 4));
    CK(cudaMalloc(&d_num, B * 4));
    CK(cudaMalloc(&d_at, bq * 8));
    CK(cudaMalloc(&temp, B * 4));
    CK(cudaMalloc(&topk, B * 4));
    CK(cudaMalloc(&topp, B * 4));
    CK(cudaMalloc(&seed, B * 8));
    CK(cudaMalloc(&out, (2 * bq + 2 * B) * 4));
    CK(cudaMemcpy(d_tok, tok, bq * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_par, par, bq * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_num, num, B * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_at, at, (size_t)n_at * 8, cudaMemcpyHostToDevice));
    fill_uniform<<<1024, 256>>>(lg, bqv, bench_splitmix64(rng), -3.0f, 3.0f);
    add_at<<<(n_at + 255) / 256, 256>>>(lg, d_at, n_at, 14.0f);
    fill_uniform<<<1024, 256>>>(q, bqv, bench_splitmix64(rng), 0.5f / V, 1.5f / V);
    CK(cudaGetLastError());
    uint64_t *h_seed = (uint64_t *)malloc(B * 8);
    for (int b = 0; b < B; b++) h_seed[b] = bench_splitmix64(rng);
    CK(cudaMemcpy(seed, h_seed, B * 8, cudaMemcpyHostToDevice));

    const float copy_us = time_copy(tm, copy, lg, bqv * 4);
    const double read_bw = 2.0 * bqv * 4 / (copy_us * 1e-6); /* bytes/s a copy reads (and writes) */
    const double read_once_us = bqv * 4 / read_bw * 1e6;
    bench_emit(g_out, "\n### B=%d N=%d V=%d: logits %.1f MB; device copy %.1f us (%.0f GB/s each way), read once %.1f us\n\n",
               B, N, V, bqv * 4 / 1e6, copy_us, read_bw / 1e9, read_once_us);
    bench_emit(g_out, "| config | time us | mean accept_len | rows read once MB | floor us | x floor | x read once | previous kernel us | x read once | same outputs |\n");
    bench_emit(g_out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    static const struct { const char *name; float T, P; int K, draft; } cfg[] = {
        {"T=1", 1.0f, 1.0f, 0, 0},          {"T=1 top_k=50", 1.0f, 1.0f, 50, 0}, {"T=1 top_p=0.9", 1.0f, 0.9f, 0, 0},
        {"T=0.6 top_k=50 top_p=0.9", 0.6f, 0.9f, 50, 0}, {"T=1 sampled (draft_probs)", 1.0f, 1.0f, 0, 1},
        {"T=0 greedy", 0.0f, 1.0f, 0, 0},
    };
    float *h_f = (float *)malloc(B * 4);
    int32_t *h_i = (int32_t *)malloc(B * 4), *h_len = (int32_t *)malloc(B * 4);
    int32_t *h_out = (int32_t *)malloc((2 * bq + 2 * B) * 4), *h_out2 = (int32_t *)malloc((2 * bq + 2 * B) * 4);
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        for (int b = 0; b < B; b++) h_f[b] = cfg[c].T, h_i[b] = cfg[c].K;
        CK(cudaMemcpy(temp, h_f, B * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(topk, h_i, B * 4, cudaMemcpyHostToDevice));
        for (int b = 0; b < B; b++) h_f[b] = cfg[c].P;
        CK(cudaMemcpy(topp, h_f, B * 4, cudaMemcpyHostToDevice));
        kdt_tree_sample_accept_params p = {B, Q, V, d_tok, d_par, d_num, lg, cfg[c].draft ? q : NULL, temp, topk, topp, seed,
                                           out, out + B, out + B + bq, out + B + 2 * bq};
        const float us = time_op(tm, &p, 0);
        CK(cudaMemcpy(h_len, out, B * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(h_out, out, (2 * bq + 2 * B) * 4, cudaMemcpyDeviceToHost));
        double rows = 0;
        for (int b = 0; b < B; b++) rows += h_len[b] + 1;
        const double bytes = rows * V * 4, floor_us = bytes / read_bw * 1e6;
        bench_emit(g_out, "| %s | %.1f | %.2f | %.1f | %.1f | %.2f | %.2f |", cfg[c].name, us, rows / B - 1, bytes / 1e6,
                   floor_us, us / floor_us, us / read_once_us);
        if (cfg[c].K > 0 || cfg[c].P < 1.0f || cfg[c].draft) { /* before / after: the previous kernel */
            const float ur = time_op(tm, &p, 1);
            CK(cudaMemcpy(h_out2, out, (2 * bq + 2 * B) * 4, cudaMemcpyDeviceToHost));
            const int same = !memcmp(h_out, h_out2, (2 * bq + 2 * B) * 4);
            bench_emit(g_out, " %.1f | %.2f | %s |\n", ur, ur / read_once_us, same ? "yes" : "NO");
        } else {
            bench_emit(g_out, " - | - | - |\n");
        }
    }
    free(h_f), free(h_i), free(h_len), free(h_out), free(h_out2), free(h_seed), free(tok), free(par), free(num), free(at);
    cudaFree(lg), cudaFree(q), cudaFree(copy), cudaFree(d_tok), cudaFree(d_par), cudaFree(d_num), cudaFree(d_at);
    cudaFree(temp), cudaFree(topk), cudaFree(topp), cudaFree(seed), cudaFree(out);
}

int main(int argc, char **argv) {
    const char *out_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out_path = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) g_iters = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--out FILE] [--iters N]\n", argv[0]);
            return 2;
        }
    }
    if (g_iters < 1) g_iters = 1;
    if (bench_open("bench_sample_accept", out_path, &g_out)) return 1;
    timer tm;
    CK(cudaEventCreate(&tm.e0));
    CK(cudaEventCreate(&tm.e1));
    CK(cudaMalloc(&tm.flush, kFlush));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    bench_emit(g_out, "## tree_sample_accept on %s (%d SMs), median of %d launches, L2 flushed before each\n", prop.name,
               prop.multiProcessorCount, g_iters);
    uint64_t rng = 0x5A3F1ull;
    run_shape(&tm, 64, 64, 163840, &rng);
    run_shape(&tm, 8, 64, 163840, &rng);
    run_shape(&tm, 1, 64, 163840, &rng);
    cudaFree(tm.flush);
    if (g_out) fclose(g_out);
    return 0;
}
