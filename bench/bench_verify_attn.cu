/* verify_attn on Hopper: the sm90 kernel on the target shapes, against the ceilings
 * measured in the same run and FlashMLA's numbers from the issue.
 *
 *   build/bench/bench_verify_attn [--reps 50] [--out docs/perf/verify_attn_sm90_results.md]
 *                                 [--csv FILE] [--torch-csv FILE] [--no-fallback] [--no-sweep] [--shape I]
 *                                 [--kernels 1,2] [--parts 1,2,4,...] [--small] [--base-parts P0,P1,...]
 *
 * Inputs: bf16, paged cache of block size 64 with a shuffled block table, kv_len = prefix + Q,
 * tree mask from random trees, sm_scale 0.13086. Each time is the median of --reps runs timed
 * with CUDA events, the L2 flushed (a 256 MB memset) before each run. Per shape it prints the
 * times of the listed kernels (verify_attn_sm90.h: 0 auto, what the library runs and the table's
 * main column, TMA here; 1 TMA; 2 cp.async, the fallback for block sizes TMA cannot describe; by
 * default 0, 1 and 2; --kernels names others, 0 and 2 are always added) with the scheduler's split; the general CUDA kernel (kdt_verify_attn_cuda with
 * $KDT_VA_SM90=0; fewer runs); a sweep of forced split counts of the auto kernel (--parts sets the
 * list; the chosen count and its neighbours within 2 are always in it; each with its GB/s: the 8-head
 * shapes are bandwidth-bound); and a cross-check (not the test): one more run of each kernel into a
 * NaN-poisoned o, compared with the cp.async kernel's (relative L2, max |d|, elements that differ,
 * NaN; the kernels accumulate in the same order and match bit for bit).
 * dev/cuda/ holds the experiments that are not in the library (ping-pong schedule).
 * Ceilings: a bf16 cuBLAS GEMM 8192^3 (TFLOP/s) and a 1 GiB device-to-device copy (read + write).
 * --shape I runs only the I-th shape (0-based), e.g. under ncu; --small adds the small model's decode
 * and verify calls (a few keys of a large cache) after the issue's shapes. Each shape also runs a
 * baseline, the TMA kernel with a split forced: --base-parts' count for that shape (in the order run;
 * the previous commit's choices), else the chosen count unscaled, as the host picked it for full
 * caches: main's kernel and schedule. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "bench_common.h"
#include "cuda/sm90/verify_attn_sm90.h"
#include "ops/backends.h"

namespace {

struct Shape {
    int B, H, Q, prefix;
    double flashmla_us; /* FlashMLA's own table: dense decode, no tree mask, kernel + combine; 0: none */
    int cap;            /* keys the cache holds per request; 0: kv_len rounded up to a block */
};
const Shape kShapes[] = {
    {1, 64, 33, 32768, 218, 0}, {16, 64, 17, 4096, 258, 0}, {32, 64, 9, 8192, 477, 0}, {1, 64, 257, 8192, 418, 0},
    {2, 16, 17, 2048, 24, 0},   {64, 8, 17, 8192, 322, 0},  {128, 8, 9, 16384, 830, 0},
    /* --small: the shipped small model's calls (4 heads; decode Q = 1, verify Q = 16) over a few keys of
     * a cache of 2048 (its max_len), as the forward passes them (issue 21) */
    {1, 4, 1, 16, 0, 2048},     {1, 4, 1, 64, 0, 2048},     {1, 4, 1, 256, 0, 2048},    {1, 4, 16, 64, 0, 2048},
    {1, 4, 16, 256, 0, 2048},   {8, 4, 1, 256, 0, 2048},
};
constexpr int kIssueShapes = 7;
constexpr int kDqk = 576, kDv = 512, kBS = 64;

__global__ void fill_bf16(__nv_bfloat16 *x, size_t n, uint64_t seed, float amp) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint64_t z = bench_mix64((i + 1) * 0x9E3779B97F4A7C15ull ^ seed);
        x[i] = __float2bfloat16((float)((z >> 40) * (1.0 / 16777216.0) * 2.0 - 1.0) * amp);
    }
}

uint64_t rng = 42;
uint64_t rnd() { return bench_splitmix64(&rng); }

struct Bench {
    int reps;
    void *flush;
    size_t flush_bytes;
    cudaEvent_t e0, e1;
};

