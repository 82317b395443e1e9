/* The quantized-weight GEMMs (src/cuda/quant_gemm.cu) at Kimi K2's shapes: for each weight
 * [N, K], format (FP8 128x128 blocks, INT4 groups of 32) and M = 1, 8, 32, 128, 512 rows of x,
 * the time of the baseline decode kernel and of the streaming kernel (kdt_qgemm_with; the public
 * launchers take the streaming one up to 32 rows), the streaming kernel's GB/s of weights + scales
 * read, and that (and the baseline's) as a share of the device-copy ceiling measured in the same run
 * (cudaMemcpy device to device of 1 GiB, read + written bytes over time; a read-only kernel's GB/s
 * is printed beside it). Kernels are timed as CUDA graphs of 24 launches (as the model's forward
 * replays them), median of batches; the streaming kernel also as 24 plain stream launches (host
 * launch cost included, the method of the first tables in docs/perf/quant.md). Beside them the
 * prefill path (kdt_dequant_*_bf16 then cuBLAS bf16 GEMM, f32 accumulation) and bf16 cuBLAS alone
 * on an unquantized copy (the memory a bf16 checkpoint would read), as stream launches. Every
 * launch reads another copy of the weights (more than 256 MiB in all), so the L2 cache never holds
 * them. Last, the dequantize kernels alone, against the same ceiling in bytes read plus written.
 *
 *   build/bench/bench_quant_gemm [--out FILE.md] [--quick]
 */
#include <string.h>

#include <cublas_v2.h>

#include "bench_common.h"
#include "cuda/quant_gemm.h"
#include "cuda/quant_gemm_variant.h"

