/* bench_comm: the communication of one expert-parallel decode step (docs/multi_gpu.md) over NCCL
 * (kdt/comm.h), one thread per GPU, at Kimi K2's dims: for R rows per step (batch x tree rows),
 * the collectives each MoE layer needs under four designs, timed with CUDA events on rank 0's
 * stream (median of --iters after warm-up), per layer and per step (x --layers MoE layers):
 *   exact:   broadcast rows + routing (bf16), all-reduce of the per-choice slots [R*K, hidden] bf16
 *            (what the CPU path does: N ranks give one rank's bits)
 *   partial: broadcast rows + routing, all-reduce of partial sums [R, hidden] f32
 *   dp:      DP attention: all-gather of each rank's R/N rows (bf16), reduce-scatter of f32 sums
 *   a2a:     all-to-all dispatch of each rank's R/N rows to the ranks of their experts and back (bf16)
 *
 *   build/bench/bench_comm [--gpus N] [--rows 1,8,32,64,136,544,1088] [--hidden 7168] [--topk 8]
 *                          [--layers 60] [--iters 50] [--out FILE]
 *
 * --gpus defaults to every visible device; a world of one measures NCCL's local copies (the
 * one-GPU machine's check that the library loads and runs). */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "bench_common.h"
#include "kdt/comm.h"

#define MAX_ROWS_LIST 16
#define N_PAT 7

enum { P_BCAST, P_SLOTS, P_PARTIAL, P_GATHER, P_SCATTER, P_A2A, P_BARRIER };
static const char *pat_name[N_PAT] = {"broadcast rows+routing bf16", "all_reduce slots bf16", "all_reduce partial f32",
                                      "all_gather rows/N bf16", "reduce_scatter rows/N f32", "all_to_all rows bf16",
                                      "barrier"};

typedef struct cfg {
    int N, hidden, topk, layers, iters, n_rows;
    long rows[MAX_ROWS_LIST];
    kdt_comm_world *w;
    float us[MAX_ROWS_LIST][N_PAT]; /* rank 0's medians */
} cfg;

typedef struct rank_arg { cfg *c; int rank; } rank_arg;

/* One timed call of pattern p at R rows; buffers big enough for every pattern. */
static void run_pat(cfg *c, kdt_comm *cm, int p, long R, void *a, void *b, size_t *cnt, size_t *off, cudaStream_t s) {
    const size_t N = (size_t)c->N, H = (size_t)c->hidden, K = (size_t)c->topk, per = ((size_t)R + N - 1) / N;
    switch (p) {
    case P_BCAST: KCK(kdt_comm_broadcast(cm, a, (size_t)R * (H + 4 * K), KDT_BF16, 0, s)); break;
    case P_SLOTS: KCK(kdt_comm_all_reduce(cm, a, a, (size_t)R * K * H, KDT_BF16, s)); break;
    case P_PARTIAL: KCK(kdt_comm_all_reduce(cm, a, a, (size_t)R * H, KDT_F32, s)); break;
    case P_GATHER: KCK(kdt_comm_all_gather(cm, a, b, per * H, KDT_BF16, s)); break;
    case P_SCATTER: KCK(kdt_comm_reduce_scatter(cm, a, b, per * H, KDT_F32, s)); break;
    case P_A2A: {
        const size_t rows = (per * K + N - 1) / N; /* each rank's rows x choices, spread evenly */
        for (size_t q = 0; q < N; q++) cnt[q] = rows * H, off[q] = q * rows * H;
        KCK(kdt_comm_all_to_all_v(cm, a, cnt, off, b, cnt, off, KDT_BF16, s));
        break;
    }
    default: KCK(kdt_comm_barrier(cm)); break;
    }
}

static void *rank_main(void *arg) {
    rank_arg *ra = (rank_arg *)arg;
    cfg *c = ra->c;
    kdt_comm *cm;
    KCK(kdt_comm_init(c->w, ra->rank, &cm)); /* sets this thread's device to its rank */
    long maxR = 1;
    for (int i = 0; i < c->n_rows; i++) maxR = c->rows[i] > maxR ? c->rows[i] : maxR;
    const size_t bytes = (size_t)maxR * (size_t)c->topk * (size_t)c->hidden * 4 + (1 << 20);
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes * 2));
    CK(cudaMemset(a, 0, bytes));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    size_t cnt[256], off[256];
    float *t = (float *)malloc(sizeof(float) * (size_t)c->iters);
    for (int i = 0; i < c->n_rows; i++)
        for (int p = 0; p < N_PAT; p++) {
            for (int w = 0; w < 3; w++) run_pat(c, cm, p, c->rows[i], a, b, cnt, off, s);
            for (int it = 0; it < c->iters; it++) {
                CK(cudaEventRecord(e0, s));
                run_pat(c, cm, p, c->rows[i], a, b, cnt, off, s);
                CK(cudaEventRecord(e1, s));
                CK(cudaEventSynchronize(e1));
                CK(cudaEventElapsedTime(&t[it], e0, e1));
            }
            if (ra->rank == 0) c->us[i][p] = 1e3f * bench_median(t, c->iters);
        }
    free(t);
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaStreamDestroy(s));
    kdt_comm_free(cm);
    return NULL;
}

