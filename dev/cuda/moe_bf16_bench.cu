/* The routed experts of one MoE layer on bf16 weights at decode and verify sizes: the library's
 * grouped tensor-core kernels (kdt_moe_bf16, src/model/cuda/moe_bf16.cu, compiled into this file so
 * that other shapes of each product can be launched: "gate/up A/U/P/W", "down A/U/P/W": tiles a warp,
 * ring depth, L2 prefetch bytes, warps a block; "library": moe_bf16.cu's GateUp1 / GateUp2, Down1 / Down2) beside moe.cu's
 * CUDA-core kernels (kdt_mk_moe_small) and cuBLAS GEMMs per expert
 * sized on the host (what the forward runs above MOE_LARGE_ROWS_PER_EXPERT without the grouped
 * kernels; the gather and SiLU . mul launches between them are left out, as is the host wait for the
 * counts), at the bench models' layout: 16 experts of 7168 x 2048, top 8. Shapes: decode (1 row, 8
 * experts), 1, 4, 8, 16 rows on each of the 16 experts (R = 2, 8, 16, 32, each row's 8 experts
 * consecutive), a verify tree's 17 rows routed uniformly at random, and decode and verify with a
 * shared expert of the same width (the forward's fold: one more slot of R rows). Per variant the time of
 * gate/up, of down and of both (CUDA events, median of --reps after 2 warm-ups; moe_small's two
 * launches are one call, so its split is not seen), the weight bytes read (active experts) over the
 * time, against the device-copy ceiling measured in the same run; and its output (act or ye) against
 * the library's (max |d| over max |ref|: 0 is the same bits).
 *
 *   make BUILD=build build/dev/moe_bf16_bench   (sm_90a; links build/libkdt.a)
 *   build/dev/moe_bf16_bench [--out FILE] [--reps 20] */
#include <math.h>

#include <cublas_v2.h>

#include "../../bench/bench_common.h"
#include "model/cuda.h"
#include "model/cuda/kernels.h"
#include "model/cuda/linear.h"
#include "model/cuda/moe_bf16.cu"