/* Median time (us) of fn over reps runs, the L2 flushed before each. */
template <typename F>
double time_us(Bench &bn, int reps, F fn) {
    double *t = (double *)malloc(sizeof(double) * reps);
    for (int r = 0; r < reps; r++) {
        CK(cudaMemsetAsync(bn.flush, r & 0xFF, bn.flush_bytes, 0));
        CK(cudaEventRecord(bn.e0, 0));
        fn();
        CK(cudaEventRecord(bn.e1, 0));
        CK(cudaEventSynchronize(bn.e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, bn.e0, bn.e1));
        t[r] = ms * 1e3;
    }
    for (int i = 1; i < reps; i++) /* insertion sort, reps is small */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            const double x = t[j];
            t[j] = t[j - 1], t[j - 1] = x;
        }
    const double med = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
    free(t);
    return med;
}

double gemm_tflops(Bench &bn) {
    const int n = 8192;
    void *a, *b, *c;
    CK(cudaMalloc(&a, (size_t)n * n * 2));
    CK(cudaMalloc(&b, (size_t)n * n * 2));
    CK(cudaMalloc(&c, (size_t)n * n * 2));
    fill_bf16<<<1024, 256>>>((__nv_bfloat16 *)a, (size_t)n * n, 1, 1.f);
    fill_bf16<<<1024, 256>>>((__nv_bfloat16 *)b, (size_t)n * n, 2, 1.f);
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate failed\n");
        exit(1);
    }
    const float one = 1.f, zero = 0.f;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    auto run = [&] {
        cublasStatus_t s = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n,
                                        &zero, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS) st = s;
    };
    run(); /* warm-up: heuristics, clocks */
    const double us = time_us(bn, 10, run);
    if (st != CUBLAS_STATUS_SUCCESS) fprintf(stderr, "cublasGemmEx failed: %d\n", (int)st);
    cublasDestroy(h);
    cudaFree(a), cudaFree(b), cudaFree(c);
    return 2.0 * n * (double)n * n / us / 1e6;
}

double copy_gbs(Bench &bn) {
    const size_t bytes = (size_t)1 << 30;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    auto run = [&] { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0)); };
    run();
    const double us = time_us(bn, 10, run);
    cudaFree(a), cudaFree(b);
    return 2.0 * bytes / us / 1e3; /* read + write */
}

/* Device inputs of one shape. */
struct Inputs {
    kdt_verify_attn_params p;
    void *q, *kv, *o;
    int32_t *bt, *kv_len;
    uint8_t *mask;
    float *lse;
};

