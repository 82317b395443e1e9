/* The routed experts of one MoE layer at decode, quantized, experiment: the library's grouped
 * tensor-core kernels (src/model/cuda/moe_quant.cu, compiled into this file so that other splits
 * and depths can be launched) beside main's device MoE (moe.cuh's CUDA-core kernel with its
 * quantized reader), at Kimi K2.6's layout (384 experts of 2048 x 7168, top 8, INT4 groups of 32)
 * and DeepSeek-V3's (256 experts, FP8 128x128 blocks), R = 1, 8, 32 rows routed uniformly at random
 * (8 routings, one per repetition in turn, so the experts of one run are not in L2 from the last).
 * Per variant: gate/up and down times (CUDA events, median of --reps), the active experts' weight
 * and scale bytes over the total time, against the device-copy ceiling measured in the same run;
 * and the variant's ye against main's kernel's (max |d| over max |ye|, on the first routing).
 *
 *   make BUILD=build build/dev/moe_quant_bench   (sm_90a; links build/libkdt.a)
 *   build/dev/moe_quant_bench [--out FILE] [--reps 24] [--only int4|fp8]
 *
 * Variants: "bits, split S/D, B bytes": moe_quant.cu's variant bits (direct: kDirect, INT4's lanes load the
 * transposed words; packed: kPacked, the same experts repacked by kdt_moe_quant_int4_pack into moe_quant.h's
 * packed layout, as the loader holds them; down2: kDown2, down's warps own 32 columns),
 * S (D) warps of a block split gate/up's (down's) K, each lane keeps B bytes of weights in flight beside the
 * step it computes; "lib" is what kdt_moe_quant launches on the checkpoint's layout, "lib, packed" on the
 * packed one (one event around both launches: its gate/up column is 0). */
#include <math.h>

#include <algorithm>

#include "../../bench/bench_common.h"
#include "model/cuda.h"
#include "model/cuda/moe_quant.cu"