namespace {

constexpr int kHid = 7168, kInter = 2048, kE = 16, kTopk = 8, kMaxR = 32;
FILE *g_out;
int g_reps = 20;

struct Shape {
    const char *name;
    int R;
    bool even;   /* row r's experts r K .. r K + K - 1 (mod E), else uniform at random */
    bool shared; /* and a shared expert of the same width over every row, as the forward folds it in */
};

/* The grouping of a shape's routing (kdt_mk_moe_plan's): host counts and offsets, device counts, offs, perm. */
struct Plan {
    int counts[kE], offs[kE], active; /* active: experts with rows, the shared one counted */
    bool shared;
    int32_t *d;
};

Plan make_plan(const Shape &sh, uint64_t seed) {
    Plan P = {};
    P.shared = sh.shared, P.active = sh.shared;
    int idx[kMaxR * kTopk], perm[kMaxR * kTopk];
    for (int r = 0; r < sh.R; r++)
        for (int k = 0; k < kTopk; k++) {
            bool dup;
            do {
                idx[r * kTopk + k] = sh.even ? (r * kTopk + k) % kE : (int)(bench_splitmix64(&seed) % kE);
                dup = false;
                for (int j = 0; j < k; j++) dup |= idx[r * kTopk + j] == idx[r * kTopk + k];
            } while (dup);
            P.counts[idx[r * kTopk + k]]++;
        }
    for (int e = 0, o = 0; e < kE; o += P.counts[e], e++) P.offs[e] = o, P.active += P.counts[e] > 0;
    for (int e = 0, q = 0; e < kE; e++)
        for (int a = 0; a < sh.R * kTopk; a++)
            if (idx[a] == e) perm[q++] = a;
    CK(cudaMalloc(&P.d, (2 * kE + kMaxR * kTopk) * sizeof(int32_t)));
    CK(cudaMemcpy(P.d, P.counts, kE * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(P.d + kE, P.offs, kE * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(P.d + 2 * kE, perm, (size_t)sh.R * kTopk * 4, cudaMemcpyHostToDevice));
    return P;
}

struct Bufs {
    bf16 *gu, *dn, *sgu, *sdn, *x, *xe, *act; /* sgu [2I, hid], sdn [hid, I]: the shared expert */
    float *gu_out, *ye;
    cublasHandle_t h;
};

/* A variant: gate/up then down, the event mid between them (none: one call). */
typedef void (*Variant)(const Bufs &, const Plan &, int, cudaStream_t, cudaEvent_t mid);

void run_lib(const Bufs &b, const Plan &P, int R, cudaStream_t s, cudaEvent_t mid) {
    KCK(product<true>(GateUp1{}, GateUp2{}, R, b.x, P.d + 2 * kE, kTopk, P.d, P.d + kE, b.gu, P.shared ? b.sgu : nullptr, kE, kHid, kInter,
                      b.act, s));
    CK(cudaEventRecord(mid, s));
    KCK(product<false>(Down1{}, Down2{}, R, b.act, P.d + 2 * kE, kTopk, P.d, P.d + kE, b.dn, P.shared ? b.sdn : nullptr, kE, kInter, kHid, b.ye, s));
}
template <class C>
void run_gu(const Bufs &b, const Plan &P, int R, cudaStream_t s, cudaEvent_t mid) {
    KCK(product<true>(C{}, R, b.x, P.d + 2 * kE, kTopk, P.d, P.d + kE, b.gu, P.shared ? b.sgu : nullptr, kE, kHid, kInter, b.act, s));
    CK(cudaEventRecord(mid, s));
}
template <class C>
void run_dn(const Bufs &b, const Plan &P, int R, cudaStream_t s, cudaEvent_t mid) {
    CK(cudaEventRecord(mid, s));
    KCK(product<false>(C{}, R, b.act, P.d + 2 * kE, kTopk, P.d, P.d + kE, b.dn, P.shared ? b.sdn : nullptr, kE, kInter, kHid, b.ye, s));
}
void run_small(const Bufs &b, const Plan &P, int R, cudaStream_t s, cudaEvent_t mid) {
    CK(cudaEventRecord(mid, s));
    KCK(kdt_mk_moe_small(R, b.x, P.d + 2 * kE, kTopk, P.d, P.d + kE, b.gu, b.dn, P.shared ? b.sgu : nullptr, P.shared ? b.sdn : nullptr, kE,
                         kHid, kInter, b.act, b.ye, KDT_BF16, s));
}
/* Per expert: gate/up [c, 2I] f32 = xe . gu_e^T, down ye [c, hid] = act . dn_e^T; the shared expert (e = kE)
 * over the R rows of x after the routed ones. */
void run_cublas(const Bufs &b, const Plan &P, int R, cudaStream_t s, cudaEvent_t mid) {
    const int RK = R * kTopk;
    for (int e = 0; e <= kE; e++) {
        const bool sh = e == kE;
        const int c = sh ? (P.shared ? R : 0) : P.counts[e], off = sh ? RK : P.offs[e];
        if (c)
            KCK(kdt_lin_gemm(b.h, c, 2 * kInter, kHid, sh ? b.sgu : b.gu + (size_t)e * 2 * kInter * kHid, CUDA_R_16BF, kHid,
                             sh ? b.x : b.xe + (size_t)off * kHid, CUDA_R_16BF, kHid, b.gu_out + (size_t)off * 2 * kInter, CUDA_R_32F,
                             2 * kInter, 0.f));
    }
    CK(cudaEventRecord(mid, s));
    for (int e = 0; e <= kE; e++) {
        const bool sh = e == kE;
        const int c = sh ? (P.shared ? R : 0) : P.counts[e], off = sh ? RK : P.offs[e];
        if (c)
            KCK(kdt_lin_gemm(b.h, c, kHid, kInter, sh ? b.sdn : b.dn + (size_t)e * kHid * kInter, CUDA_R_16BF, kInter,
                             b.act + (size_t)off * kInter, CUDA_R_16BF, kInter, b.ye + (size_t)off * kHid, CUDA_R_32F, kHid, 0.f));
    }
}

/* Median times (us) of v: gate/up, down, both; act and ye left as v's last run wrote them. */
void time_variant(Variant v, const Bufs &b, const Plan &P, int R, cudaStream_t s, double us[3]) {
    cudaEvent_t e0, e1, e2;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventCreate(&e2));
    float t[3][256];
    const int n = g_reps < 256 ? g_reps : 256;
    for (int i = -2; i < n; i++) {
        CK(cudaEventRecord(e0, s));
        v(b, P, R, s, e1);
        CK(cudaEventRecord(e2, s));
        CK(cudaEventSynchronize(e2));
        if (i < 0) continue;
        CK(cudaEventElapsedTime(&t[0][i], e0, e1));
        CK(cudaEventElapsedTime(&t[1][i], e1, e2));
        CK(cudaEventElapsedTime(&t[2][i], e0, e2));
    }
    for (int k = 0; k < 3; k++) us[k] = bench_median(t[k], n) * 1e3;
    for (cudaEvent_t e : {e0, e1, e2}) CK(cudaEventDestroy(e));
}

/* max |a - b| over max |b| of n values (f32 or bf16) on the device. */
template <typename T>
double rel_diff(const T *a, const T *b, size_t n) {
    T *ha = (T *)malloc(n * sizeof(T)), *hb = (T *)malloc(n * sizeof(T));
    CK(cudaMemcpy(ha, a, n * sizeof(T), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb, b, n * sizeof(T), cudaMemcpyDeviceToHost));
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        const double x = (float)ha[i], y = (float)hb[i];
        d = fmax(d, fabs(x - y)), m = fmax(m, fabs(y));
    }
    free(ha), free(hb);
    return m > 0 ? d / m : d;
}

} // namespace