void make_inputs(const Shape &s, Inputs *in) {
    memset(in, 0, sizeof *in);
    const int n = s.prefix + s.Q, MB = ((n > s.cap ? n : s.cap) + kBS - 1) / kBS, NB = s.B * MB;
    const size_t q_n = (size_t)s.B * s.Q * s.H * kDqk, kv_n = (size_t)NB * kBS * kDqk, rows = (size_t)s.B * s.Q * s.H;
    CK(cudaMalloc(&in->q, q_n * 2));
    CK(cudaMalloc(&in->kv, kv_n * 2));
    CK(cudaMalloc(&in->o, rows * kDv * 2));
    CK(cudaMalloc(&in->lse, rows * 4));
    fill_bf16<<<2048, 256>>>((__nv_bfloat16 *)in->q, q_n, rnd(), 2.f);
    fill_bf16<<<2048, 256>>>((__nv_bfloat16 *)in->kv, kv_n, rnd(), 1.f);
    CK(cudaGetLastError());
    int32_t *bt = (int32_t *)malloc(sizeof(int32_t) * NB), *len = (int32_t *)malloc(sizeof(int32_t) * s.B);
    for (int i = 0; i < NB; i++) bt[i] = i;
    for (int i = NB - 1; i > 0; i--) {
        const int j = (int)(rnd() % (uint64_t)(i + 1)), t = bt[i];
        bt[i] = bt[j], bt[j] = t;
    }
    for (int b = 0; b < s.B; b++) len[b] = n;
    uint8_t *mask = (uint8_t *)calloc((size_t)s.B * s.Q * s.Q, 1);
    int *parent = (int *)malloc(sizeof(int) * s.Q);
    for (int b = 0; b < s.B; b++)
        for (int i = 0; i < s.Q; i++) { /* random tree: parent below child, deep-ish */
            parent[i] = i == 0 ? -1 : (rnd() % 2 ? i - 1 : (int)(rnd() % (uint64_t)i));
            for (int j = i; j >= 0; j = parent[j]) mask[((size_t)b * s.Q + i) * s.Q + j] = 1;
        }
    CK(cudaMalloc(&in->bt, sizeof(int32_t) * NB));
    CK(cudaMalloc(&in->kv_len, sizeof(int32_t) * s.B));
    CK(cudaMalloc(&in->mask, (size_t)s.B * s.Q * s.Q));
    CK(cudaMemcpy(in->bt, bt, sizeof(int32_t) * NB, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(in->kv_len, len, sizeof(int32_t) * s.B, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(in->mask, mask, (size_t)s.B * s.Q * s.Q, cudaMemcpyHostToDevice));
    free(bt), free(len), free(mask), free(parent);
    kdt_verify_attn_params *p = &in->p;
    p->B = s.B, p->Q = s.Q, p->H = s.H, p->Dv = kDv, p->Dr = kDqk - kDv, p->dtype = KDT_BF16;
    p->q = in->q, p->kv_cache = in->kv, p->NB = NB, p->BS = kBS, p->block_table = in->bt, p->MB = MB;
    p->kv_len = in->kv_len, p->tree_mask = in->mask, p->sm_scale = 0.13086f, p->o = in->o, p->lse = in->lse;
}

void free_inputs(Inputs *in) {
    cudaFree(in->q), cudaFree(in->kv), cudaFree(in->o), cudaFree(in->lse);
    cudaFree(in->bt), cudaFree(in->kv_len), cudaFree(in->mask);
}

/* Distance of a bf16 output a to a reference b (host arrays of n elements). */
struct Diff {
    double rel_l2, max_abs;
    size_t differ, nan; /* elements whose bits differ; NaN in a (unwritten: the poison) */
};
Diff compare(const uint16_t *a, const uint16_t *b, size_t n) {
    Diff d = {0, 0, 0, 0};
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t ua = (uint32_t)a[i] << 16, ub = (uint32_t)b[i] << 16;
        float fa, fb;
        memcpy(&fa, &ua, 4), memcpy(&fb, &ub, 4);
        if (isnan(fa)) {
            d.nan++;
            continue;
        }
        d.differ += a[i] != b[i];
        num += ((double)fa - fb) * ((double)fa - fb), den += (double)fb * fb;
        if (fabs((double)fa - fb) > d.max_abs) d.max_abs = fabs((double)fa - fb);
    }
    d.rel_l2 = den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
    return d;
}

const char *kKernelNames[] = {"auto", "tma", "cp.async"}; /* by kdt_va_sm90_kernel */

/* One run of a kernel into o poisoned with NaN; its output to host (n elements). */
void checked_run(Inputs &in, int kernel, uint16_t *host, size_t n) {
    kdt_va_sm90_config cfg = {kernel, 0, 0};
    int handled = 0;
    CK(cudaMemset(in.o, 0xFF, n * 2));
    KCK(kdt_verify_attn_sm90_ex(&in.p, NULL, &cfg, NULL, &handled));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(host, in.o, n * 2, cudaMemcpyDeviceToHost));
}

double run_sm90(Bench &bn, Inputs &in, int kernel, int parts, int reps, kdt_va_sm90_info *info) {
    kdt_va_sm90_config cfg = {kernel, parts, 0};
    int handled = 0;
    KCK(kdt_verify_attn_sm90_ex(&in.p, NULL, &cfg, info, &handled)); /* warm-up, and what runs */
    if (!handled) {
        fprintf(stderr, "the sm90 kernel declined the shape (not an sm_90 device?)\n");
        exit(1);
    }
    CK(cudaDeviceSynchronize());
    return time_us(bn, reps, [&] { KCK(kdt_verify_attn_sm90_ex(&in.p, NULL, &cfg, NULL, &handled)); });
}

/* Per call (us) of kBackToBack calls in a row, captured in one CUDA graph and replayed, as a model
 * step's graph runs them: no host work between calls, launches overlapping the previous call's end
 * (programmatic dependent launch), q and the cache warm in L2 after the first call. NaN when the
 * capture fails. */