namespace {

constexpr int kHid = 7168, kInter = 2048, kTopk = 8, kPlans = 8, kMaxR = 32;
FILE *g_out;
int g_reps = 24;

struct Layer {
    bool int4;
    int E;
    kdt_dlin gu, dn;
    kdt_dlin gu_p, dn_p; /* INT4: the same experts in the packed layout (kdt_moe_quant_int4_pack) */
    double expert_bytes; /* codes + scales of one expert's gate, up and down */
};

/* Quantized codes and scales of E matrices [rows, cols] on the device (random codes, scales ~0.01). */
void fill_part(bool int4, int E, int rows, int cols, void **w, void **s, uint64_t seed) {
    const size_t codes = (size_t)E * rows * (int4 ? cols / 2 : cols);
    const size_t sn = int4 ? (size_t)E * rows * (cols / 32) : (size_t)E * ((rows + 127) / 128) * ((cols + 127) / 128);
    CK(cudaMalloc(w, codes));
    CK(cudaMalloc(s, sn * (int4 ? 2 : 4)));
    KCK(kdt_cuda_fill_codes(*w, codes, seed, int4 ? 0xFF : 0x77)); /* fp8: no NaN codes */
    KCK(kdt_cuda_fill_uniform(*s, int4 ? KDT_BF16 : KDT_F32, sn, seed + 1, 0.01f, 0.005f));
}

Layer make_layer(bool int4, int E) {
    Layer L = {};
    L.int4 = int4, L.E = E;
    const kdt_wfmt f = int4 ? KDT_WFMT_INT4 : KDT_WFMT_FP8;
    L.gu = {f, 2 * kInter, kHid, E, 2, kInter, {}, {}};
    L.dn = {f, kHid, kInter, E, 1, kHid, {}, {}};
    fill_part(int4, E, kInter, kHid, &L.gu.w[0], &L.gu.scale[0], 11);
    fill_part(int4, E, kInter, kHid, &L.gu.w[1], &L.gu.scale[1], 23);
    fill_part(int4, E, kHid, kInter, &L.dn.w[0], &L.dn.scale[0], 37);
    if (int4) {
        L.gu_p = L.gu, L.dn_p = L.dn;
        for (kdt_dlin *d : {&L.gu_p, &L.dn_p}) {
            d->packed = 1;
            const kdt_dlin &o = d == &L.gu_p ? L.gu : L.dn;
            for (int p = 0; p < d->parts; p++) {
                const int64_t rows = (int64_t)E * kdt_dlin_rows(d, p);
                CK(cudaMalloc(&d->w[p], rows * d->K / 2));
                CK(cudaMalloc(&d->scale[p], rows * (d->K / 32) * 2));
                KCK(kdt_moe_quant_int4_pack(d->w[p], d->scale[p], o.w[p], o.scale[p], rows, d->K, 0));
            }
        }
        CK(cudaDeviceSynchronize());
    }
    const double per = (double)kInter * kHid;
    L.expert_bytes = 3 * per * (int4 ? 0.5 + 2.0 / 32 : 1.0 + 4.0 / (128 * 128));
    return L;
}

void free_layer(Layer &L) {
    for (const kdt_dlin *d : {&L.gu, &L.dn, &L.gu_p, &L.dn_p})
        for (void *p : {d->w[0], d->w[1], d->scale[0], d->scale[1]}) CK(cudaFree(p)); /* cudaFree(NULL): no-op */
}

/* kPlans routings of R rows (k distinct experts each, uniform): counts [E], offs [E], perm [R k]
 * per plan on the device; the active experts per plan. */
struct Plans {
    int32_t *d;   /* plan i at d + i * (2 E + kMaxR kTopk) */
    int active[kPlans];
    int E;
    int32_t *counts(int i) const { return d + (size_t)i * (2 * E + kMaxR * kTopk); }
};

Plans make_plans(int E, int R, uint64_t seed) {
    Plans P = {};
    P.E = E;
    const size_t per = 2 * (size_t)E + kMaxR * kTopk;
    int32_t *h = (int32_t *)calloc(per * kPlans, sizeof(int32_t));
    int idx[kMaxR * kTopk];
    for (int i = 0; i < kPlans; i++) {
        int32_t *c = h + i * per, *o = c + E, *pm = o + E;
        for (int r = 0; r < R; r++)
            for (int k = 0; k < kTopk; k++) {
                bool dup;
                do {
                    idx[r * kTopk + k] = (int)(bench_splitmix64(&seed) % (uint64_t)E);
                    dup = false;
                    for (int j = 0; j < k; j++) dup |= idx[r * kTopk + j] == idx[r * kTopk + k];
                } while (dup);
                c[idx[r * kTopk + k]]++;
            }
        for (int e = 0, acc = 0; e < E; acc += c[e], e++) o[e] = acc, P.active[i] += c[e] > 0;
        for (int e = 0, p = 0; e < E; e++)
            for (int a = 0; a < R * kTopk; a++)
                if (idx[a] == e) pm[p++] = a;
    }
    CK(cudaMalloc(&P.d, per * kPlans * sizeof(int32_t)));
    CK(cudaMemcpy(P.d, h, per * kPlans * sizeof(int32_t), cudaMemcpyHostToDevice));
    free(h);
    return P;
}

struct Bufs {
    bf16 *x, *act;
    float *ye;
};

typedef void (*VariantFn)(const Layer &, const Plans &, int plan, int R, const Bufs &, cudaStream_t, cudaEvent_t mid);

/* main's device MoE: moe.cu's launch() on moe.cuh's kernel with the quantized reader. */
template <bool kInt4, int kRows>
void run_base(const Layer &L, const Plans &P, int plan, int R, const Bufs &b, cudaStream_t s, cudaEvent_t mid) {
    const int32_t *c = P.counts(plan), *o = c + L.E, *pm = o + L.E;
    const unsigned z = (unsigned)((R + kSliceRows - 1) / kSliceRows);
    const int gu_cols = kWarps * kW / 2, dn_cols = kWarps * kW;
    moe_small_kernel<bf16, true, kRows><<<dim3(kInter / gu_cols, L.E, z), kThreads, 0, s>>>(b.x, pm, kTopk, c, o, wquant<kInt4>(&L.gu), kHid,
                                                                                        kInter, b.act, 0, false);
    CK(cudaEventRecord(mid, s));
    moe_small_kernel<bf16, false, kRows><<<dim3(kHid / dn_cols, L.E, z), kThreads, 0, s>>>(b.act, pm, kTopk, c, o, wquant<kInt4>(&L.dn), kInter,
                                                                                       kHid, b.ye, 0, false);
}
template <bool kInt4>
void run_base_rows(const Layer &L, const Plans &P, int plan, int R, const Bufs &b, cudaStream_t s, cudaEvent_t mid) {
    if (R <= 1) run_base<kInt4, 1>(L, P, plan, R, b, s, mid);
    else if (R <= 4) run_base<kInt4, 4>(L, P, plan, R, b, s, mid);
    else run_base<kInt4, kMaxRows>(L, P, plan, R, b, s, mid);
}

/* A grouped variant: launch()'s two kernels with the event between them. */
template <bool kInt4, int kSplitGU, int kSplitDown, int kLaneBytes, int kV>
void run_grouped(const Layer &L, const Plans &P, int plan, int R, const Bufs &b, cudaStream_t s, cudaEvent_t mid) {
    const int32_t *c = P.counts(plan), *o = c + L.E, *pm = o + L.E;
    const unsigned slots = (unsigned)std::min(R * kTopk, L.E);
    const int gu_cols = kQWarps / kSplitGU * kQCols, dn_cols = kQWarps / kSplitDown * warp_cols<false, kV>();
    auto gu = moe_quant_kernel<kInt4, true, kSplitGU, kLaneBytes, (kV & ~kDown2)>;
    auto dn = moe_quant_kernel<kInt4, false, kSplitDown, kLaneBytes, kV>;
    const kdt_dlin &wgu = kV & kPacked ? L.gu_p : L.gu, &wdn = kV & kPacked ? L.dn_p : L.dn;
    gu<<<dim3((kInter + gu_cols - 1) / gu_cols, slots), 32 * kQWarps, 0, s>>>(b.x, pm, kTopk, c, o, L.E, wquant<kInt4>(&wgu), kHid, kInter,
                                                                                b.act);
    CK(cudaEventRecord(mid, s));
    dn<<<dim3((kHid + dn_cols - 1) / dn_cols, slots), 32 * kQWarps, 0, s>>>(b.act, nullptr, kTopk, c, o, L.E, wquant<kInt4>(&wdn), kInter,
                                                                              kHid, b.ye);
}
template <bool kPk> /* the packed layout, or the checkpoint's */
void run_lib(const Layer &L, const Plans &P, int plan, int R, const Bufs &b, cudaStream_t s, cudaEvent_t mid) {
    const int32_t *c = P.counts(plan);
    CK(cudaEventRecord(mid, s)); /* one call: the split is not seen */
    KCK(kdt_moe_quant(R, b.x, c + 2 * L.E, kTopk, c, c + L.E, kPk ? &L.gu_p : &L.gu, kPk ? &L.dn_p : &L.dn, kHid, kInter, b.act, b.ye, s));
}

void time_variant(const char *name, VariantFn fn, const Layer &L, const Plans &P, int R, const Bufs &b, const float *ye_base,
                  double copy_bw, cudaStream_t s) {
    cudaEvent_t e0, e1, e2;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventCreate(&e2));
    const size_t ye_n = (size_t)R * kTopk * kHid;
    CK(cudaMemset(b.ye, 0xFF, ye_n * 4));
    fn(L, P, 0, R, b, s, e1);
    CK(cudaStreamSynchronize(s));
    float *ye = (float *)malloc(ye_n * 4);
    CK(cudaMemcpy(ye, b.ye, ye_n * 4, cudaMemcpyDeviceToHost));
    double dmax = 0, ymax = 0;
    for (size_t i = 0; i < ye_n; i++) {
        const double d = fabs((double)ye[i] - ye_base[i]);
        dmax = d == d ? fmax(dmax, d) : INFINITY;
        ymax = fmax(ymax, fabs((double)ye_base[i]));
    }
    free(ye);
    float *tg = (float *)malloc(g_reps * sizeof(float)), *td = (float *)malloc(g_reps * sizeof(float));
    float *tt = (float *)malloc(g_reps * sizeof(float));
    double bytes = 0;
    for (int i = 0; i < g_reps + 2; i++) {
        const int plan = (i + 1) % kPlans;
        CK(cudaEventRecord(e0, s));
        fn(L, P, plan, R, b, s, e1);
        CK(cudaEventRecord(e2, s));
        CK(cudaEventSynchronize(e2));
        if (i < 2) continue; /* warm-up */
        CK(cudaEventElapsedTime(&tg[i - 2], e0, e1));
        CK(cudaEventElapsedTime(&td[i - 2], e1, e2));
        CK(cudaEventElapsedTime(&tt[i - 2], e0, e2));
        bytes += P.active[plan] * L.expert_bytes;
    }
    bytes /= g_reps;
    const double us = bench_median(tt, g_reps) * 1e3, gbs = bytes / (us * 1e-6) / 1e9;
    bench_emit(g_out, "| %s | %d | %s | %.1f | %.1f | %.1f | %.0f | %.3f | %.1f | %.0f | %.0f%% | %.1e |\n", L.int4 ? "int4" : "fp8", R, name,
               bench_median(tg, g_reps) * 1e3, bench_median(td, g_reps) * 1e3, us, bytes / L.expert_bytes, bytes / 1e9,
               bytes / copy_bw * 1e6, gbs, 100 * gbs * 1e9 / copy_bw, ymax > 0 ? dmax / ymax : dmax);
    free(tg), free(td), free(tt);
    for (cudaEvent_t e : {e0, e1, e2}) CK(cudaEventDestroy(e));
}

