/* The weight-streaming GEMMs at Kimi K2's shapes (docs/perf/quant.md). For each weight [N, K], format
 * (bf16, FP8 128x128 blocks, INT4 groups of 32) and M = 1, 8, 16, 32 rows of x: the streaming kernel
 * (kdt_sgemm, src/cuda/stream_gemm.cu; its cfg as picked, and each forced cfg as experiments) beside the
 * old path in the same run: quant_gemm's streaming kernel (kdt_qgemm_with, STREAM) for FP8 / INT4, cuBLAS
 * for bf16; and cuBLAS on a bf16 copy of the weights for every format. GB/s counts the weights and their
 * scales once per launch, against the device-copy ceiling measured in the same run (cudaMemcpy device to
 * device of 1 GiB, read + written bytes over time; a read-only kernel's GB/s is printed beside it). Every
 * kernel is timed as a CUDA graph of 24 launches (as the forward replays them), median of batches; every
 * launch reads another copy of the weights (more than 256 MiB in all), so L2 never holds them. The last
 * line sums the table up per format: mean share of the ceiling and rows at >= 75%, over the large shapes
 * (dense gate/up, dense down, o) and over all. --prefill adds M = 128 and 512 (quant_gemm's baseline,
 * the dequantize + cuBLAS prefill path) and the dequantize kernels alone. --profile runs one kdt_sgemm
 * launch a format (int4 also with cfg 4) and quant_gemm's streaming kernel on fp8 and int4, at M = 1
 * on the dense gate/up weight [18432, 7168], and nothing else, for ncu.
 *
 * --gemv runs only the forward's bf16 projections at Kimi's dims (gemv_bench, below).
 *
 *   build/bench/bench_quant_gemm [--out FILE.md] [--quick] [--prefill] [--gemv] | --profile
 */
#include <string.h>

#include <cublas_v2.h>

#include "bench_common.h"
#include "cuda/quant_gemm.h"
#include "cuda/quant_gemm_variant.h"
#include "cuda/stream_gemm.h"

