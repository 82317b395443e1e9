/* The quantized-weight kernels (src/cuda/quant_gemm.cu) against the CPU: random FP8-block and
 * INT4-group weights, dequantized exactly by the CPU loader's own dequantizers (src/model/quant.c,
 * checked bit for bit against torch and compressed-tensors by test_quant), times random bf16 x
 * in double. GEMMs, the public launchers (the streaming kernel up to 32 rows, the baseline past
 * them) and the other decode kernel (kdt_qgemm_with): relative L2 <= 1e-5 and every element within
 * 1e-4 of the largest |y| (f32 accumulation in another order); the launcher bit-identical across two
 * runs (no atomics: a K split sums its partials in rank order). Dequantize
 * kernels: bf16 of the exact value, bit for bit. Shapes cover partial 128x128 blocks and partial
 * last 128-k steps (fp8 and int4), partial 64-row tiles, M = 1 .. 32 in each count of 8-row mma
 * tiles and past 32 (a second block row), K split over clusters of 1 to 8 blocks (3 included), an
 * odd count of INT4 scales (the last scale word half past the end), INT4 scales 2 bytes off a
 * 4-byte boundary (the baseline kernel), and Kimi's sizes.
 * Outputs are NaN-poisoned before each run. Without a CUDA device it prints SKIP lines. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

extern "C" {
#include "harness.h"
#include "model/quant.h"
}
#include "cuda/quant_gemm.h"
#include "cuda/quant_gemm_variant.h"

namespace {

uint64_t rng = 0x1234abcdull;
uint32_t rnd() {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}
float unit() { return (float)(rnd() & 0xFFFFFF) / 16777216.f * 2.f - 1.f; } /* [-1, 1) */

uint16_t f2bf(float f) { /* nearest even */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
float bf2f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#define CK(call)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) { kt_fail("%s: %s", #call, cudaGetErrorString(e_)); return; } \
    } while (0)