static int parse_list(const char *s, long *out, int cap) {
    int n = 0;
    for (char *e; *s && n < cap; s = *e ? e + 1 : e) {
        out[n++] = strtol(s, &e, 10);
        if (e == s || out[n - 1] < 1) return 0;
    }
    return n;
}

int main(int argc, char **argv) {
    static cfg c; /* zeroed */
    c.N = kdt_cuda_device_count(), c.hidden = 7168, c.topk = 8, c.layers = 60, c.iters = 50;
    const char *out_path = NULL, *rows = "1,8,32,64,136,544,1088";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--gpus")) c.N = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rows")) rows = argv[i + 1];
        else if (!strcmp(argv[i], "--hidden")) c.hidden = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--topk")) c.topk = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--layers")) c.layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters")) c.iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--out")) out_path = argv[i + 1];
        else { fprintf(stderr, "bench_comm: unknown option %s\n", argv[i]); return 2; }
    }
    FILE *out = NULL;
    if (bench_open("bench_comm", out_path, &out)) return 1;
    if (!(c.n_rows = parse_list(rows, c.rows, MAX_ROWS_LIST)) || c.N < 1 || c.N > 256 || c.N > kdt_cuda_device_count() ||
        c.iters < 1) {
        fprintf(stderr, "bench_comm: bad --rows, --iters or --gpus (%d devices)\n", kdt_cuda_device_count());
        return 2;
    }
    KCK(kdt_comm_world_create(KDT_COMM_NCCL, c.N, 120000, &c.w));
    pthread_t th[256];
    rank_arg ra[256];
    for (int r = 0; r < c.N; r++) {
        ra[r] = (rank_arg){&c, r};
        pthread_create(&th[r], NULL, rank_main, &ra[r]);
    }
    for (int r = 0; r < c.N; r++) pthread_join(th[r], NULL);
    kdt_comm_world_free(c.w);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    bench_report_header(out, "Expert-parallel communication per decode step (bench_comm)", &prop, argc, argv);
    bench_emit(out, "- ranks: %d, hidden %d, top-%d, %d MoE layers per step; us: median per call on rank 0\n\n", c.N, c.hidden,
               c.topk, c.layers);
    bench_emit(out, "| rows R | collective | us per layer | MB per layer (payload) | ms per step |\n|---|---|---|---|---|\n");
    for (int i = 0; i < c.n_rows; i++) {
        const double R = (double)c.rows[i], H = c.hidden, K = c.topk, per = ceil(R / c.N);
        const double mb[N_PAT] = {R * (H + 4 * K) * 2, R * K * H * 2, R * H * 4, per * H * 2 * c.N, per * H * 4 * c.N,
                                  ceil(per * K / c.N) * H * 2 * c.N, 4};
        for (int p = 0; p < N_PAT; p++)
            bench_emit(out, "| %ld | %s | %.1f | %.3f | %.3f |\n", c.rows[i], pat_name[p], c.us[i][p], mb[p] / 1e6,
                       c.us[i][p] * c.layers / 1e3);
    }
    bench_emit(out, "\n| rows R | exact (bcast + slots) ms/step | partial (bcast + f32 sums) | dp (gather + scatter) | a2a (x2) |\n"
                    "|---|---|---|---|---|\n");
    for (int i = 0; i < c.n_rows; i++) {
        const float *u = c.us[i];
        bench_emit(out, "| %ld | %.3f | %.3f | %.3f | %.3f |\n", c.rows[i], (u[P_BCAST] + u[P_SLOTS]) * c.layers / 1e3,
                   (u[P_BCAST] + u[P_PARTIAL]) * c.layers / 1e3, (u[P_GATHER] + u[P_SCATTER]) * c.layers / 1e3,
                   2 * u[P_A2A] * c.layers / 1e3);
    }
    if (out) fclose(out);
    return 0;
}