template <bool kInt4>
void run_format(int E, double copy_bw, const Bufs &b, cudaStream_t s) {
    Layer L = make_layer(kInt4, E);
    for (int R : {1, 8, 32}) {
        Plans P = make_plans(E, R, 1000 + R);
        const size_t ye_n = (size_t)R * kTopk * kHid;
        float *ye_base = (float *)malloc(ye_n * 4);
        cudaEvent_t mid;
        CK(cudaEventCreate(&mid));
        CK(cudaMemset(b.ye, 0xFF, ye_n * 4));
        run_base_rows<kInt4>(L, P, 0, R, b, s, mid);
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(ye_base, b.ye, ye_n * 4, cudaMemcpyDeviceToHost));
        CK(cudaEventDestroy(mid));
        time_variant("main (moe_small, CUDA cores)", run_base_rows<kInt4>, L, P, R, b, ye_base, copy_bw, s);
        time_variant("lib", run_lib<false>, L, P, R, b, ye_base, copy_bw, s);
        /* moe_quant.cu's variant bits (kDirect 2, kDown2 8, kPacked 32); the library: INT4 kDirect, split 2/1, 64 B on the
         * checkpoint's layout, kPacked | kDown2, split 2/1 (R = 1) or 1/1, 64 B on the packed one; FP8 kDown2, split 1/1, 128 B */
        if constexpr (kInt4) {
            time_variant("lib, packed", run_lib<true>, L, P, R, b, ye_base, copy_bw, s);
            time_variant("packed, split 2/1, 64 B", run_grouped<kInt4, 2, 1, 64, kPacked>, L, P, R, b, ye_base, copy_bw, s);
            time_variant("packed + down2, split 2/1, 64 B", run_grouped<kInt4, 2, 1, 64, kPacked | kDown2>, L, P, R, b, ye_base, copy_bw, s);
            time_variant("packed, split 1/1, 64 B", run_grouped<kInt4, 1, 1, 64, kPacked>, L, P, R, b, ye_base, copy_bw, s);
            time_variant("packed + down2, split 1/1, 64 B", run_grouped<kInt4, 1, 1, 64, kPacked | kDown2>, L, P, R, b, ye_base, copy_bw, s);
        } else {
            time_variant("down2, split 1/1, 128 B (lib)", run_grouped<kInt4, 1, 1, 128, kDown2>, L, P, R, b, ye_base, copy_bw, s);
        }
        free(ye_base);
        CK(cudaFree(P.d));
    }
    free_layer(L);
}

} // namespace

