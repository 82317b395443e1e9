/* bench_tree_build: tree_build's CUDA kernel against the C heap on the CPU with the copies a
 * serving stack would need to use it, on a table of (B, D, K, N), through the library's own
 * entry point (kdt_tree_build with KDT_BACKEND_CUDA / KDT_BACKEND_CPU).
 *
 *   build/bench/bench_tree_build [--out FILE] [--iters N] [--batches K] [--shape B,D,K,N] [--seed S]
 *
 * --shape: that shape of the table alone (both of its rows, the same inputs), e.g. under a
 * profiler. --seed: another draw of every row's inputs (a row's inputs come from the seed and the
 * row alone). A batch waits for its deepest request, so B >= 64 rows move with the draw.
 *
 * kernel: average over N back-to-back launches between two events, median of K batches
 *   ("stream"); "graph": the same launches in one CUDA graph (no host launch overhead).
 *   Inputs stay L2-resident: the op is latency-bound (docs/perf/tree_build.md), and flushing
 *   L2 between back-to-back launches would time the flush.
 * cpu: device-to-host copy of scores, tokens, root_token, seq_len, kdt_tree_build on the CPU,
 *   host-to-device copy of all ten outputs, synchronized; pinned host buffers; host clock,
 *   median of at least 7 runs (up to 101, about 0.3 s per shape).
 * Before timing, every output of the kernel is compared byte for byte with the CPU's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

#include "bench_common.h"
#include "kdt/ops.h"

static FILE *g_out;
static int g_iters = 200, g_batches = 11;

static uint64_t g_seed = 0x2545F4914F6CDD1Dull, g_rng;
static uint32_t rnd(void) { return (uint32_t)(bench_splitmix64(&g_rng) >> 32); }

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* The ten outputs as (pointer, bytes) pairs, in a fixed order. */
typedef struct out_set {
    void *ptr[10];
    size_t bytes[10];
} out_set;

static out_set outputs_of(const kdt_tree_build_params *p) {
    const size_t b4 = (size_t)p->B * 4, bq4 = b4 * (p->budget + 1), bqq = (size_t)p->B * (p->budget + 1) * (p->budget + 1);
    out_set o = {{p->num_nodes, p->node_token, p->node_parent, p->node_depth, p->node_cand, p->node_score,
                  p->positions, p->tree_mask, p->first_child, p->next_sibling},
                 {b4, bq4, bq4, bq4, bq4, bq4, bq4, bqq, bq4, bq4}};
    return o;
}

/* Allocates every buffer of p (device when dev, else pinned host). */
static void alloc_params(kdt_tree_build_params *p, int dev) {
    const size_t bdk4 = (size_t)p->B * p->D * p->K * 4, b4 = (size_t)p->B * 4;
    void **in[4] = {(void **)&p->scores, (void **)&p->tokens, (void **)&p->root_token, (void **)&p->seq_len};
    const size_t in_bytes[4] = {bdk4, bdk4, b4, b4};
    for (int i = 0; i < 4; i++) {
        if (dev) CK(cudaMalloc(in[i], in_bytes[i]));
        else CK(cudaMallocHost(in[i], in_bytes[i]));
    }
    void **out[10] = {(void **)&p->num_nodes, (void **)&p->node_token, (void **)&p->node_parent,
                      (void **)&p->node_depth, (void **)&p->node_cand, (void **)&p->node_score,
                      (void **)&p->positions, (void **)&p->tree_mask, (void **)&p->first_child,
                      (void **)&p->next_sibling};
    out_set sizes = outputs_of(p);
    for (int i = 0; i < 10; i++) {
        if (dev) CK(cudaMalloc(out[i], sizes.bytes[i]));
        else CK(cudaMallocHost(out[i], sizes.bytes[i]));
    }
}

static void free_params(kdt_tree_build_params *p, int dev) {
    const void *in[4] = {p->scores, p->tokens, p->root_token, p->seq_len};
    out_set o = outputs_of(p);
    for (int i = 0; i < 14; i++) {
        void *ptr = i < 4 ? (void *)in[i] : o.ptr[i - 4];
        if (dev) CK(cudaFree(ptr));
        else CK(cudaFreeHost(ptr));
    }
}

/* Top-K log-probabilities, sorted within each (b, d): the k-th is the previous minus an
 * exponential gap, like the head of a softmax. positive != 0 adds 2 to each request's first row,
 * which sends every request down the kernel's sequential path (a score above 0). */