namespace {

struct Shape { const char *name; int N, K; };
const Shape kShapes[] = {
    {"expert gate/up", 2048, 7168}, {"expert down", 7168, 2048}, {"dense gate/up", 18432, 7168},
    {"dense down", 7168, 18432},    {"q_a", 1536, 7168},         {"q_b", 12288, 1536},
    {"kv_a", 576, 7168},            {"kv_b", 16384, 512},        {"o", 7168, 8192},
};
const int kDecodeM[] = {1, 8, 16, 32}, kPrefillM[] = {128, 512};
const char *const kFmtName[] = {"bf16", "fp8 128x128", "int4 g32"};

#define BCK(call)                                                                 \
    do {                                                                          \
        cublasStatus_t b_ = (call);                                               \
        if (b_ != CUBLAS_STATUS_SUCCESS) {                                        \
            fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #call, (int)b_); \
            exit(1);                                                              \
        }                                                                         \
    } while (0)

struct Ctx {
    int fmt, M, N, K, copies, next, cfg;
    unsigned flags;            /* kdt_sgemm's flags (KDT_SGEMM_PDL, KDT_SGEMM_GLU) */
    kdt_qgemm_kernel kernel;
    size_t wbytes, sbytes;
    unsigned char *w, *s;      /* copies of the weights (in fmt) and scales, back to back */
    void *x, *bf, *wbf;        /* x [M, K] bf16; bf16 scratch [N, K]; bf16 weights, copies back to back */
    int bf_copies;
    float *y;
    cublasHandle_t blas;
};

const void *wcopy(Ctx *c, const void **s) {
    const int i = c->next++ % c->copies;
    *s = c->s + (size_t)i * c->sbytes;
    return c->w + (size_t)i * c->wbytes;
}

void run_sgemm(void *p, cudaStream_t st) {
    Ctx *c = (Ctx *)p;
    const void *s, *w = wcopy(c, &s);
    KCK(kdt_sgemm_cfg(c->cfg, (kdt_sgemm_fmt)c->fmt, c->x, w, c->fmt ? s : NULL, c->y, c->M, c->N, c->K, c->flags, st));
}

void run_qgemm(void *p, cudaStream_t st) {
    Ctx *c = (Ctx *)p;
    const void *s, *w = wcopy(c, &s);
    KCK(kdt_qgemm_with(c->kernel, c->fmt == KDT_SGEMM_INT4, c->x, w, s, c->y, c->M, c->N, c->K, st));
}

/* y^T [N, M] = W [N, K] x^T, column-major for cuBLAS: y [M, N] row-major. */
void gemm_bf16(Ctx *c, const void *w, cudaStream_t st) {
    const float one = 1, zero = 0;
    BCK(cublasSetStream(c->blas, st));
    BCK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, c->N, c->M, c->K, &one, w, CUDA_R_16BF, c->K, c->x, CUDA_R_16BF, c->K,
                     &zero, c->y, CUDA_R_32F, c->N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void run_dequant(void *p, cudaStream_t st) {
    Ctx *c = (Ctx *)p;
    const void *s, *w = wcopy(c, &s);
    KCK(c->fmt == KDT_SGEMM_INT4 ? kdt_dequant_int4_bf16(w, s, c->bf, c->N, c->K, st)
                                 : kdt_dequant_fp8_bf16(w, (const float *)s, c->bf, c->N, c->K, st));
}

void run_prefill(void *p, cudaStream_t st) {
    run_dequant(p, st);
    gemm_bf16((Ctx *)p, ((Ctx *)p)->bf, st);
}

void run_bf16(void *p, cudaStream_t st) {
    Ctx *c = (Ctx *)p;
    const int i = c->next++ % c->bf_copies;
    gemm_bf16(c, (const unsigned char *)c->wbf + (size_t)i * c->N * c->K * 2, st);
}

void fill(void *p, size_t n, uint64_t seed) { /* random bytes, then no e4m3 NaN codes (0x7f / 0xff) */
    unsigned char *h = (unsigned char *)malloc(n);
    for (size_t i = 0; i < n; i++) {
        h[i] = (unsigned char)(bench_mix64(seed + i / 8) >> (8 * (i % 8)));
        if ((h[i] & 0x7F) == 0x7F) h[i] ^= 1;
    }
    CK(cudaMemcpy(p, h, n, cudaMemcpyHostToDevice));
    free(h);
}

/* Reads n 16-byte words (grid-stride, 4 loads in flight a thread); the sum keeps the loads. */
__global__ void read_kernel(const uint4 *__restrict__ a, size_t n, unsigned *sink) {
    unsigned acc = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] = __ldcs(a + i + j * stride);
#pragma unroll
        for (int j = 0; j < 4; j++) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    }
    for (; i < n; i += stride) acc ^= __ldcs(a + i).x;
    if (acc == 0x12345678u) *sink = acc;
}

/* Kernel timings as CUDA graphs (one plain run first, outside capture, so that lazy set-up such as
 * cuBLAS's never happens while capturing). */
float time_graph(bench_launch_fn fn, Ctx *c, cudaStream_t st, int batches) {
    fn(c, st);
    CK(cudaStreamSynchronize(st));
    return bench_time_launches(fn, c, st, 1, 24, batches);
}

/* Copy ceiling: read + written bytes per second of a 1 GiB device-to-device copy (GB/s); *read_gbs:
 * read_kernel's bytes per second over the same 1 GiB. */
float copy_ceiling(cudaStream_t st, float *read_gbs) {
    const size_t n = 1ull << 30;
    void *a, *b;
    CK(cudaMalloc(&a, n));
    CK(cudaMalloc(&b, n));
    CK(cudaMemset(a, 1, n));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float t[8], r[8];
    for (int k = -1; k < 8; k++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        if (k >= 0) CK(cudaEventElapsedTime(&t[k], e0, e1));
        CK(cudaEventRecord(e0, st));
        read_kernel<<<132 * 16, 256, 0, st>>>((const uint4 *)a, n / 16, (unsigned *)b);
        CK(cudaGetLastError());
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        if (k >= 0) CK(cudaEventElapsedTime(&r[k], e0, e1));
    }
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    *read_gbs = (float)(n / (bench_median(r, 8) * 1e-3) / 1e9);
    return (float)(2.0 * n / (bench_median(t, 8) * 1e-3) / 1e9);
}