constexpr int kBackToBack = 20;
double graph_us(Bench &bn, Inputs &in, int kernel, int parts, int reps) {
    kdt_va_sm90_config cfg = {kernel, parts, 0};
    cudaStream_t st;
    CK(cudaStreamCreate(&st)); /* blocking: ordered with the events and flushes on stream 0 */
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    int ok = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    for (int i = 0; ok && i < kBackToBack; i++) {
        int handled = 0;
        ok = kdt_verify_attn_sm90_ex(&in.p, st, &cfg, NULL, &handled) == KDT_OK && handled;
    }
    const cudaError_t ec = cudaStreamEndCapture(st, &g);
    ok = ok && ec == cudaSuccess && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess && cudaGraphLaunch(ge, st) == cudaSuccess &&
         cudaStreamSynchronize(st) == cudaSuccess;
    double us = NAN;
    if (ok) us = time_us(bn, reps, [&] { CK(cudaGraphLaunch(ge, st)); }) / kBackToBack;
    else fprintf(stderr, "graph capture of the calls failed: %s\n", cudaGetErrorString(cudaGetLastError()));
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    cudaStreamDestroy(st);
    return us;
}

double torch_us(const char *csv, const Shape &s) { /* bench/torch_sdpa_verify.py's CSV: B,H,Q,prefix,us */
    if (!csv) return NAN;
    FILE *f = fopen(csv, "r");
    if (!f) return NAN;
    char line[256];
    double us = NAN;
    while (fgets(line, sizeof line, f)) {
        int B, H, Q, P;
        double t;
        if (sscanf(line, "%d,%d,%d,%d,%lf", &B, &H, &Q, &P, &t) == 5 && B == s.B && H == s.H && Q == s.Q && P == s.prefix)
            us = t;
    }
    fclose(f);
    return us;
}

} // namespace

