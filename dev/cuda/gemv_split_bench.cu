/* The bf16 weight-streaming GEMM (src/cuda/stream_gemm.cuh) at the forward's projection shapes of Kimi K2
 * (issue 21), experiment: the library's launcher compiled into this file so that any K split S (cluster of S
 * blocks, past 8 with the non-portable cluster sizes allowed; "-" where a launch fails) can be launched with any bf16 shape (row tiles a warp x steps in flight a lane: 1 x 4, 2 x 4, 1 x 8),
 * not only the S the library derives from (N, K). M = 1, 4, 16; every launch with programmatic dependent launch
 * (KDT_SGEMM_PDL), CUDA graphs of 24 launches each reading another copy of the weights, the median of
 * --batches graphs (bench_common.h). A table of us per (shape, M, cfg) and S, then one "split" line per
 * (shape, M): the library's pick against the fastest (cfg, S).
 *
 *   make BUILD=build build/dev/gemv_split_bench   (sm_90a; links build/libkdt.a)
 *   build/dev/gemv_split_bench [--out FILE] [--batches 5]
 */
#include "../../bench/bench_common.h"
#include "cuda/stream_gemm.cuh"

namespace {

using namespace kdt_sgemm_impl;

struct Shape { const char *name; int N, K; };
const Shape kShapes[] = {
    {"q_a+kv_a", 2112, 7168},  {"q_b", 12288, 1536},         {"o", 7168, 8192},           {"shared gate/up", 4096, 7168},
    {"shared down", 7168, 2048}, {"dense gate/up", 36864, 7168}, {"dense down", 7168, 18432}, {"lm_head", 32000, 7168},
};
const int kM[] = {1, 4, 16}, kSplits[] = {1, 2, 3, 4, 6, 8, 12, 16}; /* past 8: non-portable cluster sizes */
const int kTR[] = {1, 2, 1}, kD[] = {4, 4, 8}; /* the library's bf16 cfgs 1, 2, 3 */
constexpr int kCfgs = 3, kNS = sizeof kSplits / sizeof kSplits[0];

struct Run {
    const unsigned char *w;
    size_t wbytes;
    int copies, next;
    const void *x;
    float *y;
    int M, N, K, cfg, S;
    kdt_status status; /* the last launch's */
};

template <int kR, int kMT, int kDepth>
void allow_large_clusters() {
    static bool done;
    if (!done) CK(cudaFuncSetAttribute(sgemm_kernel<KDT_SGEMM_BF16, kR, kMT, kDepth, false, false>,
                                       cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    done = true;
}

template <int kR, int kDepth>
kdt_status launch(const Run *r, const void *w, cudaStream_t st) {
    allow_large_clusters<kR, 1, kDepth>();
    allow_large_clusters<kR, 2, kDepth>();
    if (r->M <= 8) return launch_mt<KDT_SGEMM_BF16, kR, 1, kDepth, false>(r->x, w, nullptr, r->y, r->M, r->N, r->K, KDT_SGEMM_PDL, r->S, st, "gemv");
    return launch_mt<KDT_SGEMM_BF16, kR, 2, kDepth, false>(r->x, w, nullptr, r->y, r->M, r->N, r->K, KDT_SGEMM_PDL, r->S, st, "gemv");
}

void run(void *p, cudaStream_t st) {
    Run *r = (Run *)p;
    const void *w = r->w + (size_t)(r->next++ % r->copies) * r->wbytes;
    r->status = r->cfg == 1 ? launch<2, 4>(r, w, st) : r->cfg == 2 ? launch<1, 8>(r, w, st) : launch<1, 4>(r, w, st);
}

} // namespace

int main(int argc, char **argv) {
    const char *out_path = NULL;
    int batches = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out_path = argv[++i];
        else if (!strcmp(argv[i], "--batches") && i + 1 < argc) batches = atoi(argv[++i]);
        else { fprintf(stderr, "usage: %s [--out FILE] [--batches 5]\n", argv[0]); return 2; }
    }
    if (batches < 1 || batches > BENCH_MAX_BATCHES) batches = 5;
    FILE *out = NULL;
    if (bench_open("gemv_split_bench", out_path, &out)) return 1;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    bench_report_header(out, "bf16 weight-streaming GEMM: K split and shape (gemv_split_bench)", &prop, argc, argv);
    bench_emit(out, "us a launch (PDL, graphs of 24, each launch another copy of the weights); cfg: row tiles a warp x steps in "
                    "flight a lane; lib: the S kdt_sgemm derives from (N, K).\n\n| weight [N, K] | M | cfg | lib S |");
    for (int s : kSplits) bench_emit(out, " S %d |", s);
    bench_emit(out, "\n|---|---:|---|---:|");
    for (int i = 0; i < kNS; i++) bench_emit(out, "---:|");
    bench_emit(out, "\n");
    char lines[64][240];
    int n_lines = 0;
    for (const Shape &sh : kShapes) {
        Run r = {};
        r.N = sh.N;
        r.K = sh.K;
        r.wbytes = (size_t)sh.N * sh.K * 2;
        r.copies = (int)((256ull << 20) / r.wbytes + 2);
        unsigned char *w;
        CK(cudaMalloc((void **)&w, r.wbytes * r.copies));
        CK(cudaMemset(w, 0x3c, r.wbytes * r.copies));
        r.w = w;
        int lib_s = 1;
        KCK(k_split<KDT_SGEMM_BF16>(sh.N, sh.K, &lib_s));
        for (int M : kM) {
            r.M = M;
            void *x;
            CK(cudaMalloc(&x, (size_t)M * sh.K * 2));
            CK(cudaMemset(x, 0, (size_t)M * sh.K * 2));
            CK(cudaMalloc((void **)&r.y, (size_t)M * sh.N * 4));
            r.x = x;
            float best = 1e30f, lib = 0;
            int best_cfg = 0, best_s = 0;
            const int lib_cfg = kdt_sgemm_auto_cfg(KDT_SGEMM_BF16, M) - 1;
            for (int c = 0; c < kCfgs; c++) {
                r.cfg = c;
                bench_emit(out, "| %s [%d, %d] | %d | %d x %d | %d |", sh.name, sh.N, sh.K, M, kTR[c], kD[c], lib_s);
                for (int s : kSplits) {
                    r.S = s;
                    run(&r, st); /* a cluster size the device cannot place fails here, outside any capture */
                    if (r.status != KDT_OK) {
                        (void)cudaGetLastError();
                        bench_emit(out, " - |");
                        continue;
                    }
                    CK(cudaStreamSynchronize(st));
                    const float t = bench_time_launches(run, &r, st, 1, 24, batches);
                    bench_emit(out, " %.1f |", t);
                    if (t < best) best = t, best_cfg = c, best_s = s;
                    if (c == lib_cfg && s == lib_s) lib = t;
                }
                bench_emit(out, "\n");
            }
            snprintf(lines[n_lines++], sizeof lines[0], "split %-15s [%5d, %5d] M %2d: lib cfg %d x %d S %d %.1f us; best cfg %d x %d S %d %.1f us (%.0f GB/s)",
                     sh.name, sh.N, sh.K, M, kTR[lib_cfg], kD[lib_cfg], lib_s, lib, kTR[best_cfg], kD[best_cfg], best_s, best,
                     r.wbytes / (best * 1e-6) / 1e9);
            CK(cudaFree(x));
            CK(cudaFree(r.y));
        }
        CK(cudaFree(w));
    }
    bench_emit(out, "\n");
    for (int i = 0; i < n_lines; i++) bench_emit(out, "%s\n", lines[i]);
    CK(cudaStreamDestroy(st));
    if (out) fclose(out);
    return 0;
}