static void fill_inputs(const kdt_tree_build_params *h, int positive) {
    float *sc = (float *)h->scores;
    int32_t *tok = (int32_t *)h->tokens, *root = (int32_t *)h->root_token, *seq = (int32_t *)h->seq_len;
    for (int r = 0; r < h->B * h->D; r++) {
        float v = -0.05f * (float)(rnd() % 64);
        for (int k = 0; k < h->K; k++) {
            sc[(size_t)r * h->K + k] = v + (positive && r % h->D == 0 ? 2.0f : 0.0f);
            v -= 0.02f + (float)(rnd() % 1000) / 400.0f;
        }
    }
    for (size_t i = 0; i < (size_t)h->B * h->D * h->K; i++) tok[i] = (int32_t)(rnd() % 163840);
    for (int b = 0; b < h->B; b++) {
        root[b] = (int32_t)(rnd() % 163840);
        seq[b] = (int32_t)(rnd() % 100000);
    }
}

static void launch_tree_build(void *ctx, cudaStream_t s) {
    KCK(kdt_tree_build((const kdt_tree_build_params *)ctx, KDT_BACKEND_CUDA, s));
}

__global__ void empty_kernel(void) {}

static void launch_empty(void *ctx, cudaStream_t s) {
    (void)ctx;
    empty_kernel<<<1, 32, 0, s>>>();
    CK(cudaPeekAtLastError());
}