namespace {

struct Shape { const char *name; int N, K; };
const Shape kShapes[] = {
    {"expert gate/up", 2048, 7168}, {"expert down", 7168, 2048}, {"dense gate/up", 18432, 7168},
    {"dense down", 7168, 18432},    {"q_a", 1536, 7168},         {"q_b", 12288, 1536},
    {"kv_a", 576, 7168},            {"kv_b", 16384, 512},        {"o", 7168, 8192},
};
const int kM[] = {1, 8, 32, 128, 512};

#define BCK(call)                                                                 \
    do {                                                                          \
        cublasStatus_t b_ = (call);                                               \
        if (b_ != CUBLAS_STATUS_SUCCESS) {                                        \
            fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #call, (int)b_); \
            exit(1);                                                              \
        }                                                                         \
    } while (0)

struct Ctx {
    int int4, M, N, K, copies, next;
    kdt_qgemm_kernel kernel;
    size_t wbytes, sbytes;
    unsigned char *w, *s;      /* copies of the weights and scales, back to back */
    void *x, *bf, *wbf;        /* x [M, K] bf16; bf16 scratch [N, K]; bf16 weights, copies back to back */
    float *y;
    cublasHandle_t blas;
};

void run_qgemm(void *p, cudaStream_t st) {
    Ctx *c = (Ctx *)p;
    const int i = c->next++ % c->copies;
    const void *w = c->w + (size_t)i * c->wbytes, *s = c->s + (size_t)i * c->sbytes;
    KCK(kdt_qgemm_with(c->kernel, c->int4, c->x, w, s, c->y, c->M, c->N, c->K, st));
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
    const int i = c->next++ % c->copies;
    const void *w = c->w + (size_t)i * c->wbytes, *s = c->s + (size_t)i * c->sbytes;
    KCK(c->int4 ? kdt_dequant_int4_bf16(w, s, c->bf, c->N, c->K, st)
                : kdt_dequant_fp8_bf16(w, (const float *)s, c->bf, c->N, c->K, st));
}

void run_prefill(void *p, cudaStream_t st) {
    run_dequant(p, st);
    gemm_bf16((Ctx *)p, ((Ctx *)p)->bf, st);
}

void run_bf16(void *p, cudaStream_t st) {
    Ctx *c = (Ctx *)p;
    const int i = c->next++ % c->copies;
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

} // namespace

int main(int argc, char **argv) {
    const char *out_path = NULL;
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out_path = argv[++i];
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else { fprintf(stderr, "usage: %s [--out FILE.md] [--quick]\n", argv[0]); return 2; }
    }
    FILE *out = NULL;
    if (bench_open("bench_quant_gemm", out_path, &out)) return 1;
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    bench_report_header(out, "Quantized-weight GEMMs (bench_quant_gemm)", &prop, argc, argv);
    float read_gbs = 0;
    const float ceiling = copy_ceiling(st, &read_gbs);
    bench_emit(out, "- copy ceiling (1 GiB device-to-device, read + written bytes): %.0f GB/s\n", ceiling);
    bench_emit(out, "- read-only kernel over the same 1 GiB (16-byte loads, 4 in flight a thread): %.0f GB/s\n\n", read_gbs);
    bench_emit(out, "GB/s counts the quantized weights and their scales once per launch. base: the baseline decode kernel; "
                    "stream: the streaming kernel (the public path up to 32 rows); both as CUDA graphs of 24 launches. "
                    "stream (launches): the streaming kernel as 24 stream launches. prefill: dequantize to bf16, then cuBLAS "
                    "bf16 GEMM. bf16: cuBLAS on a bf16 copy of the weights (stream launches).\n\n");
    bench_emit(out, "| weight [N, K] | format | M | base us | stream us | stream GB/s | stream of ceiling | base of ceiling | "
                    "stream (launches) us | prefill us | bf16 cuBLAS us |\n");
    bench_emit(out, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    Ctx c = {};
    BCK(cublasCreate(&c.blas));
    char deq[2 * sizeof kShapes / sizeof kShapes[0]][160]; /* the dequantize kernels' table, printed last */
    int n_deq = 0;
    const int n_shapes = quick ? 2 : (int)(sizeof kShapes / sizeof kShapes[0]);
    for (int si = 0; si < n_shapes; si++) {
        const Shape &sh = kShapes[si];
        for (int f = 0; f < 2; f++) {
            c.int4 = f;
            c.N = sh.N;
            c.K = sh.K;
            c.wbytes = f ? (size_t)sh.N * sh.K / 2 : (size_t)sh.N * sh.K;
            c.sbytes = f ? (size_t)sh.N * (sh.K / 32) * 2 : (size_t)((sh.N + 127) / 128) * ((sh.K + 127) / 128) * 4;
            c.sbytes = (c.sbytes + 255) / 256 * 256; /* keep each copy 16-byte aligned */
            const size_t bf_bytes = (size_t)sh.N * sh.K * 2;
            c.copies = (int)((256ull << 20) / c.wbytes + 2);
            const int bf_copies = (int)((256ull << 20) / bf_bytes + 2);
            CK(cudaMalloc((void **)&c.w, c.wbytes * c.copies));
            CK(cudaMalloc((void **)&c.s, c.sbytes * c.copies));
            CK(cudaMalloc(&c.bf, bf_bytes));
            CK(cudaMalloc(&c.wbf, bf_bytes * bf_copies));
            fill(c.w, c.wbytes * c.copies, 1);
            CK(cudaMemset(c.s, 0x3c, c.sbytes * c.copies)); /* small positive scales in f32 and bf16 alike */
            CK(cudaMemset(c.wbf, 0x3c, bf_bytes * bf_copies));
            c.next = 0;
            const float td = bench_time_launches(run_dequant, &c, st, 0, 24, quick ? 3 : 9);
            const double dbytes = (double)(c.wbytes + c.sbytes + bf_bytes); /* read once, bf16 written once */
            snprintf(deq[n_deq++], sizeof deq[0], "| %s [%d, %d] | %s | %.1f | %.0f | %.0f%% |\n", sh.name, sh.N, sh.K,
                     f ? "int4 g32" : "fp8 128x128", td, dbytes / (td * 1e-6) / 1e9, 100 * dbytes / (td * 1e-6) / 1e9 / ceiling);
            for (int mi = 0; mi < (int)(sizeof kM / sizeof kM[0]); mi++) {
                c.M = kM[mi];
                CK(cudaMalloc(&c.x, (size_t)c.M * sh.K * 2));
                CK(cudaMalloc((void **)&c.y, (size_t)c.M * sh.N * 4));
                CK(cudaMemset(c.x, 0x3c, (size_t)c.M * sh.K * 2));
                c.next = 0;
                const int nb = quick ? 3 : 9;
                c.kernel = KDT_QGEMM_BASELINE;
                const float tq0 = time_graph(run_qgemm, &c, st, nb);
                c.kernel = KDT_QGEMM_STREAM;
                const float tq = time_graph(run_qgemm, &c, st, nb);
                const float tql = bench_time_launches(run_qgemm, &c, st, 0, 24, nb);
                const float tp = bench_time_launches(run_prefill, &c, st, 0, 24, nb);
                const int copies = c.copies;
                c.copies = bf_copies;
                const float tb = bench_time_launches(run_bf16, &c, st, 0, 24, nb);
                c.copies = copies;
                const double gbs = (double)(c.wbytes + c.sbytes) / (tq * 1e-6) / 1e9;
                const double gbs0 = (double)(c.wbytes + c.sbytes) / (tq0 * 1e-6) / 1e9;
                bench_emit(out, "| %s [%d, %d] | %s | %d | %.1f | %.1f | %.0f | %.0f%% | %.0f%% | %.1f | %.1f | %.1f |\n", sh.name,
                           sh.N, sh.K, f ? "int4 g32" : "fp8 128x128", c.M, tq0, tq, gbs, 100 * gbs / ceiling,
                           100 * gbs0 / ceiling, tql, tp, tb);
                CK(cudaFree(c.x));
                CK(cudaFree(c.y));
            }
            CK(cudaFree(c.w));
            CK(cudaFree(c.s));
            CK(cudaFree(c.bf));
            CK(cudaFree(c.wbf));
        }
    }
    bench_emit(out, "\nThe dequantize kernels alone (prefill path): GB/s of quantized bytes read plus bf16 bytes written.\n\n");
    bench_emit(out, "| weight [N, K] | format | dequant us | GB/s | of ceiling |\n|---|---|---:|---:|---:|\n");
    for (int i = 0; i < n_deq; i++) bench_emit(out, "%s", deq[i]);
    BCK(cublasDestroy(c.blas));
    CK(cudaStreamDestroy(st));
    if (out) fclose(out);
    return 0;
}
