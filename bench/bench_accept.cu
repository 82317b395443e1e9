/* bench_accept: kernel time of tree_accept (every variant of src/cuda/tree_accept.h) and
 * kv_commit (bf16, Dqk = 576, BS = 64) for B in {1, 8, 64, 256} x N in {16, 64, 256, 1024},
 * plus an empty kernel, through the library's own launchers.
 *
 *   build/bench/bench_accept [--out FILE] [--iters N] [--batches K]
 *
 * A time is the average over N back-to-back launches between two events, the median of K such
 * batches ("stream"), and the same launches captured in one CUDA graph ("graph": device time
 * with the host's launch overhead removed). Inputs stay L2-resident across the launches: these
 * kernels are latency-bound and read a few KB (see docs/perf/tree_accept.md), so flushing L2
 * between back-to-back launches would measure the flush. Before timing, every variant's
 * outputs are checked against the CPU backend on the same inputs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "bench_common.h"
#include "cuda/tree_accept.h"
#include "kdt/ops.h"

static FILE *g_out;
static int g_iters = 200, g_batches = 7;

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) { return (uint32_t)(bench_splitmix64(&g_rng) >> 32); }

/* bench_time_launches with --iters and --batches. */
static float time_launches(bench_launch_fn fn, void *ctx, cudaStream_t s, int graph) {
    return bench_time_launches(fn, ctx, s, graph, g_iters, g_batches);
}

__global__ void empty_kernel(void) {}

static void launch_empty(void *ctx, cudaStream_t s) {
    (void)ctx;
    empty_kernel<<<1, 32, 0, s>>>();
}

/* ---- tree_accept ---- */
typedef struct accept_ctx {
    kdt_tree_accept_params p; /* device pointers */
    int variant;
} accept_ctx;

static void launch_accept(void *ctx, cudaStream_t s) {
    accept_ctx *c = (accept_ctx *)ctx;
    KCK(kdt_tree_accept_cuda_variant(&c->p, s, c->variant));
}

/* Random trees (half the parents the previous node, half uniform below) and targets that
 * follow a random child with probability 0.8: mean accept lengths of 2 to 4. */
static void make_trees(int B, int Q, int32_t *tok, int32_t *par, int32_t *num, int32_t *pred, int32_t *pick) {
    for (int b = 0; b < B; b++) {
        int32_t *t = tok + (size_t)b * Q, *p = par + (size_t)b * Q, *y = pred + (size_t)b * Q;
        int32_t *k = pick + (size_t)b * Q; /* pick: a random child (reservoir), then its count */
        num[b] = Q - 1;
        for (int c = 0; c < Q; c++) {
            t[c] = (int32_t)(rnd() % 32000);
            p[c] = c == 0 ? -1 : rnd() % 2 ? c - 1 : (int32_t)(rnd() % (uint32_t)c);
            k[c] = -1;
            y[c] = 0;
        }
        for (int c = 1; c < Q; c++) /* y[] counts children while picking */
            if (rnd() % (uint32_t)++y[p[c]] == 0) k[p[c]] = c;
        for (int c = 0; c < Q; c++) y[c] = k[c] >= 0 && rnd() % 10 < 8 ? t[k[c]] : 32000 + (int32_t)(rnd() % 1000);
    }
}

/* ---- kv_commit ---- */
typedef struct commit_ctx {
    kdt_kv_commit_params p; /* device pointers */
} commit_ctx;

static void launch_commit(void *ctx, cudaStream_t s) {
    commit_ctx *c = (commit_ctx *)ctx;
    KCK(kdt_kv_commit(&c->p, KDT_BACKEND_CUDA, s));
}

/* Device copy of h[n bytes], or uninitialized device space when h is NULL. */
static void *dev_copy(const void *h, size_t n) {
    void *d;
    CK(cudaMalloc(&d, n ? n : 1));
    if (h && n) CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}

static int same_dev(const void *d, const void *h, size_t n) {
    void *tmp = malloc(n ? n : 1);
    CK(cudaMemcpy(tmp, d, n, cudaMemcpyDeviceToHost));
    int ok = memcmp(tmp, h, n) == 0;
    free(tmp);
    return ok;
}

static const int kBs[] = {1, 8, 64, 256}, kNs[] = {16, 64, 256, 1024};
#define NB_ (sizeof kBs / sizeof kBs[0])
#define NN_ (sizeof kNs / sizeof kNs[0])