int main(int argc, char **argv) {
    const char *out_path = nullptr;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out_path = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) g_reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: moe_bf16_bench [--out FILE] [--reps 20]\n");
            return 2;
        }
    }
    if (g_reps < 1) g_reps = 1;
    g_out = out_path ? fopen(out_path, "w") : nullptr;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    bench_report_header(g_out, "Routed bf16 experts of one MoE layer: grouped tensor-core kernels, moe_small, cuBLAS per expert", &prop, argc,
                        argv);
    const double copy_bw = bench_copy_bw();
    bench_emit(g_out, "- copy ceiling (1 GiB device to device, read + written bytes): %.0f GB/s\n\n", copy_bw / 1e9);
    bench_emit(g_out, "| shape | R | rows/expert | variant | gate/up us | down us | us | experts | GB | GB/s | of copy | vs library |\n"
                      "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    Bufs b;
    const size_t gu_n = (size_t)kE * 2 * kInter * kHid, dn_n = (size_t)kE * kHid * kInter, places = (size_t)kMaxR * (kTopk + 1);
    CK(cudaMalloc(&b.gu, gu_n * 2));
    CK(cudaMalloc(&b.dn, dn_n * 2));
    CK(cudaMalloc(&b.sgu, gu_n / kE * 2));
    CK(cudaMalloc(&b.sdn, dn_n / kE * 2));
    CK(cudaMalloc(&b.x, (size_t)kMaxR * kHid * 2));
    CK(cudaMalloc(&b.xe, places * kHid * 2));
    CK(cudaMalloc(&b.act, places * kInter * 2));
    CK(cudaMalloc(&b.gu_out, places * 2 * kInter * 4));
    float *ye_ref;
    bf16 *act_ref;
    CK(cudaMalloc(&b.ye, places * kHid * 4));
    CK(cudaMalloc(&ye_ref, places * kHid * 4));
    CK(cudaMalloc(&act_ref, places * kInter * 2));
    KCK(kdt_cuda_fill_uniform(b.gu, KDT_BF16, gu_n, 11, 0.f, 1.f / sqrtf((float)kHid)));
    KCK(kdt_cuda_fill_uniform(b.dn, KDT_BF16, dn_n, 23, 0.f, 1.f / sqrtf((float)kInter)));
    KCK(kdt_cuda_fill_uniform(b.sgu, KDT_BF16, gu_n / kE, 29, 0.f, 1.f / sqrtf((float)kHid)));
    KCK(kdt_cuda_fill_uniform(b.sdn, KDT_BF16, dn_n / kE, 31, 0.f, 1.f / sqrtf((float)kInter)));
    KCK(kdt_cuda_fill_uniform(b.x, KDT_BF16, (size_t)kMaxR * kHid, 5, 0.f, 1.f));
    KCK(kdt_cuda_fill_uniform(b.xe, KDT_BF16, places * kHid, 7, 0.f, 1.f));
    CK(cudaDeviceSynchronize());
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cublasCreate(&b.h) == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown);
    CK(cublasSetStream(b.h, s) == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown);

    const Shape shapes[] = {{"decode", 1, false, false}, {"even", 2, true, false},   {"even", 8, true, false},         {"even", 16, true, false},
                            {"verify", 17, false, false}, {"even", 32, true, false}, {"decode+shared", 1, false, true}, {"verify+shared", 17, false, true}};
    /* part: 0 both products, 1 gate/up alone, 2 down alone (on the library's act) */
    const struct {
        const char *name;
        Variant v;
        int part;
    } variants[] = {{"library", run_lib, 0},
                    {"moe_small", run_small, 0},
                    {"cublas", run_cublas, 0},
                    {"gate/up 2/3/256/4 (mid run's)", run_gu<Cfg<2, 3, 256, 4>>, 1},
                    {"gate/up 2/2/256/4", run_gu<Cfg<2, 2, 256, 4>>, 1},
                    {"gate/up 2/2/256/1", run_gu<Cfg<2, 2, 256, 1>>, 1},
                    {"gate/up 2/3/256/1", run_gu<Cfg<2, 3, 256, 1>>, 1},
                    {"gate/up 2/3/256/2", run_gu<Cfg<2, 3, 256, 2>>, 1},
                    {"gate/up 2/3/0/1", run_gu<Cfg<2, 3, 0, 1>>, 1},
                    {"gate/up 2/3/128/1", run_gu<Cfg<2, 3, 128, 1>>, 1},
                    {"down 2/3/256/4 (mid run's)", run_dn<Cfg<2, 3, 256, 4>>, 2},
                    {"down 1/3/256/4", run_dn<Cfg<1, 3, 256, 4>>, 2},
                    {"down 1/3/256/1", run_dn<Cfg<1, 3, 256, 1>>, 2},
                    {"down 1/3/256/2", run_dn<Cfg<1, 3, 256, 2>>, 2},
                    {"down 2/3/256/1", run_dn<Cfg<2, 3, 256, 1>>, 2},
                    {"down 1/4/256/1", run_dn<Cfg<1, 4, 256, 1>>, 2},
                    {"down 1/3/0/1", run_dn<Cfg<1, 3, 0, 1>>, 2}};
    const double gu_bytes = 2.0 * kHid * kInter * 2, dn_bytes = 1.0 * kHid * kInter * 2;
    for (const Shape &sh : shapes) {
        const Plan P = make_plan(sh, 0x5eed + sh.R);
        const size_t places_n = (size_t)sh.R * (kTopk + (sh.shared ? 1 : 0)), act_n = places_n * kInter, ye_n = places_n * kHid;
        for (const auto &v : variants) {
            if (v.part == 2) CK(cudaMemcpy(b.act, act_ref, act_n * 2, cudaMemcpyDeviceToDevice));
            double us[3];
            time_variant(v.v, b, P, sh.R, s, us);
            if (v.v == run_lib) {
                CK(cudaMemcpy(act_ref, b.act, act_n * 2, cudaMemcpyDeviceToDevice));
                CK(cudaMemcpy(ye_ref, b.ye, ye_n * 4, cudaMemcpyDeviceToDevice));
            }
            const double bytes = P.active * (v.part == 1 ? gu_bytes : v.part == 2 ? dn_bytes : gu_bytes + dn_bytes);
            const double t = us[v.part == 1 ? 0 : v.part == 2 ? 1 : 2], gbs = bytes / (t * 1e-6) / 1e9;
            char d[32] = "-", tg[32] = "-", td[32] = "-";
            if (v.v == run_small) snprintf(d, sizeof d, "ye %.1e", rel_diff(b.ye, ye_ref, ye_n));
            else if (v.part == 1) snprintf(d, sizeof d, "act %.1e", rel_diff(b.act, act_ref, act_n));
            else if (v.part == 2) snprintf(d, sizeof d, "ye %.1e", rel_diff(b.ye, ye_ref, ye_n));
            if (v.part != 2 && v.v != run_small) snprintf(tg, sizeof tg, "%.1f", us[0]);
            if (v.part != 1 && v.v != run_small) snprintf(td, sizeof td, "%.1f", us[1]);
            bench_emit(g_out, "| %s | %d | %.1f | %s | %s | %s | %.1f | %d | %.3f | %.0f | %.0f%% | %s |\n", sh.name, sh.R,
                       (double)sh.R * kTopk / kE, v.name, tg, td, t, P.active, bytes / 1e9, gbs, 100 * gbs * 1e9 / copy_bw, d);
        }
        CK(cudaFree(P.d));
    }
    if (g_out) fclose(g_out);
    return 0;
}
