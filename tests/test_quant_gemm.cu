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
 * 4-byte boundary (the baseline kernel), and Kimi's sizes. The streaming kernel also with programmatic
 * dependent launch (the same bits) and fused with SiLU.mul on a gate/up stack (KDT_SGEMM_GLU).
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
#include "cuda/stream_gemm.h"

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

/* ref [M, N] = x [M, K] (bf16) . wf [N, K]^T in double; *ymax: the largest |ref|. */
double *reference(const uint16_t *x, const float *wf, int M, int N, int K, double *ymax) {
    double *ref = (double *)calloc((size_t)M * N + 1, sizeof(double));
    *ymax = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double a = 0;
            for (int k = 0; k < K; k++) a += (double)bf2f(x[(size_t)m * K + k]) * wf[(size_t)n * K + k];
            ref[(size_t)m * N + n] = a;
            *ymax = fmax(*ymax, fabs(a));
        }
    return ref;
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
    double ymax;
    double *ref = reference(x, wf, M, N, K, &ymax);
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

/* The weight-streaming kernel (kdt_sgemm, each cfg) on one shape against the CPU: y = x W^T on a NaN-poisoned
 * y, then y += x W^T on random y (rel L2 <= 1e-5, every element within 1e-4 of the largest |y|); the picked
 * cfg bit-identical across two runs and to every other cfg, and rows 0, M / 2 and M - 1 of the M-row
 * product bit-identical to the same rows computed alone (M = 1). fmt: 0 bf16, 1 fp8, 2 int4 (scales at byte offset soff). */