int main(int argc, char **argv) {
    const char *out_path = NULL, *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out_path = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) g_reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else {
            fprintf(stderr, "usage: moe_quant_bench [--out FILE] [--reps 24] [--only int4|fp8]\n");
            return 2;
        }
    }
    if (g_reps < 1 || g_reps > 10000) return fprintf(stderr, "moe_quant_bench: --reps 1 .. 10000\n"), 2;
    if (bench_open("moe_quant_bench", out_path, &g_out)) return 1;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    bench_report_header(g_out, "Routed experts of one MoE layer at decode, quantized: grouped kernels against main's", &prop, argc, argv);
    const double copy_bw = bench_copy_bw();
    bench_emit(g_out, "- copy ceiling (1 GiB device to device, read + written bytes): %.0f GB/s\n\n", copy_bw / 1e9);
    bench_emit(g_out, "| format | R | variant | gate/up us | down us | total us | experts | GB | floor us | GB/s | of copy | ye vs main |\n"
                      "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    Bufs b;
    CK(cudaMalloc(&b.x, (size_t)kMaxR * kHid * 2));
    CK(cudaMalloc(&b.act, (size_t)kMaxR * kTopk * kInter * 2));
    CK(cudaMalloc(&b.ye, (size_t)kMaxR * kTopk * kHid * 4));
    KCK(kdt_cuda_fill_uniform(b.x, KDT_BF16, (size_t)kMaxR * kHid, 5, 0.f, 1.f));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    if (!only || !strcmp(only, "int4")) run_format<true>(384, copy_bw, b, s);
    if (!only || !strcmp(only, "fp8")) run_format<false>(256, copy_bw, b, s);
    for (void *p : {(void *)b.x, (void *)b.act, (void *)b.ye}) CK(cudaFree(p));
    if (g_out) fclose(g_out);
    return 0;
}