/* One case: W [N, K] quantized (int4 or fp8), x [M, K]; int4 scales at byte offset soff of their allocation. */
void run_case(bool int4, int M, int N, int K, int soff = 0) {
    const char *kind = int4 ? "int4" : "fp8";
    const size_t wbytes = int4 ? (size_t)N * K / 2 : (size_t)N * K;
    const int sr = int4 ? N : (N + 127) / 128, sc = int4 ? K / 32 : (K + 127) / 128;
    unsigned char *w = (unsigned char *)malloc(wbytes);
    float *scale = (float *)malloc((size_t)sr * sc * 4);
    uint16_t *scale16 = (uint16_t *)malloc((size_t)sr * sc * 2);
    for (size_t i = 0; i < wbytes; i++) {
        w[i] = (unsigned char)rnd();
        if (!int4 && (w[i] & 0x7F) == 0x7F) w[i] ^= 1; /* no NaN codes */
    }
    for (int i = 0; i < sr * sc; i++) {
        scale[i] = 0.001f + 0.01f * (unit() + 1);
        scale16[i] = f2bf(scale[i]);
    }
    float *wf = (float *)malloc((size_t)N * K * 4);
    if (int4) kdt_dequant_int4(w, scale16, N, K, 32, wf);
    else kdt_dequant_fp8(w, scale, N, K, 128, 128, wf);
    uint16_t *x = (uint16_t *)malloc((size_t)M * K * 2 + 2);
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = f2bf(unit());
    double *ref = (double *)calloc((size_t)M * N + 1, sizeof(double));
    double ymax = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double a = 0;
            for (int k = 0; k < K; k++) a += (double)bf2f(x[(size_t)m * K + k]) * wf[(size_t)n * K + k];
            ref[(size_t)m * N + n] = a;
            ymax = fmax(ymax, fabs(a));
        }
    void *dw, *ds, *dx, *dy, *dq;
    CK(cudaMalloc(&dw, wbytes));
    CK(cudaMalloc(&ds, (size_t)sr * sc * 4 + 16));
    void *dsc = (char *)ds + soff;
    CK(cudaMalloc(&dx, (size_t)M * K * 2 + 16));
    CK(cudaMalloc(&dy, (size_t)M * N * 4 + 4));
    CK(cudaMalloc(&dq, (size_t)N * K * 2));
    CK(cudaMemcpy(dw, w, wbytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dsc, int4 ? (void *)scale16 : (void *)scale, (size_t)sr * sc * (int4 ? 2 : 4), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dx, x, (size_t)M * K * 2, cudaMemcpyHostToDevice));
    float *y1 = (float *)malloc((size_t)M * N * 4 + 4), *y2 = (float *)malloc((size_t)M * N * 4 + 4);
    float *y3 = (float *)malloc((size_t)M * N * 4 + 4);
    /* Runs 0 and 1: the public launcher; run 2: the other decode kernel. */
    const kdt_qgemm_kernel other = M <= 32 ? KDT_QGEMM_BASELINE : KDT_QGEMM_STREAM;
    kdt_status s = KDT_OK;
    for (int rep = 0; rep < 3 && s == KDT_OK; rep++) {
        float *h = rep == 0 ? y1 : rep == 1 ? y2 : y3;
        CK(cudaMemset(dy, 0xFF, (size_t)M * N * 4)); /* NaN */
        if (rep == 2) s = kdt_qgemm_with(other, int4, dx, dw, dsc, (float *)dy, M, N, K, NULL);
        else if (int4) s = kdt_qgemm_int4(dx, dw, dsc, (float *)dy, M, N, K, NULL);
        else s = kdt_qgemm_fp8(dx, dw, (float *)dsc, (float *)dy, M, N, K, NULL);
        if (s == KDT_OK) CK(cudaDeviceSynchronize());
        if (s == KDT_OK) CK(cudaMemcpy(h, dy, (size_t)M * N * 4, cudaMemcpyDeviceToHost));
    }
    if (s != KDT_OK) {
        kt_fail("qgemm %s M %d N %d K %d: %s", kind, M, N, K, kdt_last_error());
    } else {
        for (int run = 0; run < 2; run++) { /* the launcher's kernel, then the other one */
            const float *yk = run ? y3 : y1;
            double num = 0, den = 0, worst = 0;
            size_t bad = 0;
            for (size_t i = 0; i < (size_t)M * N; i++) {
                const double d = yk[i] - ref[i];
                num += d * d;
                den += ref[i] * ref[i];
                if (!(fabs(d) <= 1e-4 * ymax)) bad++;
                worst = fmax(worst, fabs(d));
            }
            const double rel = sqrt(num / fmax(den, 1e-300));
            const bool same = run || !memcmp(y1, y2, (size_t)M * N * 4);
            const bool stream = (run ? M > 32 : M <= 32) && !(int4 && soff % 4); /* which kernel ran */
            kt_check(rel <= 1e-5 && !bad && same,
                     "qgemm %s M %d N %d K %d%s, %s kernel%s: rel L2 %.1e, max |err| %.1e of max |y| %.1e, %zu outside%s", kind, M,
                     N, K, soff ? " (scales 2 bytes off)" : "", stream ? "streaming" : "baseline", run ? "" : " (launcher)", rel,
                     worst, ymax, bad, run ? "" : same ? ", runs bit-identical" : ", runs DIFFER");
        }
    }
    /* The prefill path's bf16 copy of W. */
    uint16_t *q = (uint16_t *)malloc((size_t)N * K * 2);
    CK(cudaMemset(dq, 0xFF, (size_t)N * K * 2));
    s = int4 ? kdt_dequant_int4_bf16(dw, dsc, dq, N, K, NULL) : kdt_dequant_fp8_bf16(dw, (float *)dsc, dq, N, K, NULL);
    if (s == KDT_OK) CK(cudaMemcpy(q, dq, (size_t)N * K * 2, cudaMemcpyDeviceToHost));
    size_t diff = 0;
    for (size_t i = 0; s == KDT_OK && i < (size_t)N * K; i++) diff += q[i] != f2bf(wf[i]);
    kt_check(s == KDT_OK && !diff, "dequant %s -> bf16 [%d, %d]: %zu of %zu differ from the exact value rounded%s", kind, N, K,
             diff, (size_t)N * K, s == KDT_OK ? "" : kdt_last_error());
    cudaFree(dw); cudaFree(ds); cudaFree(dx); cudaFree(dy); cudaFree(dq);
    free(w); free(scale); free(scale16); free(wf); free(x); free(ref); free(y1); free(y2); free(y3); free(q);
}

} // namespace

int main() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        kt_skip("qgemm fp8 / int4 and their dequantize kernels: no CUDA device");
        return kt_exit_code();
    }
    static const int shapes[][3] = {{1, 7, 208},     {3, 130, 272},    {8, 256, 512},    {13, 129, 1024},
                                    {16, 200, 1056}, {24, 130, 416},   {40, 64, 2048},   {1, 2048, 7168},
                                    {8, 7168, 2048}, {16, 576, 7168}, {32, 576, 7168}, {32, 1024, 7168}};
    for (const auto &sh : shapes) {
        run_case(false, sh[0], sh[1], sh[2]);
        if (sh[2] % 32 == 0) run_case(true, sh[0], sh[1], sh[2]);
    }
    run_case(true, 5, 131, 1056);    /* 131 x 33 scales: the last word holds one */
    run_case(true, 13, 129, 1024, 2); /* scales not 4-byte aligned: the baseline kernel */
    /* Bad arguments are refused, naming the kernel. */
    kdt_status s = kdt_qgemm_int4((void *)16, (void *)16, (void *)16, (float *)16, 1, 8, 48, NULL);
    kt_check(s == KDT_ERR_SHAPE && strstr(kdt_last_error(), "qgemm_int4"), "qgemm_int4 refuses K = 48 (not a multiple of 32): %s",
             kdt_last_error());
    return kt_exit_code();
}