void run_sgemm_case(int fmt, int M, int N, int K, int soff = 0) {
    const char *kind = fmt == 0 ? "bf16" : fmt == 1 ? "fp8" : "int4";
    const size_t wbytes = fmt == 0 ? (size_t)N * K * 2 : fmt == 1 ? (size_t)N * K : (size_t)N * K / 2;
    const int sr = fmt == 2 ? N : (N + 127) / 128, sc = fmt == 2 ? K / 32 : (K + 127) / 128;
    unsigned char *w = (unsigned char *)malloc(wbytes);
    float *scale = (float *)malloc((size_t)sr * sc * 4), *wf = (float *)malloc((size_t)N * K * 4);
    uint16_t *scale16 = (uint16_t *)malloc((size_t)sr * sc * 2), *x = (uint16_t *)malloc((size_t)M * K * 2);
    for (size_t i = 0; i < wbytes; i++) {
        w[i] = (unsigned char)rnd();
        if (fmt == 1 && (w[i] & 0x7F) == 0x7F) w[i] ^= 1; /* no NaN codes */
    }
    for (int i = 0; i < sr * sc; i++) {
        scale[i] = 0.001f + 0.01f * (unit() + 1);
        scale16[i] = f2bf(scale[i]);
    }
    if (fmt == 0)
        for (size_t i = 0; i < (size_t)N * K; i++) {
            ((uint16_t *)w)[i] = f2bf(unit());
            wf[i] = bf2f(((uint16_t *)w)[i]);
        }
    else if (fmt == 2) kdt_dequant_int4(w, scale16, N, K, 32, wf);
    else kdt_dequant_fp8(w, scale, N, K, 128, 128, wf);
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = f2bf(unit());
    const size_t ny = (size_t)M * N;
    float *y0 = (float *)malloc(ny * 4), *h = (float *)malloc(ny * 4), *first = (float *)malloc(ny * 4), *row = (float *)malloc((size_t)N * 4);
    double ymax;
    double *ref = reference(x, wf, M, N, K, &ymax);
    for (size_t i = 0; i < ny; i++) y0[i] = unit();
    void *dw, *ds, *dx, *dy;
    CK(cudaMalloc(&dw, wbytes));
    CK(cudaMalloc(&ds, (size_t)sr * sc * 4 + 16));
    CK(cudaMalloc(&dx, (size_t)M * K * 2));
    CK(cudaMalloc(&dy, ny * 4));
    void *dsc = fmt ? (char *)ds + soff : NULL;
    CK(cudaMemcpy(dw, w, wbytes, cudaMemcpyHostToDevice));
    if (fmt) CK(cudaMemcpy(dsc, fmt == 2 ? (void *)scale16 : (void *)scale, (size_t)sr * sc * (fmt == 2 ? 2 : 4), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dx, x, (size_t)M * K * 2, cudaMemcpyHostToDevice));
    const kdt_sgemm_fmt f = (kdt_sgemm_fmt)fmt;
    int same_cfgs = 0; /* cfgs 1 .. whose y = x W^T is cfg 0's bits */
    for (int cfg = 0; cfg < KDT_SGEMM_CFGS; cfg++) {
        double rel[2] = {0, 0};
        size_t bad = 0;
        kdt_status s = KDT_OK;
        for (int acc = 0; acc < 2 && s == KDT_OK; acc++) {
            if (acc) CK(cudaMemcpy(dy, y0, ny * 4, cudaMemcpyHostToDevice));
            else CK(cudaMemset(dy, 0xFF, ny * 4)); /* NaN */
            s = kdt_sgemm_cfg(cfg, f, dx, dw, dsc, (float *)dy, M, N, K, acc, NULL);
            if (s != KDT_OK) break;
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(h, dy, ny * 4, cudaMemcpyDeviceToHost));
            if (!cfg && !acc) memcpy(first, h, ny * 4);
            else if (!acc) same_cfgs += !memcmp(first, h, ny * 4);
            double num = 0, den = 0;
            for (size_t i = 0; i < ny; i++) {
                const double e = ref[i] + (acc ? y0[i] : 0), d = h[i] - e;
                num += d * d;
                den += e * e;
                if (!(fabs(d) <= 1e-4 * (ymax + (acc ? 1 : 0)))) bad++;
            }
            rel[acc] = sqrt(num / fmax(den, 1e-300));
        }
        if (s != KDT_OK) {
            kt_fail("sgemm %s M %d N %d K %d cfg %d: %s", kind, M, N, K, cfg, kdt_last_error());
            continue;
        }
        kt_check(rel[0] <= 1e-5 && rel[1] <= 1e-5 && !bad, "sgemm %s M %d N %d K %d%s cfg %d: rel L2 %.1e (y =), %.1e (y +=), %zu outside",
                 kind, M, N, K, soff ? " (scales 2 bytes off)" : "", cfg, rel[0], rel[1], bad);
    }
    /* Run to run (with programmatic dependent launch, behind a product into the same y), and M to M: the
     * picked cfg again, then rows alone. */
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    CK(cudaMemsetAsync(dy, 0xFF, ny * 4, st));
    kdt_status s = kdt_sgemm(f, dx, dw, dsc, (float *)dy, M, N, K, KDT_SGEMM_ACCUMULATE, st);
    if (s == KDT_OK) s = kdt_sgemm(f, dx, dw, dsc, (float *)dy, M, N, K, KDT_SGEMM_PDL, st);
    CK(cudaStreamSynchronize(st));
    CK(cudaStreamDestroy(st));
    if (s == KDT_OK) CK(cudaMemcpy(h, dy, ny * 4, cudaMemcpyDeviceToHost));
    int same_rows = 0;
    const int rows[3] = {0, M / 2, M - 1};
    for (int j = 0; j < 3 && s == KDT_OK; j++) {
        CK(cudaMemset(dy, 0xFF, (size_t)N * 4));
        s = kdt_sgemm(f, (const uint16_t *)dx + (size_t)rows[j] * K, dw, dsc, (float *)dy, 1, N, K, 0, NULL);
        if (s == KDT_OK) CK(cudaMemcpy(row, dy, (size_t)N * 4, cudaMemcpyDeviceToHost));
        same_rows += s == KDT_OK && !memcmp(row, first + (size_t)rows[j] * N, (size_t)N * 4);
    }
    kt_check(s == KDT_OK && !memcmp(h, first, ny * 4) && same_rows == 3 && same_cfgs == KDT_SGEMM_CFGS - 1,
             "sgemm %s M %d N %d K %d: two runs (the second with PDL) %s, rows 0, %d, %d alone (M = 1) bit-identical to the M-row product: %d of 3, "
             "cfgs 1 .. %d bit-identical to the picked one: %d%s%s",
             kind, M, N, K, !memcmp(h, first, ny * 4) ? "bit-identical" : "DIFFER", M / 2, M - 1, same_rows, KDT_SGEMM_CFGS - 1,
             same_cfgs, s == KDT_OK ? "" : ": ", s == KDT_OK ? "" : kdt_last_error());
    cudaFree(dw); cudaFree(ds); cudaFree(dx); cudaFree(dy);
    free(w); free(scale); free(wf); free(scale16); free(x); free(ref); free(y0); free(h); free(first); free(row);
}

