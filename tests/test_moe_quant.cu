/* The grouped quantized-expert kernels (src/model/cuda/moe_quant.cu) against the CPU: random INT4
 * (groups of 32) and FP8 (128x128 blocks) experts, dequantized exactly by the CPU loader's own
 * dequantizers (src/model/quant.c, checked against torch and compressed-tensors by test_quant),
 * random bf16 rows routed to K distinct experts each, the grouping (counts, offsets, perm) built
 * here on the host. act = silu(x . gate^T) * (x . up^T) against a double reference (bf16 rounding,
 * 4e-3 relative, plus 1e-5 of the largest |act| where sums cancel), ye = act . down^T against a double reference on the kernel's own act (f32 sums in
 * another order: 1e-4 of the largest |ye|). Cases: 1 to 40 rows, experts with no rows, an expert
 * with more than 16 rows (its rows in two passes), partial 128-k steps and partial FP8 block rows,
 * gate/up as two parts and as one, Kimi's expert sizes, INT4 in the packed layout (moe_quant.h) as well.
 * Outputs are NaN-poisoned before each run and two runs must be bit-identical. The packed layout itself:
 * kdt_moe_quant_int4_pack's output read back and decoded here from moe_quant.h's description must give
 * every code (nibble, stored + 8) and every scale of the checkpoint's layout, and the same dequantized
 * values as the CPU's dequantizer, as must kdt_moe_quant_int4_dequant's bf16 (rounded from them); the
 * packed cases are packed in place by the loader's kdt_cuda_pack_experts. Without a CUDA device it prints
 * a SKIP line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "harness.h"
#include "model/quant.h"
}
#include "model/cuda.h"
#include "model/cuda/linear.h"
#include "model/cuda/moe_quant.h"

namespace {

uint64_t g_seed = 0x5eed0023ull;
uint32_t rand32() { return (uint32_t)kt_splitmix64(&g_seed); }
float uniform() { return (float)(rand32() >> 8) * (2.f / 16777216.f) - 1.f; } /* [-1, 1) */

/* E matrices [rows, cols] quantized, in one part: device codes and scales, host f32 dequantized. */
struct QMat {
    void *w = nullptr, *s = nullptr;
    float *f = nullptr; /* [E, rows, cols] */
};

bool cuda_ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) kt_fail("moe_quant: %s: %s", what, cudaGetErrorString(e));
    return e == cudaSuccess;
}

bool make_mat(bool int4, int E, int rows, int cols, QMat *m) {
    const size_t codes = (size_t)rows * (int4 ? cols / 2 : cols);
    const size_t sn = int4 ? (size_t)rows * (cols / 32) : (size_t)((rows + 127) / 128) * ((cols + 127) / 128);
    const size_t sb = int4 ? 2 : 4;
    unsigned char *w = (unsigned char *)malloc(codes * E);
    unsigned char *s = (unsigned char *)malloc(sn * sb * E);
    m->f = (float *)malloc((size_t)E * rows * cols * sizeof(float));
    for (size_t i = 0; i < codes * E; i++) {
        w[i] = (unsigned char)rand32();
        if (!int4 && (w[i] & 0x7F) == 0x7F) w[i] ^= 2; /* no NaN codes */
    }
    for (size_t i = 0; i < sn * E; i++) {
        const float v = 0.002f + 0.01f * (uniform() + 1.f);
        if (int4) {
            const __nv_bfloat16 b = __float2bfloat16_rn(v);
            memcpy(s + i * 2, &b, 2);
        } else memcpy(s + i * 4, &v, 4);
    }
    for (int e = 0; e < E; e++) {
        float *o = m->f + (size_t)e * rows * cols;
        if (int4) kdt_dequant_int4(w + codes * e, s + sn * sb * e, rows, cols, 32, o);
        else kdt_dequant_fp8(w + codes * e, s + sn * sb * e, rows, cols, 128, 128, o);
    }
    bool ok = cuda_ok(cudaMalloc(&m->w, codes * E), "malloc") && cuda_ok(cudaMalloc(&m->s, sn * sb * E), "malloc") &&
              cuda_ok(cudaMemcpy(m->w, w, codes * E, cudaMemcpyHostToDevice), "copy") &&
              cuda_ok(cudaMemcpy(m->s, s, sn * sb * E, cudaMemcpyHostToDevice), "copy");
    free(w);
    free(s);
    return ok;
}