/* One CPU-path run: inputs device -> host, the C heap, outputs host -> device. Seconds. */
static double cpu_path_once(const kdt_tree_build_params *d, const kdt_tree_build_params *h, cudaStream_t s) {
    const size_t bdk4 = (size_t)d->B * d->D * d->K * 4, b4 = (size_t)d->B * 4;
    out_set od = outputs_of(d), oh = outputs_of(h);
    double t0 = now_s();
    CK(cudaMemcpyAsync((void *)h->scores, d->scores, bdk4, cudaMemcpyDeviceToHost, s));
    CK(cudaMemcpyAsync((void *)h->tokens, d->tokens, bdk4, cudaMemcpyDeviceToHost, s));
    CK(cudaMemcpyAsync((void *)h->root_token, d->root_token, b4, cudaMemcpyDeviceToHost, s));
    CK(cudaMemcpyAsync((void *)h->seq_len, d->seq_len, b4, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    KCK(kdt_tree_build(h, KDT_BACKEND_CPU, NULL));
    for (int i = 0; i < 10; i++) CK(cudaMemcpyAsync(od.ptr[i], oh.ptr[i], od.bytes[i], cudaMemcpyHostToDevice, s));
    CK(cudaStreamSynchronize(s));
    return now_s() - t0;
}

static double time_cpu_path(const kdt_tree_build_params *d, const kdt_tree_build_params *h, cudaStream_t s) {
    double t[101];
    int n = 0;
    const double start = now_s();
    cpu_path_once(d, h, s); /* warm-up */
    while (n < 101 && (n < 7 || now_s() - start < 0.3)) t[n++] = cpu_path_once(d, h, s);
    qsort(t, n, sizeof t[0], cmp_double);
    return t[n / 2] * 1e6;
}

/* Kernel outputs (device d) equal the CPU's (host h)? Names the first differing output. */
static const char *compare_outputs(const kdt_tree_build_params *d, const kdt_tree_build_params *h) {
    static const char *const names[10] = {"num_nodes", "node_token", "node_parent", "node_depth", "node_cand",
                                          "node_score", "positions", "tree_mask", "first_child", "next_sibling"};
    out_set od = outputs_of(d), oh = outputs_of(h);
    for (int i = 0; i < 10; i++) {
        void *tmp = malloc(od.bytes[i]);
        CK(cudaMemcpy(tmp, od.ptr[i], od.bytes[i], cudaMemcpyDeviceToHost));
        int same = memcmp(tmp, oh.ptr[i], od.bytes[i]) == 0;
        free(tmp);
        if (!same) return names[i];
    }
    return NULL;
}

extern "C" int kdt_tree_build_cuda_path(int D, int K, int N); /* src/cuda/tree_build.cu */

/* Requests the kernel runs on a parallel path (sorted rows, no score above 0, a shape that has one). */
static int parallel_requests(const kdt_tree_build_params *h) {
    if (!kdt_tree_build_cuda_path(h->D, h->K, h->budget)) return 0;
    int n = 0;
    for (int b = 0; b < h->B; b++) {
        int pos = 0;
        for (size_t i = 0; i < (size_t)h->D * h->K; i++) pos |= h->scores[(size_t)b * h->D * h->K + i] > 0.0f;
        n += !pos;
    }
    return n;
}

static const int shapes[][4] = { /* B, D, K, N */
    {1, 7, 4, 12},     {64, 8, 8, 64},     {64, 16, 8, 128},  {256, 8, 16, 64},
    {256, 16, 8, 256}, {64, 16, 8, 256},   {16, 16, 16, 1024}, {1, 16, 8, 128},
};

int main(int argc, char **argv) {
    const char *out_path = NULL;
    int only[4] = {0, 0, 0, 0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out_path = argv[++i];
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc) {
            if (sscanf(argv[++i], "%d,%d,%d,%d", &only[0], &only[1], &only[2], &only[3]) != 4) {
                fprintf(stderr, "bench_tree_build: --shape wants B,D,K,N\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) g_seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) g_iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batches") && i + 1 < argc) g_batches = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_tree_build [--out FILE] [--iters N] [--batches K (1..64)] [--shape B,D,K,N] [--seed S]\n");
            return 2;
        }
    }
    if (g_iters < 1 || g_batches < 1 || g_batches > BENCH_MAX_BATCHES) {
        fprintf(stderr, "bench_tree_build: --iters must be >= 1 and --batches 1 .. 64\n");
        return 2;
    }
    if (bench_open("bench_tree_build", out_path, &g_out)) return 1;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    bench_report_header(g_out, "bench_tree_build", &prop, argc, argv);
    bench_emit(g_out, "- kernel: average of %d back-to-back launches between two events, median of %d batches (\"graph\": "
         "the same launches in one CUDA graph); cpu: D2H inputs + C heap (kdt_tree_build, KDT_BACKEND_CPU) + "
         "H2D of all outputs, pinned memory, host clock, median; microseconds\n- floor: bytes read and "
         "written / 4.1 TB/s\n- inputs: seed %llu (--seed)\n\n",
         g_iters, g_batches, (unsigned long long)g_seed);
    bench_emit(g_out, "| kernel | stream us | graph us |\n|---|---|---|\n| empty | %.2f | %.2f |\n\n",
         bench_time_launches(launch_empty, NULL, s, 0, g_iters, g_batches), bench_time_launches(launch_empty, NULL, s, 1, g_iters, g_batches));
    bench_emit(g_out, "path: requests on a parallel path of the kernel (threshold or merge; log-probabilities) / on its sequential path (rows "
         "with a positive score, second half of the table)\n\n");
    bench_emit(g_out, "| B | D | K | N | path par/seq | nodes/req | kernel us | graph us | floor us | cpu+copies us | cpu / kernel | check |\n"
         "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    int failures = 0;
    const size_t n_shapes = sizeof shapes / sizeof shapes[0];
    for (size_t c = 0; c < 2 * n_shapes; c++) {
        const int *sh = shapes[c % n_shapes], positive = c >= n_shapes;
        if (only[0] && memcmp(sh, only, sizeof only)) continue;
        kdt_tree_build_params d;
        memset(&d, 0, sizeof d);
        d.B = sh[0];
        d.D = sh[1];
        d.K = sh[2];
        d.budget = sh[3];
        kdt_tree_build_params h = d;
        alloc_params(&d, 1);
        alloc_params(&h, 0);
        g_rng = g_seed ^ 0x9E3779B97F4A7C15ull * (c + 1);
        fill_inputs(&h, positive);
        const int nm = parallel_requests(&h);
        const size_t bdk4 = (size_t)d.B * d.D * d.K * 4, b4 = (size_t)d.B * 4;
        CK(cudaMemcpy((void *)d.scores, h.scores, bdk4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy((void *)d.tokens, h.tokens, bdk4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy((void *)d.root_token, h.root_token, b4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy((void *)d.seq_len, h.seq_len, b4, cudaMemcpyHostToDevice));
        out_set od = outputs_of(&d);
        for (int i = 0; i < 10; i++) CK(cudaMemset(od.ptr[i], 0xFF, od.bytes[i])); /* poison */
        launch_tree_build(&d, s);
        CK(cudaStreamSynchronize(s));
        KCK(kdt_tree_build(&h, KDT_BACKEND_CPU, NULL));
        const char *diff = compare_outputs(&d, &h);
        failures += diff != NULL;
        double nodes = 0, bytes = 2.0 * bdk4 + 2.0 * b4 + 4;
        for (int b = 0; b < d.B; b++) nodes += h.num_nodes[b];
        for (int i = 0; i < 10; i++) bytes += od.bytes[i];
        const float tk = bench_time_launches(launch_tree_build, &d, s, 0, g_iters, g_batches),
                    tg = bench_time_launches(launch_tree_build, &d, s, 1, g_iters, g_batches);
        const double tc = time_cpu_path(&d, &h, s);
        bench_emit(g_out, "| %d | %d | %d | %d | %d/%d | %.1f | %.2f | %.2f | %.3f | %.1f | %.1fx | %s%s |\n", d.B, d.D, d.K,
             d.budget, nm, d.B - nm, nodes / d.B, tk, tg, bytes / 4.1e12 * 1e6, tc, tc / tk, diff ? "MISMATCH " : "ok", diff ? diff : "");
        free_params(&d, 1);
        free_params(&h, 0);
    }
    bench_emit(g_out, "\n%s\n", failures ? "RESULT: MISMATCH against the CPU backend" : "RESULT: all outputs equal the CPU backend");
    if (g_out) fclose(g_out);
    CK(cudaStreamDestroy(s));
    return failures ? 1 : 0;
}