/* Per format: shares of the ceiling over the decode rows, large shapes and all. */
struct Tally { double sum[2]; int n[2], ok[2]; };

void tally(Tally &t, bool large, double pct) {
    for (int a = 0; a < 2; a++)
        if (a || large) {
            t.sum[a] += pct;
            t.n[a]++;
            t.ok[a] += pct >= 75.0;
        }
}

/* One kdt_sgemm launch a format (and int4 with cfg 4), then the old kernel's fp8 and int4, at M = 1 on [18432, 7168]
 * (zeros), for a profiler. */
int profile() {
    const int N = 18432, K = 7168;
    void *w, *s, *x;
    float *y;
    CK(cudaMalloc(&w, (size_t)N * K * 2));
    CK(cudaMalloc(&s, (size_t)N * K / 16));
    CK(cudaMalloc(&x, (size_t)K * 2));
    CK(cudaMalloc((void **)&y, (size_t)N * 4));
    CK(cudaMemset(w, 0, (size_t)N * K * 2));
    CK(cudaMemset(s, 0, (size_t)N * K / 16));
    CK(cudaMemset(x, 0, (size_t)K * 2));
    for (int f = 0; f < 3; f++) KCK(kdt_sgemm((kdt_sgemm_fmt)f, x, w, f ? s : NULL, y, 1, N, K, 0, NULL));
    KCK(kdt_sgemm_cfg(4, KDT_SGEMM_INT4, x, w, s, y, 1, N, K, 0, NULL)); /* int4: 2 x 4 */
    for (int f = 1; f < 3; f++) KCK(kdt_qgemm_with(KDT_QGEMM_STREAM, f == 2, x, w, s, y, 1, N, K, NULL));
    CK(cudaDeviceSynchronize());
    printf("profiled kdt_sgemm bf16, fp8, int4, int4 cfg 4, then quant_gemm's streaming kernel fp8, int4, at M = 1 on [%d, %d]\n", N,
           K);
    return 0;
}

/* --gemv: the forward's bf16 projections at Kimi K2's dims (issue 21), M = 1, 4, 16: cuBLAS (as kdt_lin ran them)
 * beside kdt_sgemm with each bf16 cfg (1 x 4, 2 x 4), programmatic dependent launch on (as a PDL forward
 * launches it: each launch's first weight loads overlap the launch before), the picked cfg without PDL, and on
 * the gate/up stacks the SiLU.mul-fused launch (KDT_SGEMM_GLU, with PDL; cuBLAS then still needs silu_mul).
 * One "gemv" line a row on stdout: the fastest sgemm variant against cuBLAS. */
struct GemvShape { const char *name; int N, K, glu; };
const GemvShape kGemv[] = {
    {"q_a+kv_a", 2112, 7168, 0}, {"q_b", 12288, 1536, 0},       {"o", 7168, 8192, 0},          {"shared gate/up", 4096, 7168, 1},
    {"shared down", 7168, 2048, 0}, {"dense gate/up", 36864, 7168, 1}, {"dense down", 7168, 18432, 0}, {"lm_head", 32000, 7168, 0},
};
const int kGemvM[] = {1, 4, 16};