int main(int argc, char **argv) {
    const char *out_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out_path = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) g_iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batches") && i + 1 < argc) g_batches = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_accept [--out FILE] [--iters N] [--batches K (1..64)]\n");
            return 2;
        }
    }
    if (g_iters < 1 || g_batches < 1 || g_batches > BENCH_MAX_BATCHES) {
        fprintf(stderr, "bench_accept: --iters must be >= 1 and --batches 1 .. 64\n");
        return 2;
    }
    if (bench_open("bench_accept", out_path, &g_out)) return 1;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int failures = 0;

    bench_report_header(g_out, "bench_accept", &prop, argc, argv);
    bench_emit(g_out,
               "- time: average of %d back-to-back launches between two events, median of %d batches, microseconds; "
               "\"graph\": the same launches in one CUDA graph (no host launch overhead)\n\n",
               g_iters, g_batches);
    float empty_stream = time_launches(launch_empty, NULL, s, 0), empty_graph = time_launches(launch_empty, NULL, s, 1);
    bench_emit(g_out, "| kernel | stream us | graph us |\n|---|---|---|\n| empty | %.2f | %.2f |\n\n", empty_stream,
               empty_graph);

    /* Accepted paths of each (B, N), fed to kv_commit below. */
    int32_t *paths[NB_][NN_], *lens[NB_][NN_];
    bench_emit(g_out, "## tree_accept (random trees, num_nodes = N)\n\n| B | N | mean accept |");
    for (int v = 0; v < KDT_TREE_ACCEPT_N_VARIANTS; v++) bench_emit(g_out, " %s |", kdt_tree_accept_variant_name(v));
    bench_emit(g_out, " warp graph | check |\n|---|---|---|");
    for (int v = 0; v < KDT_TREE_ACCEPT_N_VARIANTS + 2; v++) bench_emit(g_out, "---|");
    bench_emit(g_out, "\n");
    for (size_t bi = 0; bi < NB_; bi++) {
        for (size_t ni = 0; ni < NN_; ni++) {
            const int B = kBs[bi], Q = kNs[ni] + 1;
            const size_t bq = (size_t)B * Q;
            int32_t *tok = (int32_t *)malloc(bq * 4), *par = (int32_t *)malloc(bq * 4), *pred = (int32_t *)malloc(bq * 4);
            int32_t *pick = (int32_t *)malloc(bq * 4), *num = (int32_t *)malloc((size_t)B * 4);
            int32_t *len = (int32_t *)malloc((size_t)B * 4), *idx = (int32_t *)malloc(bq * 4);
            int32_t *otok = (int32_t *)malloc(bq * 4), *st = (int32_t *)malloc((size_t)B * 4);
            make_trees(B, Q, tok, par, num, pred, pick);
            kdt_tree_accept_params h = {B, Q, tok, par, num, pred, len, idx, otok, st};
            KCK(kdt_tree_accept(&h, KDT_BACKEND_CPU, NULL));
            double mean = 0;
            for (int b = 0; b < B; b++) mean += len[b];
            mean /= B;
            accept_ctx c;
            c.p = kdt_tree_accept_params{B, Q, (const int32_t *)dev_copy(tok, bq * 4), (const int32_t *)dev_copy(par, bq * 4),
                                           (const int32_t *)dev_copy(num, (size_t)B * 4), (const int32_t *)dev_copy(pred, bq * 4),
                                           (int32_t *)dev_copy(NULL, (size_t)B * 4), (int32_t *)dev_copy(NULL, bq * 4),
                                           (int32_t *)dev_copy(NULL, bq * 4), (int32_t *)dev_copy(NULL, (size_t)B * 4)};
            bench_emit(g_out, "| %d | %d | %.2f |", B, Q - 1, mean);
            int ok = 1;
            for (int v = 0; v < KDT_TREE_ACCEPT_N_VARIANTS; v++) {
                c.variant = v;
                CK(cudaMemsetAsync(c.p.accept_len, 0xFF, (size_t)B * 4, s)); /* poison every output */
                CK(cudaMemsetAsync(c.p.accept_index, 0xFF, bq * 4, s));
                CK(cudaMemsetAsync(c.p.accept_tokens, 0xFF, bq * 4, s));
                CK(cudaMemsetAsync(c.p.status, 0xFF, (size_t)B * 4, s));
                launch_accept(&c, s);
                CK(cudaStreamSynchronize(s));
                int v_ok = same_dev(c.p.accept_len, len, (size_t)B * 4) && same_dev(c.p.accept_index, idx, bq * 4) &&
                           same_dev(c.p.accept_tokens, otok, bq * 4) && same_dev(c.p.status, st, (size_t)B * 4);
                if (!v_ok) fprintf(stderr, "bench_accept: tree_accept %s differs from cpu at B=%d N=%d\n",
                                   kdt_tree_accept_variant_name(v), B, Q - 1);
                ok &= v_ok;
                bench_emit(g_out, " %.2f |", time_launches(launch_accept, &c, s, 0));
            }
            c.variant = KDT_TREE_ACCEPT_WARP;
            bench_emit(g_out, " %.2f | %s |\n", time_launches(launch_accept, &c, s, 1), ok ? "ok" : "MISMATCH");
            failures += !ok;
            cudaFree((void *)c.p.node_token); cudaFree((void *)c.p.node_parent); cudaFree((void *)c.p.num_nodes);
            cudaFree((void *)c.p.target_pred); cudaFree(c.p.accept_len); cudaFree(c.p.accept_index);
            cudaFree(c.p.accept_tokens); cudaFree(c.p.status);
            paths[bi][ni] = idx;
            lens[bi][ni] = len;
            free(tok); free(par); free(pred); free(pick); free(num); free(otok); free(st);
        }
    }

    const int BS = 64, D = 576;
    const double bw = 4.8e12; /* H200 HBM3e bytes/s */
    bench_emit(g_out, "\n## kv_commit (bf16, Dqk = %d, BS = %d; paths from the tree_accept runs above)\n\n"
               "| B | N | mean accept | rows moved | stream us | graph us | bytes moved | HBM floor us | check |\n"
               "|---|---|---|---|---|---|---|---|---|\n",
               D, BS);
    for (size_t bi = 0; bi < NB_; bi++) {
        for (size_t ni = 0; ni < NN_; ni++) {
            const int B = kBs[bi], Q = kNs[ni] + 1;
            const int MB = (BS - 1 + Q + BS - 1) / BS; /* prefix up to BS - 1 tokens, then the tree */
            const int NB = B * MB;
            const size_t cache_elems = (size_t)NB * BS * D;
            int32_t *table = (int32_t *)malloc((size_t)NB * 4), *kv_len = (int32_t *)malloc((size_t)B * 4);
            int32_t *new_len = (int32_t *)malloc((size_t)B * 4), *st = (int32_t *)malloc((size_t)B * 4);
            uint16_t *cache = (uint16_t *)malloc(cache_elems * 2);
            for (int i = 0; i < NB; i++) table[i] = i;
            for (int i = NB - 1; i > 0; i--) { /* shuffled blocks */
                int j = (int)(rnd() % (uint32_t)(i + 1)), t = table[i];
                table[i] = table[j];
                table[j] = t;
            }
            for (size_t i = 0; i < cache_elems; i++) cache[i] = (uint16_t)(0x3C00 + (rnd() & 0x3FF)); /* finite bf16 */
            long long moved = 0;
            double mean = 0;
            for (int b = 0; b < B; b++) {
                kv_len[b] = (int32_t)(rnd() % BS) + Q;
                mean += lens[bi][ni][b];
                for (int t = 1; t <= lens[bi][ni][b]; t++) moved += paths[bi][ni][(size_t)b * Q + t] != t;
            }
            mean /= B;
            commit_ctx c;
            c.p = kdt_kv_commit_params{B, Q, NB, BS, D, KDT_BF16, dev_copy(cache, cache_elems * 2),
                                         (const int32_t *)dev_copy(table, (size_t)NB * 4), MB,
                                         (const int32_t *)dev_copy(kv_len, (size_t)B * 4),
                                         (const int32_t *)dev_copy(paths[bi][ni], (size_t)B * Q * 4),
                                         (const int32_t *)dev_copy(lens[bi][ni], (size_t)B * 4),
                                         (int32_t *)dev_copy(NULL, (size_t)B * 4), (int32_t *)dev_copy(NULL, (size_t)B * 4)};
            kdt_kv_commit_params h = c.p;
            h.kv_cache = cache;
            h.block_table = table;
            h.kv_len = kv_len;
            h.accept_index = paths[bi][ni];
            h.accept_len = lens[bi][ni];
            h.new_kv_len = new_len;
            h.status = st;
            CK(cudaMemsetAsync(c.p.new_kv_len, 0xFF, (size_t)B * 4, s));
            CK(cudaMemsetAsync(c.p.status, 0xFF, (size_t)B * 4, s));
            launch_commit(&c, s); /* once from the initial state, then compare with the CPU */
            CK(cudaStreamSynchronize(s));
            KCK(kdt_kv_commit(&h, KDT_BACKEND_CPU, NULL));
            int ok = same_dev(c.p.kv_cache, cache, cache_elems * 2) && same_dev(c.p.new_kv_len, new_len, (size_t)B * 4) &&
                     same_dev(c.p.status, st, (size_t)B * 4);
            failures += !ok;
            const double bytes = 2.0 * moved * D * 2;
            float ts = time_launches(launch_commit, &c, s, 0), tg = time_launches(launch_commit, &c, s, 1);
            bench_emit(g_out, "| %d | %d | %.2f | %lld | %.2f | %.2f | %.0f | %.3f | %s |\n", B, Q - 1, mean, moved, ts,
                       tg, bytes, bytes / bw * 1e6, ok ? "ok" : "MISMATCH");
            cudaFree(c.p.kv_cache); cudaFree((void *)c.p.block_table); cudaFree((void *)c.p.kv_len);
            cudaFree((void *)c.p.accept_index); cudaFree((void *)c.p.accept_len); cudaFree(c.p.new_kv_len);
            cudaFree(c.p.status);
            free(table); free(kv_len); free(new_len); free(st); free(cache);
            free(paths[bi][ni]);
            free(lens[bi][ni]);
        }
    }
    bench_emit(g_out, "\n%s\n",
               failures ? "RESULT: MISMATCH against the CPU backend (see stderr)"
                        : "RESULT: all outputs equal the CPU backend");
    if (g_out) fclose(g_out);
    CK(cudaStreamDestroy(s));
    return failures ? 1 : 0;
}