void free_mat(QMat *m) {
    cudaFree(m->w);
    cudaFree(m->s);
    free(m->f);
}

kdt_dlin dlin(bool int4, int E, int N, int K, int N0, const QMat &a, const QMat *b) {
    kdt_dlin d{};
    d.fmt = int4 ? KDT_WFMT_INT4 : KDT_WFMT_FP8;
    d.N = N, d.K = K, d.n = E, d.N0 = N0, d.parts = b ? 2 : 1;
    d.w[0] = a.w, d.scale[0] = a.s;
    if (b) d.w[1] = b->w, d.scale[1] = b->s;
    return d;
}

/* One case: R rows of hid, K of E experts each (row r's first expert is `hot` for r < hot_rows), I. */
void run_case(bool int4, int R, int K, int E, int hid, int I, bool two_parts, int hot_rows, bool packed = false) {
    char name[160];
    snprintf(name, sizeof name, "moe_quant %s%s R %d K %d E %d hid %d I %d%s", int4 ? "int4" : "fp8", packed ? " packed" : "", R, K, E, hid,
             I, two_parts ? "" : " (gate/up one part)");
    /* Routing: K distinct experts a row; experts E - 2 and E - 1 never chosen (rows 0). */
    const int n = R * K, Eu = E - 2;
    int *idx = (int *)malloc(n * sizeof(int));
    for (int r = 0; r < R; r++)
        for (int k = 0; k < K; k++) {
            int e;
            bool dup;
            do {
                e = k == 0 && r < hot_rows ? 0 : (int)(rand32() % (uint32_t)Eu);
                dup = false;
                for (int j = 0; j < k; j++) dup |= idx[r * K + j] == e;
            } while (dup);
            idx[r * K + k] = e;
        }
    int *counts = (int *)calloc(E, sizeof(int)), *offs = (int *)malloc(E * sizeof(int)), *perm = (int *)malloc(n * sizeof(int));
    for (int i = 0; i < n; i++) counts[idx[i]]++;
    for (int e = 0, o = 0; e < E; o += counts[e], e++) offs[e] = o;
    for (int e = 0, p = 0; e < E; e++)
        for (int i = 0; i < n; i++)
            if (idx[i] == e) perm[p++] = i;
    int most = 0;
    for (int e = 0; e < E; e++) most = counts[e] > most ? counts[e] : most;

    __nv_bfloat16 *x = (__nv_bfloat16 *)malloc((size_t)R * hid * 2);
    for (size_t i = 0; i < (size_t)R * hid; i++) x[i] = __float2bfloat16_rn(uniform());
    QMat g, u, gu, dn;
    bool ok = two_parts ? make_mat(int4, E, I, hid, &g) && make_mat(int4, E, I, hid, &u) : make_mat(int4, E, 2 * I, hid, &gu);
    ok = ok && make_mat(int4, E, hid, I, &dn);
    kdt_dlin d_gu = two_parts ? dlin(int4, E, 2 * I, hid, I, g, &u) : dlin(int4, E, 2 * I, hid, 2 * I, gu, nullptr);
    kdt_dlin d_dn = dlin(int4, E, hid, I, hid, dn, nullptr);
    if (ok && packed) { /* in place, as the loader packs them */
        const kdt_status st = kdt_cuda_pack_experts(&d_gu, &d_dn);
        if (st != KDT_OK) kt_fail("%s: kdt_cuda_pack_experts: %s", name, kdt_last_error());
        if (st == KDT_OK && !(d_gu.packed == 1 && d_dn.packed == 1)) kt_fail("%s: kdt_cuda_pack_experts left them unpacked", name);
        ok = st == KDT_OK && d_gu.packed == 1 && d_dn.packed == 1;
    }

    void *dx = nullptr, *dact = nullptr;
    int32_t *dplan = nullptr;
    float *dye = nullptr;
    const size_t act_n = (size_t)n * I, ye_n = (size_t)n * hid;
    __nv_bfloat16 *act[2] = {(__nv_bfloat16 *)malloc(act_n * 2), (__nv_bfloat16 *)malloc(act_n * 2)};
    float *ye[2] = {(float *)malloc(ye_n * 4), (float *)malloc(ye_n * 4)};
    ok = ok && cuda_ok(cudaMalloc(&dx, (size_t)R * hid * 2), "malloc") && cuda_ok(cudaMalloc(&dact, act_n * 2), "malloc") &&
         cuda_ok(cudaMalloc(&dye, ye_n * 4), "malloc") && cuda_ok(cudaMalloc(&dplan, (size_t)(2 * E + n) * 4), "malloc") &&
         cuda_ok(cudaMemcpy(dx, x, (size_t)R * hid * 2, cudaMemcpyHostToDevice), "copy") &&
         cuda_ok(cudaMemcpy(dplan, counts, E * 4, cudaMemcpyHostToDevice), "copy") &&
         cuda_ok(cudaMemcpy(dplan + E, offs, E * 4, cudaMemcpyHostToDevice), "copy") &&
         cuda_ok(cudaMemcpy(dplan + 2 * E, perm, n * 4, cudaMemcpyHostToDevice), "copy");
    for (int run = 0; ok && run < 2; run++) {
        ok = cuda_ok(cudaMemset(dact, 0xFF, act_n * 2), "poison") && cuda_ok(cudaMemset(dye, 0xFF, ye_n * 4), "poison");
        const kdt_status st = ok ? kdt_moe_quant(R, dx, dplan + 2 * E, K, dplan, dplan + E, &d_gu, &d_dn, hid, I, dact, dye, 0) : KDT_OK;
        if (st != KDT_OK) kt_fail("%s: %s", name, kdt_last_error());
        ok = ok && st == KDT_OK && cuda_ok(cudaDeviceSynchronize(), "run") &&
             cuda_ok(cudaMemcpy(act[run], dact, act_n * 2, cudaMemcpyDeviceToHost), "copy") &&
             cuda_ok(cudaMemcpy(ye[run], dye, ye_n * 4, cudaMemcpyDeviceToHost), "copy");
    }
    if (ok) {
        /* act at place p (assignment perm[p] = row r, slot k; expert e = idx[perm[p]]). */
        size_t bad_act = 0, bad_ye = 0;
        double act_err = 0, act_max = 0, ye_err = 0, ye_max = 0;
        double *aref = (double *)malloc(act_n * sizeof(double)), *yref = (double *)malloc(ye_n * sizeof(double));
        for (int p = 0; p < n; p++) {
            const int r = perm[p] / K, e = idx[perm[p]];
            for (int c = 0; c < I; c++) {
                const float *wg = two_parts ? g.f + ((size_t)e * I + c) * hid : gu.f + ((size_t)e * 2 * I + c) * hid;
                const float *wu = two_parts ? u.f + ((size_t)e * I + c) * hid : gu.f + ((size_t)e * 2 * I + I + c) * hid;
                double a = 0, b = 0;
                for (int k = 0; k < hid; k++) {
                    const double xv = __bfloat162float(x[(size_t)r * hid + k]);
                    a += xv * wg[k], b += xv * wu[k];
                }
                aref[(size_t)p * I + c] = a / (1 + exp(-a)) * b;
                act_max = fmax(act_max, fabs(aref[(size_t)p * I + c]));
            }
            for (int c = 0; c < hid; c++) {
                const float *wd = dn.f + ((size_t)e * hid + c) * I;
                double a = 0;
                for (int k = 0; k < I; k++) a += (double)__bfloat162float(act[0][(size_t)p * I + k]) * wd[k];
                yref[(size_t)p * hid + c] = a;
                ye_max = fmax(ye_max, fabs(a));
            }
        }
        for (size_t i = 0; i < act_n; i++) { /* bf16 rounding, plus f32 sums where the result cancels to near 0 */
            const double err = fabs(__bfloat162float(act[0][i]) - aref[i]);
            act_err = fmax(act_err, err / fmax(fabs(aref[i]), 1e-2 * act_max));
            if (!(err <= 4e-3 * fabs(aref[i]) + 1e-5 * act_max)) bad_act++;
        }
        for (size_t i = 0; i < ye_n; i++) {
            const double err = fabs(ye[0][i] - yref[i]);
            ye_err = fmax(ye_err, err);
            if (!(err <= 1e-4 * ye_max)) bad_ye++;
        }
        const bool same = !memcmp(act[0], act[1], act_n * 2) && !memcmp(ye[0], ye[1], ye_n * 4);
        kt_check(!bad_act && !bad_ye && same,
                 "%s (most rows an expert %d, 2 experts without): act %zu of %zu outside 4e-3 (worst rel %.1e of max(|act|, 1e-2 max |act|)), ye %zu of %zu "
                 "outside 1e-4 of max |ye| %.2e (worst %.1e), runs %s",
                 name, most, bad_act, act_n, act_err, bad_ye, ye_n, ye_max, ye_err, same ? "bit-identical" : "DIFFER");
        free(aref);
        free(yref);
    } else kt_fail("%s: setup or run failed", name);
    if (two_parts) free_mat(&g), free_mat(&u);
    else free_mat(&gu);
    free_mat(&dn);
    cudaFree(dx), cudaFree(dact), cudaFree(dye), cudaFree(dplan);
    free(idx), free(counts), free(offs), free(perm), free(x), free(act[0]), free(act[1]), free(ye[0]), free(ye[1]);
}