void gemv_bench(FILE *out, cudaStream_t st, float ceiling, int nb) {
    bench_emit(out, "\n## bf16 projections at Kimi K2's dims (--gemv)\n\nus a launch, CUDA graphs of 24 launches each reading another "
                    "copy of the weights; %% of the copy ceiling (%.0f GB/s) in weight bytes. cfg c: kdt_sgemm with cfg c (1 x 4, 2 x 4) and "
                    "PDL; picked: the cfg kdt_sgemm picks, no PDL; glu: gate/up fused with SiLU.mul (cfg 2, PDL).\n\n", ceiling);
    bench_emit(out, "| weight [N, K] | M | MB | cuBLAS us | of ceiling | cfg 1 us | cfg 2 us | picked, no PDL us | glu us | "
                    "best sgemm | of ceiling | x cuBLAS |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|\n");
    Ctx c = {};
    BCK(cublasCreate(&c.blas));
    for (const GemvShape &sh : kGemv) {
        c.fmt = KDT_SGEMM_BF16;
        c.N = sh.N;
        c.K = sh.K;
        c.wbytes = (size_t)sh.N * sh.K * 2;
        c.copies = c.bf_copies = (int)((256ull << 20) / c.wbytes + 2);
        CK(cudaMalloc((void **)&c.w, c.wbytes * c.copies));
        CK(cudaMemset(c.w, 0x3c, c.wbytes * c.copies)); /* bf16 1.17: finite sums */
        c.wbf = c.w;
        const double gb = c.wbytes / 1e9;
        for (int M : kGemvM) {
            c.M = M;
            CK(cudaMalloc(&c.x, (size_t)M * sh.K * 2));
            CK(cudaMalloc((void **)&c.y, (size_t)M * sh.N * 4));
            CK(cudaMemset(c.x, 0, (size_t)M * sh.K * 2));
            const float tb = time_graph(run_bf16, &c, st, nb);
            float tc[3] = {}, tg = 0;
            c.flags = KDT_SGEMM_PDL;
            for (int v = 1; v <= 2; v++) {
                c.cfg = v;
                tc[v] = time_graph(run_sgemm, &c, st, nb);
            }
            c.cfg = 0;
            c.flags = 0;
            tc[0] = time_graph(run_sgemm, &c, st, nb);
            if (sh.glu) {
                c.flags = KDT_SGEMM_PDL | KDT_SGEMM_GLU;
                tg = time_graph(run_sgemm, &c, st, nb);
            }
            c.flags = 0;
            const int best = tc[2] < tc[1] ? 2 : 1;
            const float tbest = tc[best];
            bench_emit(out, "| %s [%d, %d] | %d | %.1f | %.1f | %.0f%% | %.1f | %.1f | %.1f | %s%.1f | cfg %d | %.0f%% | %.2f |\n", sh.name,
                       sh.N, sh.K, M, gb * 1e3, tb, 100 * gb / (tb * 1e-6) / ceiling, tc[1], tc[2], tc[0], sh.glu ? "" : "-",
                       sh.glu ? tg : 0.f, best, 100 * gb / (tbest * 1e-6) / ceiling, tb / tbest);
            printf("gemv %-15s [%5d, %5d] M %2d: cuBLAS %6.1f us (%3.0f%%), sgemm cfg %d + PDL %6.1f us (%3.0f%%, %.2fx), cfg %d no PDL %6.1f\n",
                   sh.name, sh.N, sh.K, M, tb, 100 * gb / (tb * 1e-6) / ceiling, best, tbest, 100 * gb / (tbest * 1e-6) / ceiling,
                   tb / tbest, kdt_sgemm_auto_cfg(KDT_SGEMM_BF16, M), tc[0]);
            if (sh.glu) printf("gemv %-15s   glu (SiLU.mul fused, PDL) %6.1f us\n", sh.name, tg);
            CK(cudaFree(c.x));
            CK(cudaFree(c.y));
        }
        CK(cudaFree(c.w));
    }
    BCK(cublasDestroy(c.blas));
}

} // namespace