/* KDT_SGEMM_GLU: act [M, I] bf16 = silu(x gate^T) * (x up^T), w bf16 [2I, K], on a NaN-poisoned act, against
 * the CPU (double products, f32 silu; within 2^-7 relative of each element plus 1e-3 of the largest |act|:
 * bf16 rounding), against the plain product y [M, 2I] of the same launcher with kdt_mk_silu_mul's formula
 * applied on the host (at most 1 bf16 ulp: the host's expf against the device's), run to run bit-identical,
 * and rows 0, M / 2, M - 1 alone (M = 1) bit-identical to the M-row launch. */
void run_glu_case(int M, int I, int K) {
    const int N = 2 * I;
    uint16_t *w = (uint16_t *)malloc((size_t)N * K * 2), *x = (uint16_t *)malloc((size_t)M * K * 2);
    float *wf = (float *)malloc((size_t)N * K * 4), *y = (float *)malloc((size_t)M * N * 4);
    for (size_t i = 0; i < (size_t)N * K; i++) wf[i] = bf2f(w[i] = f2bf(unit() * 0.2f));
    for (size_t i = 0; i < (size_t)M * K; i++) x[i] = f2bf(unit());
    double ymax;
    double *ref = reference(x, wf, M, N, K, &ymax);
    const size_t na = (size_t)M * I;
    uint16_t *act = (uint16_t *)malloc(na * 2), *first = (uint16_t *)malloc(na * 2), *row = (uint16_t *)malloc((size_t)I * 2);
    void *dw, *dx, *dy, *da;
    CK(cudaMalloc(&dw, (size_t)N * K * 2));
    CK(cudaMalloc(&dx, (size_t)M * K * 2));
    CK(cudaMalloc(&dy, (size_t)M * N * 4));
    CK(cudaMalloc(&da, na * 2));
    CK(cudaMemcpy(dw, w, (size_t)N * K * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dx, x, (size_t)M * K * 2, cudaMemcpyHostToDevice));
    CK(cudaMemset(da, 0xFF, na * 2));
    kdt_status s = kdt_sgemm(KDT_SGEMM_BF16, dx, dw, NULL, da, M, N, K, KDT_SGEMM_GLU, NULL);
    if (s == KDT_OK) s = kdt_sgemm_cfg(2, KDT_SGEMM_BF16, dx, dw, NULL, dy, M, N, K, 0, NULL);
    if (s != KDT_OK) {
        kt_fail("sgemm glu M %d I %d K %d: %s", M, I, K, kdt_last_error());
    } else {
        CK(cudaMemcpy(first, da, na * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(y, dy, (size_t)M * N * 4, cudaMemcpyDeviceToHost));
        double amax = 0;
        for (int m = 0; m < M; m++)
            for (int i = 0; i < I; i++) {
                const double g = ref[(size_t)m * N + i], u = ref[(size_t)m * N + I + i];
                amax = fmax(amax, fabs(g / (1 + exp(-g)) * u));
            }
        size_t bad = 0, off_ulp = 0;
        for (int m = 0; m < M; m++)
            for (int i = 0; i < I; i++) {
                const double g = ref[(size_t)m * N + i], u = ref[(size_t)m * N + I + i], e = g / (1 + exp(-g)) * u;
                const float a = bf2f(first[(size_t)m * I + i]);
                if (!(fabs(a - e) <= fabs(e) / 128 + 1e-3 * amax)) bad++;
                const float yg = y[(size_t)m * N + i], yu = y[(size_t)m * N + I + i];
                const int d = (int)first[(size_t)m * I + i] - (int)f2bf(yg / (1.0f + expf(-yg)) * yu);
                off_ulp += d < -1 || d > 1;
            }
        kt_check(!bad && !off_ulp, "sgemm glu M %d I %d K %d: %zu of %zu outside the CPU's bound, %zu more than 1 ulp from the plain "
                 "product's silu(g) * u", M, I, K, bad, na, off_ulp);
        CK(cudaMemset(da, 0xFF, na * 2));
        s = kdt_sgemm(KDT_SGEMM_BF16, dx, dw, NULL, da, M, N, K, KDT_SGEMM_GLU, NULL);
        if (s == KDT_OK) CK(cudaMemcpy(act, da, na * 2, cudaMemcpyDeviceToHost));
        int same_rows = 0;
        const int rows[3] = {0, M / 2, M - 1};
        for (int j = 0; j < 3 && s == KDT_OK; j++) {
            CK(cudaMemset(da, 0xFF, (size_t)I * 2));
            s = kdt_sgemm(KDT_SGEMM_BF16, (const uint16_t *)dx + (size_t)rows[j] * K, dw, NULL, da, 1, N, K, KDT_SGEMM_GLU, NULL);
            if (s == KDT_OK) CK(cudaMemcpy(row, da, (size_t)I * 2, cudaMemcpyDeviceToHost));
            same_rows += s == KDT_OK && !memcmp(row, first + (size_t)rows[j] * I, (size_t)I * 2);
        }
        kt_check(s == KDT_OK && !memcmp(act, first, na * 2) && same_rows == 3,
                 "sgemm glu M %d I %d K %d: two runs %s, rows 0, %d, %d alone (M = 1) bit-identical: %d of 3", M, I, K,
                 !memcmp(act, first, na * 2) ? "bit-identical" : "DIFFER", M / 2, M - 1, same_rows);
    }
    cudaFree(dw); cudaFree(dx); cudaFree(dy); cudaFree(da);
    free(w); free(x); free(wf); free(y); free(ref); free(act); free(first); free(row);
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
    /* The streaming kernel: partial tiles and steps, M in each count of 8-row tiles, K split over 1 to 8 blocks. */
    static const int sshapes[][3] = {{1, 7, 224},    {3, 130, 1056}, {5, 300, 224},   {9, 129, 1024}, {16, 200, 2048},
                                     {24, 576, 1056}, {32, 64, 7168}, {8, 2048, 7168}, {17, 1100, 512}};
    for (const auto &sh : sshapes)
        for (int f = 0; f < 3; f++) run_sgemm_case(f, sh[0], sh[1], sh[2]);
    run_sgemm_case(0, 2, 33, 200);     /* bf16: K % 32 != 0 (a partial step) */
    run_sgemm_case(1, 4, 129, 208);    /* fp8: a partial 128-k block and a partial 64-k step */
    run_sgemm_case(2, 5, 131, 1056, 2); /* int4: 33 groups a row, scales 2 bytes off (one load a scale) */
    /* GLU: one K slice and splits, partial 64-output tiles, 1 to 4 column tiles of x. */
    static const int gshapes[][3] = {{1, 100, 224}, {4, 33, 1056}, {16, 300, 2048}, {9, 2048, 7168}, {16, 64, 512}};
    for (const auto &sh : gshapes) run_glu_case(sh[0], sh[1], sh[2]);
    kt_check(kdt_sgemm(KDT_SGEMM_FP8, (void *)16, (void *)16, (void *)16, (float *)16, 1, 8, 64, KDT_SGEMM_GLU, NULL) ==
                     KDT_ERR_INVALID_ARG,
             "sgemm refuses GLU on fp8: %s", kdt_last_error());
    kdt_status bad = kdt_sgemm(KDT_SGEMM_FP8, (void *)16, (void *)16, (void *)16, (float *)16, 33, 8, 64, 0, NULL);
    kt_check(bad == KDT_ERR_SHAPE && strstr(kdt_last_error(), "sgemm fp8"), "sgemm refuses M = 33: %s", kdt_last_error());
    /* Bad arguments are refused, naming the kernel. */
    kdt_status s = kdt_qgemm_int4((void *)16, (void *)16, (void *)16, (float *)16, 1, 8, 48, NULL);
    kt_check(s == KDT_ERR_SHAPE && strstr(kdt_last_error(), "qgemm_int4"), "qgemm_int4 refuses K = 48 (not a multiple of 32): %s",
             kdt_last_error());
    return kt_exit_code();
}