int main(int argc, char **argv) {
    int reps = 50, fallback = 1, sweep = 1, only = -1, small = 0;
    int base_parts[32] = {}, nbase = 0; /* --base-parts: per shape run, the baseline's split (0: the chosen one) */
    int cand[64] = {1, 2, 3, 4, 6, 8, 12, 16, 20, 26, 33, 44, 66, 132}, ncand = 14; /* forced split counts */
    const int vref = KDT_VA_SM90_CP_ASYNC, vdef = KDT_VA_SM90_AUTO; /* the cross-check's reference; the main column */
    int vlist[4] = {vdef, KDT_VA_SM90_TMA, vref}, nvl = 3;           /* kernels timed */
    const char *out = NULL, *csv = NULL, *torch_csv = NULL;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--reps") && a + 1 < argc) reps = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--out") && a + 1 < argc) out = argv[++a];
        else if (!strcmp(argv[a], "--csv") && a + 1 < argc) csv = argv[++a];
        else if (!strcmp(argv[a], "--torch-csv") && a + 1 < argc) torch_csv = argv[++a];
        else if (!strcmp(argv[a], "--no-fallback")) fallback = 0;
        else if (!strcmp(argv[a], "--no-sweep")) sweep = 0;
        else if (!strcmp(argv[a], "--shape") && a + 1 < argc) only = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--small")) small = 1;
        else if (!strcmp(argv[a], "--base-parts") && a + 1 < argc) {
            for (char *t = strtok(argv[++a], ","); t && nbase < 32; t = strtok(NULL, ",")) base_parts[nbase++] = atoi(t);
        }
        else if (!strcmp(argv[a], "--parts") && a + 1 < argc) {
            ncand = 0;
            for (char *t = strtok(argv[++a], ","); t && ncand < 48; t = strtok(NULL, ","))
                if (atoi(t) >= 1) cand[ncand++] = atoi(t);
        } else if (!strcmp(argv[a], "--kernels") && a + 1 < argc) {
            nvl = 0;
            for (char *t = strtok(argv[++a], ","); t && nvl < 2; t = strtok(NULL, ","))
                if (atoi(t) >= KDT_VA_SM90_AUTO && atoi(t) <= KDT_VA_SM90_CP_ASYNC) vlist[nvl++] = atoi(t);
        }
        else {
            fprintf(stderr, "usage: %s [--reps N] [--out FILE.md] [--csv FILE] [--torch-csv FILE] [--no-fallback] [--no-sweep] [--shape I] "
                            "[--kernels 1,2] [--parts 1,2,4,...] [--small] [--base-parts P0,P1,...]\n",
                    argv[0]);
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("bench_verify_attn: no CUDA device (skipped)\n");
        return 0;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    char cmd[1024], date[64];
    bench_command(cmd, sizeof cmd, argc, argv);
    bench_date(date, sizeof date);

    Bench bn;
    bn.reps = reps;
    bn.flush_bytes = (size_t)256 << 20;
    CK(cudaMalloc(&bn.flush, bn.flush_bytes));
    CK(cudaEventCreate(&bn.e0));
    CK(cudaEventCreate(&bn.e1));
    const double gemm = gemm_tflops(bn), copy = copy_gbs(bn);
    printf("# verify_attn sm90 bench\n\n%s (sm_%d%d, %d SMs), %s\n`%s`\n\nceilings measured in this run: bf16 GEMM 8192^3 "
           "%.0f TFLOP/s, device copy %.0f GB/s (read + write)\n\n",
           prop.name, prop.major, prop.minor, prop.multiProcessorCount, date, cmd, gemm, copy);

    const char *env_v = getenv("KDT_VA_SM90");
    int haveref = 0, havedef = 0;
    for (int k = 0; k < nvl; k++) haveref |= vlist[k] == vref, havedef |= vlist[k] == vdef;
    if (!haveref) vlist[nvl++] = vref;
    if (!havedef) vlist[nvl++] = vdef;
    printf("default kernel (the table's main time): %s\n\n", kKernelNames[vdef]);
    char table[32768] = "";
    size_t tl = 0;
#define ROW(...) (tl += (size_t)snprintf(table + tl, sizeof table - tl, __VA_ARGS__))
    ROW("| B, H, Q, prefix | parts | us (default: %s) | TFLOP/s | %% GEMM | GB/s | %% copy | FlashMLA us | vs FlashMLA | target |",
        kKernelNames[vdef]);
    for (int k = 0; k < nvl; k++) ROW(" us %s |", kKernelNames[vlist[k]]);
    ROW(" us fallback | torch SDPA us | best forced parts (us) |");
    for (int k = 0; k < nvl; k++)
        if (vlist[k] != vref) ROW(" %s vs %s: rel_l2, max abs, differing |", kKernelNames[vlist[k]], kKernelNames[vref]);
    ROW("\n|---|---|---|---|---|---|---|---|---|---|");
    for (int k = 0; k < nvl; k++) ROW("---|%s", vlist[k] != vref ? "---|" : "");
    ROW("---|---|---|\n");
    char sweep_tab[8192] = "| B, H, Q, prefix | chosen parts | us | GB/s | % copy | best forced parts | us | GB/s | chosen / best |\n"
                           "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    size_t sl = strlen(sweep_tab);
    FILE *fc = csv ? fopen(csv, "w") : NULL;
    if (csv && !fc) fprintf(stderr, "cannot write %s\n", csv);
    if (fc) {
        fprintf(fc, "B,H,Q,prefix,kv_len,parts,kernel,us,tflops,pct_gemm,gbs,pct_copy,flashmla_us,");
        for (int k = 0; k < nvl; k++) fprintf(fc, "us_%s,", vlist[k] == vref ? "cp_async" : kKernelNames[vlist[k]]); /* plot_verify_attn.py's names */
        fprintf(fc, "us_fallback,us_torch,best_parts,best_parts_us,gemm_tflops,copy_gbs\n");
    }

    char ab_tab[4096] = "| B, H, Q, prefix (cache) | chosen parts | us | baseline parts (forced) | us | chosen / baseline | "
                        "in a graph, us per call: chosen | baseline |\n|---|---:|---:|---:|---:|---:|---:|---:|\n";
    size_t al = strlen(ab_tab);
    int run_i = 0;
    for (int si = 0; si < (int)(sizeof kShapes / sizeof *kShapes); si++) {
        if (only >= 0 ? si != only : si >= kIssueShapes && !small) continue;
        const Shape &s = kShapes[si];
        const int base_req = run_i < nbase ? base_parts[run_i] : 0;
        run_i++;
        Inputs in;
        make_inputs(s, &in);
        const int n = s.prefix + s.Q;
        const double flops = 2.0 * s.B * s.H * s.Q * (double)n * (kDqk + kDv);
        const double bytes = (double)s.B * n * kDqk * 2 + (double)s.B * s.Q * s.H * (kDqk + kDv) * 2;
        const size_t o_n = (size_t)s.B * s.Q * s.H * kDv;
        double t[4] = {};
        kdt_va_sm90_info info[4];
        uint16_t *out[4] = {};
        printf("B=%d H=%d Q=%d prefix=%d:", s.B, s.H, s.Q, s.prefix);
        for (int k = 0; k < nvl; k++) {
            const int v = vlist[k];
            memset(&info[v], 0, sizeof info[v]);
            t[v] = run_sm90(bn, in, v, 0, reps, &info[v]);
            out[v] = (uint16_t *)malloc(o_n * 2);
            checked_run(in, v, out[v], o_n);
            printf("  %s %.1f us (ran %s)", kKernelNames[v], t[v], kKernelNames[info[v].kernel]);
        }
        Diff d[4];
        for (int k = 0; k < nvl; k++) d[vlist[k]] = compare(out[vlist[k]], out[vref], o_n);
        const kdt_va_sm90_info &id = info[vdef];
        const double tm = t[vdef];
        printf("\n  m_tiles=%d parts=%d pdl=%d grid=%d ws=%.1fMB smem=%d\n", id.m_tiles, id.parts, id.pdl, id.grid,
               id.workspace_bytes / 1e6, id.smem_bytes);
        for (int k = 0; k < nvl; k++)
            if (vlist[k] != vref)
                printf("  %s vs %s: rel_l2 %.2e max|d| %.3g differing %zu NaN %zu (of %zu)\n", kKernelNames[vlist[k]],
                       kKernelNames[vref], d[vlist[k]].rel_l2, d[vlist[k]].max_abs, d[vlist[k]].differ, d[vlist[k]].nan, o_n);
        for (int k = 0; k < nvl; k++) free(out[vlist[k]]);
        double tf = NAN;
        if (fallback) {
            setenv("KDT_VA_SM90", "0", 1);
            KCK(kdt_verify_attn_cuda(&in.p, NULL));
            CK(cudaDeviceSynchronize());
            tf = time_us(bn, reps < 5 ? reps : 5, [&] { KCK(kdt_verify_attn_cuda(&in.p, NULL)); });
            if (env_v) setenv("KDT_VA_SM90", env_v, 1);
            else unsetenv("KDT_VA_SM90");
            printf("  fallback (kdt_verify_attn_cuda, hook off) %.1f us\n", tf);
        }
        int best_p = id.parts;
        double best_t = tm;
        if (sweep) {
            printf("  forced parts (%s), us (GB/s):", kKernelNames[vdef]);
            int list[64], nl = 0; /* the candidates, the chosen count's neighbours, sorted, unique */
            for (int k = 0; k < ncand; k++) list[nl++] = cand[k];
            for (int d = -2; d <= 2; d++)
                if (id.parts + d >= 1) list[nl++] = id.parts + d;
            for (int i = 1; i < nl; i++)
                for (int j = i; j > 0 && list[j] < list[j - 1]; j--) {
                    const int x = list[j];
                    list[j] = list[j - 1], list[j - 1] = x;
                }
            for (int k = 0; k < nl; k++) {
                const int p = list[k];
                if ((k > 0 && p == list[k - 1]) || (p > 1 && p * id.m_tiles > 4 * prop.multiProcessorCount)) continue;
                const double tp = run_sm90(bn, in, vdef, p, reps < 10 ? reps : 10, NULL);
                printf(" %d:%.1f (%.0f)", p, tp, bytes / tp / 1e3);
                if (tp < best_t) best_t = tp, best_p = p;
            }
            printf("  (chosen %d)\n", id.parts);
            sl += (size_t)snprintf(sweep_tab + sl, sizeof sweep_tab - sl, "| %d, %d, %d, %d | %d | %.1f | %.0f | %.0f%% | %d | %.1f | %.0f | %.3f |\n",
                                   s.B, s.H, s.Q, s.prefix, id.parts, tm, bytes / tm / 1e3, 100 * bytes / tm / 1e3 / copy, best_p, best_t,
                                   bytes / best_t / 1e3, tm / best_t);
        }
        /* The baseline: a split forced as given (--base-parts: the previous commit's choice), else the
         * chosen count forced exactly, i.e. not scaled to kv_len on the device as the chosen split is. */
        const int bp = base_req > 0 ? base_req : id.parts;
        const double t_base = run_sm90(bn, in, KDT_VA_SM90_TMA, bp, reps, NULL);
        printf("  baseline: %d parts forced %.1f us; chosen / baseline %.3f\n", bp, t_base, tm / t_base);
        char b2b[64] = "- | -";
        if (si >= kIssueShapes) { /* the small calls: what a step of the model pays for them */
            const double c = graph_us(bn, in, KDT_VA_SM90_AUTO, 0, reps), cb = graph_us(bn, in, KDT_VA_SM90_TMA, bp, reps);
            printf("  in a graph (%d calls back to back): chosen %.2f us per call, baseline %.2f\n", kBackToBack, c, cb);
            snprintf(b2b, sizeof b2b, "%.2f | %.2f", c, cb);
        }
        al += (size_t)snprintf(ab_tab + al, sizeof ab_tab - al, "| %d, %d, %d, %d (%d) | %d | %.1f | %d | %.1f | %.3f | %s |\n", s.B, s.H,
                               s.Q, s.prefix, in.p.MB * kBS, id.parts, tm, bp, t_base, tm / t_base, b2b);
        const double tt = torch_us(torch_csv, s);
        const double target = s.B == 2 && s.H == 16 ? s.flashmla_us : 1.4 * s.flashmla_us;
        char fb_s[32] = "-", tt_s[32] = "-", fm_s[64] = "- | - | -";
        if (fallback) snprintf(fb_s, sizeof fb_s, "%.0f", tf);
        if (!isnan(tt)) snprintf(tt_s, sizeof tt_s, "%.0f", tt);
        if (s.flashmla_us > 0)
            snprintf(fm_s, sizeof fm_s, "%.0f | %.2fx | %s (<= %.0f)", s.flashmla_us, tm / s.flashmla_us, tm <= target ? "met" : "MISSED",
                     target);
        ROW("| %d, %d, %d, %d | %d | %.1f | %.0f | %.0f%% | %.0f | %.0f%% | %s |", s.B, s.H, s.Q, s.prefix, id.parts, tm,
            flops / tm / 1e6, 100 * flops / tm / 1e6 / gemm, bytes / tm / 1e3, 100 * bytes / tm / 1e3 / copy, fm_s);
        for (int k = 0; k < nvl; k++) ROW(" %.1f |", t[vlist[k]]);
        ROW(" %s | %s | %d (%.1f) |", fb_s, tt_s, best_p, best_t);
        for (int k = 0; k < nvl; k++)
            if (vlist[k] != vref) ROW(" %.1e, %.2g, %zu |", d[vlist[k]].rel_l2, d[vlist[k]].max_abs, d[vlist[k]].differ);
        ROW("\n");
        if (fc) {
            fprintf(fc, "%d,%d,%d,%d,%d,%d,%s,%.2f,%.1f,%.1f,%.0f,%.1f,%.0f,", s.B, s.H, s.Q, s.prefix, n, id.parts, kKernelNames[vdef], tm,
                    flops / tm / 1e6, 100 * flops / tm / 1e6 / gemm, bytes / tm / 1e3, 100 * bytes / tm / 1e3 / copy, s.flashmla_us);
            for (int k = 0; k < nvl; k++) fprintf(fc, "%.2f,", t[vlist[k]]);
            fprintf(fc, "%.2f,%.2f,%d,%.2f,%.0f,%.0f\n", tf, tt, best_p, best_t, gemm, copy);
        }
        free_inputs(&in);
    }
    printf("\n%s\n", table);
    if (sweep) printf("split sweep (forced parts at min(reps, 10) runs; bytes = KV once + q + o):\n\n%s\n", sweep_tab);
    printf("A/B (chosen split, scaled to kv_len on the device, against the baseline split forced; %d runs each; in a graph: %d calls "
           "back to back in one CUDA graph):\n\n%s\n", reps, kBackToBack, ab_tab);
    if (fc) fclose(fc);
    if (out) {
        FILE *f = fopen(out, "w");
        if (!f) {
            fprintf(stderr, "cannot write %s\n", out);
            return 1;
        }
        fprintf(f, "# verify_attn sm90 results\n\n%s (sm_%d%d, %d SMs), %s, %d runs per time (median, L2 flushed)\n`%s`\n\n"
                   "Ceilings in this run: bf16 GEMM %.0f TFLOP/s, device copy %.0f GB/s.\n\n%s",
                prop.name, prop.major, prop.minor, prop.multiProcessorCount, date, reps, cmd, gemm, copy, table);
        if (sweep) fprintf(f, "\nSplit sweep (forced parts at min(reps, 10) runs):\n\n%s", sweep_tab);
        fprintf(f, "\nA/B (chosen split against the baseline split forced):\n\n%s", ab_tab);
        fclose(f);
    }
    cudaFree(bn.flush);
    return 0;
}