/* kdt_moe_quant_int4_pack on random codes and scales of [rows, K], every byte of the output poisoned first,
 * decoded here from moe_quant.h's description of the layout. */
void check_pack(int rows, int K) {
    const size_t cb = (size_t)rows * K / 2, ns = (size_t)rows * (K / 32), S = K / 128;
    uint8_t *w = (uint8_t *)malloc(cb), *pw = (uint8_t *)malloc(cb);
    uint16_t *sc = (uint16_t *)malloc(ns * 2), *ps = (uint16_t *)malloc(ns * 2);
    float *f = (float *)malloc((size_t)rows * K * sizeof(float));
    for (size_t i = 0; i < cb; i++) w[i] = (uint8_t)rand32();
    for (size_t i = 0; i < ns; i++) {
        const __nv_bfloat16 b = __float2bfloat16_rn(uniform());
        memcpy(sc + i, &b, 2);
    }
    kdt_dequant_int4(w, sc, rows, K, 32, f);
    void *dw[2] = {}, *ds[2] = {};
    bool ok = cuda_ok(cudaMalloc(&dw[0], cb), "malloc") && cuda_ok(cudaMalloc(&dw[1], cb), "malloc") &&
              cuda_ok(cudaMalloc(&ds[0], ns * 2), "malloc") && cuda_ok(cudaMalloc(&ds[1], ns * 2), "malloc") &&
              cuda_ok(cudaMemcpy(dw[0], w, cb, cudaMemcpyHostToDevice), "copy") &&
              cuda_ok(cudaMemcpy(ds[0], sc, ns * 2, cudaMemcpyHostToDevice), "copy") && cuda_ok(cudaMemset(dw[1], 0xA5, cb), "poison") &&
              cuda_ok(cudaMemset(ds[1], 0xFF, ns * 2), "poison");
    const kdt_status st = ok ? kdt_moe_quant_int4_pack(dw[1], ds[1], dw[0], ds[0], rows, K, 0) : KDT_OK;
    if (st != KDT_OK) kt_fail("moe_quant pack: %s", kdt_last_error());
    ok = ok && st == KDT_OK && cuda_ok(cudaMemcpy(pw, dw[1], cb, cudaMemcpyDeviceToHost), "copy") &&
         cuda_ok(cudaMemcpy(ps, ds[1], ns * 2, cudaMemcpyDeviceToHost), "copy");
    /* the per-expert products' dequantizer on the packed layout: the CPU's values rounded to bf16 */
    kdt_dlin d{};
    d.fmt = KDT_WFMT_INT4, d.N = d.N0 = rows, d.K = K, d.n = d.parts = 1, d.packed = 1;
    d.w[0] = dw[1], d.scale[0] = ds[1];
    void *dq = nullptr;
    __nv_bfloat16 *q = (__nv_bfloat16 *)malloc((size_t)rows * K * 2);
    ok = ok && cuda_ok(cudaMalloc(&dq, (size_t)rows * K * 2), "malloc") && cuda_ok(cudaMemset(dq, 0xFF, (size_t)rows * K * 2), "poison");
    const kdt_status dst = ok ? kdt_moe_quant_int4_dequant(&d, 0, dq, 0) : KDT_OK;
    if (dst != KDT_OK) kt_fail("moe_quant dequantize: %s", kdt_last_error());
    ok = ok && dst == KDT_OK && cuda_ok(cudaMemcpy(q, dq, (size_t)rows * K * 2, cudaMemcpyDeviceToHost), "copy");
    size_t bad_code = 0, bad_scale = 0, bad_value = 0, bad_bf16 = 0;
    for (int r = 0; ok && r < rows; r++)
        for (int k = 0; k < K; k++) {
            /* block (tile r / 16, step k / 128); lane 4g + t, h, word G, value j of the lane's 8 */
            const size_t b = (size_t)(r / 16) * S + k / 128;
            const int g = r % 8, h = r % 16 / 8, G = k % 128 / 32, t = k % 32 / 8, j = k % 8;
            const uint32_t *word = (const uint32_t *)pw + b * 256 + h * 128 + (4 * g + t) * 4 + G;
            const int nib = (int)(*word >> (4 * (j % 2 ? 4 + j / 2 : j / 2)) & 15u);
            const uint16_t s16 = ps[b * 64 + g * 8 + G * 2 + h];
            bad_code += nib != (w[((size_t)r * K + k) / 2] >> (4 * (k % 2)) & 15);
            bad_scale += k % 32 == 0 && s16 != sc[(size_t)r * (K / 32) + k / 32];
            const uint32_t sbits = (uint32_t)s16 << 16;
            float v;
            memcpy(&v, &sbits, 4);
            v *= (float)(nib - 8);
            bad_value += memcmp(&v, &f[(size_t)r * K + k], 4) != 0;
            const __nv_bfloat16 want = __float2bfloat16_rn(f[(size_t)r * K + k]);
            bad_bf16 += memcmp(&want, &q[(size_t)r * K + k], 2) != 0;
        }
    if (ok)
        kt_check(!bad_code && !bad_scale && !bad_value && !bad_bf16, "moe_quant int4 pack [%d, %d]: %zu of %zu codes, %zu of %zu scales, "
                 "%zu values differ from the checkpoint's layout (CPU dequantizer); kdt_moe_quant_int4_dequant: %zu bf16 values differ",
                 rows, K, bad_code, (size_t)rows * K, bad_scale, ns, bad_value, bad_bf16);
    else kt_fail("moe_quant int4 pack [%d, %d]: setup or run failed", rows, K);
    for (int i = 0; i < 2; i++) cudaFree(dw[i]), cudaFree(ds[i]);
    cudaFree(dq);
    free(w), free(pw), free(sc), free(ps), free(f), free(q);
}