int main(int argc, char **argv) {
    const char *out_path = NULL;
    int quick = 0, prefill = 0, gemv = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out_path = argv[++i];
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--prefill")) prefill = 1;
        else if (!strcmp(argv[i], "--gemv")) gemv = 1;
        else if (!strcmp(argv[i], "--profile")) return profile();
        else { fprintf(stderr, "usage: %s [--out FILE.md] [--quick] [--prefill] [--gemv] | --profile\n", argv[0]); return 2; }
    }
    FILE *out = NULL;
    if (bench_open("bench_quant_gemm", out_path, &out)) return 1;
    if (out) setvbuf(out, NULL, _IOLBF, 0); /* a run cut by a time limit keeps its rows */
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    bench_report_header(out, "Weight-streaming GEMMs (bench_quant_gemm)", &prop, argc, argv);
    float read_gbs = 0;
    const float ceiling = copy_ceiling(st, &read_gbs);
    bench_emit(out, "- copy ceiling (1 GiB device-to-device, read + written bytes): %.0f GB/s\n", ceiling);
    bench_emit(out, "- read-only kernel over the same 1 GiB (16-byte loads, 4 in flight a thread): %.0f GB/s\n\n", read_gbs);
    if (gemv) { /* the bf16 projections alone */
        gemv_bench(out, st, ceiling, quick ? 3 : 7);
        CK(cudaStreamDestroy(st));
        if (out) fclose(out);
        return 0;
    }
    bench_emit(out, "GB/s counts the weights and their scales once per launch; all times are CUDA graphs of 24 launches. "
                    "sgemm: kdt_sgemm with the cfg it picks; old: quant_gemm's streaming kernel (fp8, int4) or cuBLAS (bf16); "
                    "cuBLAS bf16: cuBLAS on a bf16 copy of the weights; cfg 1 .. 4: kdt_sgemm with that cfg forced "
                    "(row tiles a warp x steps in flight: 1 x 4, 2 x 4; 3, 4: int4 only, 1 x 8 and 2 x 4 with the "
                    "quad transpose through shared memory).\n\n");
    bench_emit(out, "| weight [N, K] | format | M | cfg | sgemm us | sgemm GB/s | sgemm of ceiling | old us | old of ceiling | "
                    "cuBLAS bf16 us | cfg 1 us | cfg 2 us | cfg 3 us | cfg 4 us |\n");
    bench_emit(out, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    Ctx c = {};
    BCK(cublasCreate(&c.blas));
    char extra[64][200]; /* the prefill rows and the dequantize kernels, printed after */
    int n_extra = 0;
    Tally tal[3] = {};
    const int n_shapes = quick ? 2 : (int)(sizeof kShapes / sizeof kShapes[0]);
    const int nb = quick ? 3 : 5;
    for (int si = 0; si < n_shapes; si++) {
        const Shape &sh = kShapes[si];
        const bool large = (double)sh.N * sh.K >= 5e7;
        for (int f = 0; f < 3; f++) {
            c.fmt = f;
            c.N = sh.N;
            c.K = sh.K;
            c.wbytes = f == 0 ? (size_t)sh.N * sh.K * 2 : f == 1 ? (size_t)sh.N * sh.K : (size_t)sh.N * sh.K / 2;
            c.sbytes = f == 0 ? 0 : f == 2 ? (size_t)sh.N * (sh.K / 32) * 2 : (size_t)((sh.N + 127) / 128) * ((sh.K + 127) / 128) * 4;
            const size_t sbytes = c.sbytes; /* counted; the copies are padded */
            c.sbytes = (c.sbytes + 255) / 256 * 256;
            const size_t bf_bytes = (size_t)sh.N * sh.K * 2;
            c.copies = (int)((256ull << 20) / c.wbytes + 2);
            c.bf_copies = (int)((256ull << 20) / bf_bytes + 2);
            CK(cudaMalloc((void **)&c.w, c.wbytes * c.copies));
            CK(cudaMalloc((void **)&c.s, c.sbytes * c.copies + 256));
            CK(cudaMalloc(&c.bf, bf_bytes));
            if (f) {
                CK(cudaMalloc(&c.wbf, bf_bytes * c.bf_copies));
                CK(cudaMemset(c.wbf, 0x3c, bf_bytes * c.bf_copies));
            } else c.wbf = c.w;
            if (f == 1) fill(c.w, c.wbytes * c.copies, 1);
            else CK(cudaMemset(c.w, f ? 0x5a : 0x3c, c.wbytes * c.copies)); /* bf16 1.1719 / int4 nibbles 10, 5 */
            CK(cudaMemset(c.s, 0x3c, c.sbytes * c.copies + 256)); /* small positive scales in f32 and bf16 alike */
            const double gb = (double)(c.wbytes + sbytes) / 1e9;
            for (int mi = 0; mi < (int)(sizeof kDecodeM / sizeof kDecodeM[0]) + (prefill ? 2 : 0); mi++) {
                const bool dec = mi < (int)(sizeof kDecodeM / sizeof kDecodeM[0]);
                c.M = dec ? kDecodeM[mi] : kPrefillM[mi - 4];
                CK(cudaMalloc(&c.x, (size_t)c.M * sh.K * 2));
                CK(cudaMalloc((void **)&c.y, (size_t)c.M * sh.N * 4));
                CK(cudaMemset(c.x, 0x3c, (size_t)c.M * sh.K * 2));
                c.next = 0;
                const int cb = c.copies;
                c.copies = c.bf_copies;
                const float tb = time_graph(run_bf16, &c, st, nb);
                c.copies = cb;
                if (dec) {
                    float tv[KDT_SGEMM_CFGS] = {};
                    for (int v = 0; v < KDT_SGEMM_CFGS; v++) {
                        c.cfg = v;
                        if (v < 3 || f == KDT_SGEMM_INT4) tv[v] = time_graph(run_sgemm, &c, st, nb); /* 3, 4: int4's alone */
                    }
                    float to = tb;
                    if (f) {
                        c.kernel = KDT_QGEMM_STREAM;
                        to = time_graph(run_qgemm, &c, st, nb);
                    }
                    const double pct = 100 * gb / (tv[0] * 1e-6) / ceiling, pct_old = 100 * gb / (to * 1e-6) / ceiling;
                    tally(tal[f], large, pct);
                    bench_emit(out, "| %s [%d, %d] | %s | %d | %d | %.1f | %.0f | %.0f%% | %.1f | %.0f%% | %.1f | %.1f | %.1f | %.1f | %.1f |\n",
                               sh.name, sh.N, sh.K, kFmtName[f], c.M, kdt_sgemm_auto_cfg((kdt_sgemm_fmt)f, c.M), tv[0],
                               gb / (tv[0] * 1e-6), pct, to, pct_old, tb, tv[1], tv[2], tv[3], tv[4]);
                } else if (f && n_extra < 60) {
                    c.kernel = KDT_QGEMM_BASELINE;
                    const float tq = time_graph(run_qgemm, &c, st, nb), tp = time_graph(run_prefill, &c, st, nb);
                    snprintf(extra[n_extra++], sizeof extra[0], "| %s [%d, %d] | %s | %d | %.1f | %.1f | %.1f |\n", sh.name, sh.N, sh.K,
                             kFmtName[f], c.M, tq, tp, tb);
                }
                CK(cudaFree(c.x));
                CK(cudaFree(c.y));
            }
            if (prefill && f && n_extra < 64) {
                const float td = time_graph(run_dequant, &c, st, nb);
                const double dbytes = (double)(c.wbytes + sbytes + bf_bytes); /* read once, bf16 written once */
                snprintf(extra[n_extra++], sizeof extra[0], "| %s [%d, %d] | %s | dequantize alone | %.1f | %.0f GB/s | %.0f%% |\n",
                         sh.name, sh.N, sh.K, kFmtName[f], td, dbytes / (td * 1e-6) / 1e9, 100 * dbytes / (td * 1e-6) / 1e9 / ceiling);
            }
            CK(cudaFree(c.w));
            CK(cudaFree(c.s));
            CK(cudaFree(c.bf));
            if (f) CK(cudaFree(c.wbf));
        }
    }
    if (n_extra) {
        bench_emit(out, "\nPrefill sizes: quant_gemm's baseline kernel, dequantize + cuBLAS, cuBLAS bf16 (us); then the dequantize "
                        "kernels alone (bytes read + written against the ceiling).\n\n");
        bench_emit(out, "| weight [N, K] | format | M | baseline us | prefill us | cuBLAS bf16 us |\n|---|---|---|---:|---:|---:|\n");
        for (int i = 0; i < n_extra; i++) bench_emit(out, "%s", extra[i]);
    }
    bench_emit(out, "\nsummary: copy ceiling %.0f GB/s;", ceiling);
    for (int f = 0; f < 3; f++)
        bench_emit(out, " %s: large shapes mean %.0f%%, %d of %d rows >= 75%%; all mean %.0f%%, %d of %d >= 75%%%s", kFmtName[f],
                   tal[f].n[0] ? tal[f].sum[0] / tal[f].n[0] : 0, tal[f].ok[0], tal[f].n[0], tal[f].n[1] ? tal[f].sum[1] / tal[f].n[1] : 0,
                   tal[f].ok[1], tal[f].n[1], f < 2 ? ";" : "\n");
    BCK(cublasDestroy(c.blas));
    CK(cudaStreamDestroy(st));
    if (out) fclose(out);
    return 0;
}