/* kdt_lin (the forward's per-expert products of large batches) on packed experts: E experts packed in
 * place by kdt_cuda_pack_experts against the same experts in the checkpoint's layout, matrix e of gate/up
 * and of down, at M = 80 rows (past KDT_LIN_QGEMM_ROWS: both dequantized to bf16, then cuBLAS, so the same
 * bits) and M = 5 (the checkpoint's layout through the decode GEMM), against a double reference on the
 * CPU's dequantized weights (1e-2 of the largest |y|: the dequantized weights rounded to bf16, 3.8e-3 measured). */
void check_lin(int E, int hid, int I, int e) {
    QMat gu, dn;
    bool ok = make_mat(true, E, 2 * I, hid, &gu) && make_mat(true, E, hid, I, &dn);
    kdt_dlin u_gu = dlin(true, E, 2 * I, hid, 2 * I, gu, nullptr), u_dn = dlin(true, E, hid, I, hid, dn, nullptr);
    kdt_dlin p_gu = u_gu, p_dn = u_dn; /* copies of the device arrays, then packed */
    for (kdt_dlin *d : {&p_gu, &p_dn}) {
        const size_t rows = (size_t)E * d->N;
        void *w = nullptr, *sc = nullptr;
        ok = ok && cuda_ok(cudaMalloc(&w, rows * d->K / 2), "malloc") && cuda_ok(cudaMalloc(&sc, rows * (d->K / 16)), "malloc") &&
             cuda_ok(cudaMemcpy(w, d->w[0], rows * d->K / 2, cudaMemcpyDeviceToDevice), "copy") &&
             cuda_ok(cudaMemcpy(sc, d->scale[0], rows * (d->K / 16), cudaMemcpyDeviceToDevice), "copy");
        d->w[0] = w, d->scale[0] = sc;
    }
    const kdt_status ps = ok ? kdt_cuda_pack_experts(&p_gu, &p_dn) : KDT_OK;
    if (ps != KDT_OK) kt_fail("moe_quant lin: kdt_cuda_pack_experts: %s", kdt_last_error());
    ok = ok && ps == KDT_OK && p_gu.packed == 1 && p_dn.packed == 1;
    kdt_lin_ctx c = {};
    c.dt = KDT_BF16;
    const int M = 80, most = 2 * I > hid ? 2 * I : hid, kmax = hid > I ? hid : I;
    ok = ok && cublasCreate(&c.blas) == CUBLAS_STATUS_SUCCESS && cuda_ok(cudaMalloc(&c.deq, (size_t)most * kmax * 2), "malloc") &&
         cuda_ok(cudaMalloc(&c.tmp, (size_t)M * most * 4), "malloc");
    void *dx = nullptr;
    float *dy = nullptr;
    __nv_bfloat16 *x = (__nv_bfloat16 *)malloc((size_t)M * kmax * 2);
    float *y[2] = {(float *)malloc((size_t)M * most * 4), (float *)malloc((size_t)M * most * 4)};
    for (size_t i = 0; i < (size_t)M * kmax; i++) x[i] = __float2bfloat16_rn(uniform());
    ok = ok && cuda_ok(cudaMalloc(&dx, (size_t)M * kmax * 2), "malloc") && cuda_ok(cudaMalloc(&dy, (size_t)M * most * 4), "malloc") &&
         cuda_ok(cudaMemcpy(dx, x, (size_t)M * kmax * 2, cudaMemcpyHostToDevice), "copy");
    for (int which = 0; ok && which < 2; which++)
        for (int m : {M, 5}) {
            const kdt_dlin &u = which ? u_dn : u_gu, &p = which ? p_dn : p_gu;
            const QMat &q = which ? dn : gu;
            const int N = u.N, K = u.K;
            for (int run = 0; ok && run < 2; run++) { /* 0: packed, 1: the checkpoint's layout */
                kdt_status st = cuda_ok(cudaMemset(dy, 0xFF, (size_t)m * N * 4), "poison") ? KDT_OK : KDT_ERR_CUDA;
                if (st == KDT_OK) st = kdt_lin(&c, run ? &u : &p, e, m, dx, dy, 0);
                if (st != KDT_OK) kt_fail("moe_quant lin: kdt_lin: %s", kdt_last_error());
                ok = st == KDT_OK && cuda_ok(cudaDeviceSynchronize(), "lin") &&
                     cuda_ok(cudaMemcpy(y[run], dy, (size_t)m * N * 4, cudaMemcpyDeviceToHost), "copy");
            }
            if (!ok) break;
            double ymax = 0, err = 0;
            for (int r = 0; r < m; r++)
                for (int n = 0; n < N; n++) {
                    const float *wr = q.f + ((size_t)e * N + n) * K;
                    double a = 0;
                    for (int k = 0; k < K; k++) a += (double)__bfloat162float(x[(size_t)r * K + k]) * wr[k];
                    ymax = fmax(ymax, fabs(a));
                    const double d = fabs(y[0][(size_t)r * N + n] - a);
                    err = d == d ? fmax(err, d) : INFINITY;
                }
            const bool same = !memcmp(y[0], y[1], (size_t)m * N * 4);
            kt_check(err <= 1e-2 * ymax && (m <= KDT_LIN_QGEMM_ROWS || same),
                     "moe_quant lin: kdt_lin on packed INT4 %s [%d, %d] of expert %d, %d rows: worst |d| %.1e of max |y| %.2e (1e-2 allowed)%s",
                     which ? "down" : "gate/up", N, K, e, m, err, ymax,
                     m > KDT_LIN_QGEMM_ROWS ? (same ? ", the same bits as the checkpoint's layout" : ", DIFFERS from the checkpoint's layout") : "");
        }
    if (!ok) kt_fail("moe_quant lin: setup or run failed");
    if (c.blas) cublasDestroy(c.blas);
    cudaFree(c.deq), cudaFree(c.tmp), cudaFree(dx), cudaFree(dy);
    for (const kdt_dlin *d : {&p_gu, &p_dn}) cudaFree(d->w[0]), cudaFree(d->scale[0]);
    free_mat(&gu), free_mat(&dn);
    free(x), free(y[0]), free(y[1]);
}

} // namespace

int main() {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        kt_skip("moe_quant: grouped INT4 / FP8 expert kernels: no CUDA device");
        return kt_exit_code();
    }
    /* int4, R, K, E, hid, I, two parts, rows whose first expert is expert 0 */
    run_case(true, 1, 4, 16, 256, 128, true, 0);
    run_case(true, 5, 3, 12, 96, 64, true, 0);     /* K = 96: a partial 128-k step */
    run_case(true, 8, 8, 40, 512, 160, false, 8);  /* an expert with all 8 rows; gate/up in one part */
    run_case(true, 24, 2, 10, 160, 96, true, 20);  /* 20 rows on expert 0: two passes */
    run_case(true, 40, 6, 64, 320, 64, true, 17);
    run_case(false, 1, 2, 8, 400, 144, true, 0);   /* FP8: partial steps, partial block rows */
    run_case(false, 7, 3, 10, 272, 48, false, 5);
    run_case(false, 20, 4, 24, 128, 208, true, 18);
    run_case(true, 1, 3, 5, 7168, 2048, true, 0);  /* Kimi K2.6's expert sizes */
    run_case(false, 2, 3, 5, 7168, 512, true, 0);
    check_pack(48, 384);
    check_pack(2048, 7168); /* a K2.6 expert's gate */
    check_lin(3, 256, 128, 1);
    /* the packed layout (packed in place by kdt_cuda_pack_experts) */
    run_case(true, 1, 4, 16, 256, 128, true, 0, true);
    run_case(true, 8, 8, 40, 512, 256, false, 8, true);
    run_case(true, 24, 2, 10, 128, 384, true, 20, true);
    run_case(true, 40, 6, 64, 384, 128, true, 17, true);
    run_case(true, 1, 3, 5, 7168, 2048, true, 0, true);
    run_case(true, 40, 8, 64, 128, 640, true, 3, true); /* 64 experts x 10 column blocks: gate/up's K unsplit */
    return kt_exit_code();
}
