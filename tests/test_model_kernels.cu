/* The forward's small row kernels (src/model/cuda/kernels.cu, route.cu) on the GPU against the
 * CPU, on fresh random inputs, outputs NaN-poisoned first:
 * - kdt_mk_rmsnorm against a double reference (1e-5 relative; bf16 outputs within their rounding),
 *   rows picked through `rows`, strided input and outputs whose gaps must stay poisoned; a row's
 *   bits are the same alone (its row cut over several blocks) and in a batch of 300 (one block);
 * - kdt_mk_moe_combine against a double reference: K choices with invalid ones, in any order,
 *   the shared expert, widths that are and are not a multiple of 4;
 * - kdt_mk_route_plan (one block) against kdt_mk_route + kdt_mk_moe_plan (one block per row, per
 *   expert): the same experts, weights, counts, offsets, perm and places, bit for bit, at Kimi K2's
 *   384 experts and DeepSeek-V3's 8 groups;
 * - the wide router (kdt_mk_route_plan computing the scores of a large router over the GPU, after
 *   the layer's norm, in the same launch up to 4 rows): the norm's bits are kdt_mk_rmsnorm's, the
 *   scores within 1e-5 of a double reference, the choice and grouping those of route + moe_plan on
 *   its own scores, two runs the same bits, a row's bits the same alone (norm in the launch) and in
 *   a batch of up to 64 (norm launched before), the ticket left at zero.
 * Without a CUDA device it prints a SKIP line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "harness.h"
}
#include "model/cuda/kernels.h"
#include "model/cuda/route.h"

namespace {

uint64_t g_seed = 0x5eed0021ull;
uint32_t rand32() { return (uint32_t)kt_splitmix64(&g_seed); }
float uniform() { return (float)(rand32() >> 8) * (2.f / 16777216.f) - 1.f; } /* [-1, 1) */

/* A device copy of n floats (or ints) from host; NULL on failure (reported). */
template <typename T> T *upload(const T *h, size_t n) {
    T *d = nullptr;
    if (cudaMalloc(&d, n * sizeof(T) + 16) != cudaSuccess || cudaMemcpy(d, h, n * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess) {
        kt_fail("model kernels: upload of %zu bytes", n * sizeof(T));
        return nullptr;
    }
    return d;
}
template <typename T> T *poisoned_dev(size_t n) {
    T *d = nullptr;
    if (cudaMalloc(&d, n * sizeof(T) + 16) != cudaSuccess || cudaMemset(d, 0xFF, n * sizeof(T)) != cudaSuccess) return nullptr;
    return d;
}
template <typename T> void download(T *h, const T *d, size_t n) {
    if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpy(h, d, n * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess)
        kt_fail("model kernels: download: %s", cudaGetErrorString(cudaGetLastError()));
}
bool is_poison(uint32_t bits) { return bits == 0xFFFFFFFFu; }

/* R output rows of rmsnorm over rows rows[i] of x [NX, ld]; out f32 [R, ld] and bf16 [R, ld]
 * (gaps past n poisoned); returns the f32 output (host). */
void rmsnorm_case(int R, int n, int NX, bool pick) {
    const int ld = n + 5;
    float *x = (float *)malloc((size_t)NX * ld * 4), *w = (float *)malloc((size_t)n * 4);
    int32_t *rows = (int32_t *)malloc((size_t)R * 4);
    for (size_t i = 0; i < (size_t)NX * ld; i++) x[i] = uniform() * 3.f;
    for (int j = 0; j < n; j++) w[j] = 1.f + 0.5f * uniform();
    for (int i = 0; i < R; i++) rows[i] = pick ? (int32_t)(rand32() % (uint32_t)NX) : i;
    float *dx = upload(x, (size_t)NX * ld), *dw = upload(w, n), *of = poisoned_dev<float>((size_t)R * ld);
    int32_t *drows = pick ? upload(rows, R) : nullptr;
    __nv_bfloat16 *oa = poisoned_dev<__nv_bfloat16>((size_t)R * ld);
    const kdt_status s = kdt_mk_rmsnorm(dx, ld, drows, R, n, dw, 1e-6f, of, ld, oa, ld, KDT_BF16, 0);
    float *gf = kt_poisoned((size_t)R * ld);
    uint16_t *ga = (uint16_t *)malloc((size_t)R * ld * 2);
    download(gf, of, (size_t)R * ld);
    download(ga, (const uint16_t *)oa, (size_t)R * ld);
    double err = 0, err_a = 0;
    bool gaps = true;
    for (int i = 0; i < R; i++) {
        const float *xr = x + (size_t)rows[i] * ld;
        double ss = 0;
        for (int j = 0; j < n; j++) ss += (double)xr[j] * xr[j];
        const double inv = 1.0 / sqrt(ss / n + 1e-6);
        for (int j = 0; j < ld; j++) {
            uint32_t b;
            memcpy(&b, &gf[(size_t)i * ld + j], 4);
            if (j >= n) {
                gaps &= is_poison(b) && ga[(size_t)i * ld + j] == 0xFFFF;
                continue;
            }
            const double want = w[j] * xr[j] * inv;
            const uint32_t ab = (uint32_t)ga[(size_t)i * ld + j] << 16;
            float a;
            memcpy(&a, &ab, 4);
            err = fmax(err, fabs(gf[(size_t)i * ld + j] - want) / (fabs(want) + 1e-3));
            err_a = fmax(err_a, fabs(a - want) / (fabs(want) + 1e-3));
            if (isnan(gf[(size_t)i * ld + j]) || isnan(a)) err = err_a = INFINITY;
        }
    }
    kt_check(s == KDT_OK && err <= 1e-5 && err_a <= 8e-3 && gaps,
             "rmsnorm: %d rows of %d%s: f32 rel err %.1e (<= 1e-5), bf16 %.1e (<= 8e-3), gaps untouched %s", R, n,
             pick ? " picked by rows" : "", err, err_a, gaps ? "yes" : "NO");
    /* Row 0 alone: the same bits as in the batch (another grid). */
    if (R > 1) {
        float *of1 = poisoned_dev<float>((size_t)ld);
        const kdt_status s1 = kdt_mk_rmsnorm(dx, ld, drows, 1, n, dw, 1e-6f, of1, ld, nullptr, 0, KDT_BF16, 0);
        float *g1 = kt_poisoned(ld);
        download(g1, of1, ld);
        kt_check(s1 == KDT_OK && !memcmp(g1, gf, (size_t)n * 4), "rmsnorm: width %d, row 0 alone and in a batch of %d: the same bits", n,
                 R);
        free(g1);
        cudaFree(of1);
    }
    free(x), free(w), free(rows), free(gf), free(ga);
    cudaFree(dx), cudaFree(dw), cudaFree(of), cudaFree(oa), cudaFree(drows);
}

/* x [R, hid] += the row's valid choices of ye by weight, then the shared expert's row. */
void combine_case(int R, int K, int E, int hid, bool shared) {
    const int n = R * K, ny = n + (shared ? R : 0);
    float *x = (float *)malloc((size_t)R * hid * 4), *ye = (float *)malloc((size_t)ny * hid * 4), *wt = (float *)malloc((size_t)n * 4);
    int32_t *idx = (int32_t *)malloc((size_t)n * 4), *pos = (int32_t *)malloc((size_t)n * 4);
    for (size_t i = 0; i < (size_t)R * hid; i++) x[i] = uniform();
    for (size_t i = 0; i < (size_t)ny * hid; i++) ye[i] = uniform();
    for (int r = 0; r < R; r++)
        for (int k = 0; k < K; k++) {
            const int a = r * K + k;
            idx[a] = k == 1 ? -1 : k == 2 ? E + 3 : (int32_t)((uint32_t)(r * 7 + k * 13 + 5) % (uint32_t)E); /* two invalid */
            wt[a] = uniform();
            pos[a] = (a * 5 + 3) % n; /* a permutation when gcd(5, n) = 1 */
        }
    float *dx = upload(x, (size_t)R * hid), *dy = upload(ye, (size_t)ny * hid), *dw = upload(wt, n);
    int32_t *di = upload(idx, n), *dp = upload(pos, n);
    const kdt_status s = kdt_mk_moe_combine(dx, dy, di, dw, dp, R, K, E, hid, shared, 0);
    float *got = kt_poisoned((size_t)R * hid);
    download(got, dx, (size_t)R * hid);
    double err = 0;
    for (int r = 0; r < R; r++)
        for (int i = 0; i < hid; i++) {
            double want = x[(size_t)r * hid + i];
            for (int k = 0; k < K; k++) {
                const int a = r * K + k;
                if (idx[a] >= 0 && idx[a] < E) want += (double)wt[a] * ye[(size_t)pos[a] * hid + i];
            }
            if (shared) want += ye[((size_t)n + r) * hid + i];
            const double e = fabs(got[(size_t)r * hid + i] - want);
            err = isnan(e) ? INFINITY : fmax(err, e);
        }
    kt_check(s == KDT_OK && err <= 1e-5, "moe_combine: %d rows, top %d of %d, width %d%s: max abs err %.1e (<= 1e-5)", R, K, E, hid,
             shared ? ", shared expert" : "", err);
    free(x), free(ye), free(wt), free(idx), free(pos), free(got);
    cudaFree(dx), cudaFree(dy), cudaFree(dw), cudaFree(di), cudaFree(dp);
}

/* route_plan against route + moe_plan on the same logits [R, E]. */
void route_case(int R, int E, int G, int tg, int K) {
    const int n = R * K;
    float *logits = (float *)malloc((size_t)R * E * 4), *bias = (float *)malloc((size_t)E * 4);
    for (size_t i = 0; i < (size_t)R * E; i++) logits[i] = 3.f * uniform();
    for (int e = 0; e < E; e++) bias[e] = 0.05f * uniform();
    float *dl = upload(logits, (size_t)R * E), *db = upload(bias, E);
    int32_t *ints[2][6];
    float *wts[2];
    const size_t sizes[6] = {(size_t)n, (size_t)E, (size_t)E, (size_t)n, (size_t)n, 0}; /* idx counts offs perm pos */
    for (int v = 0; v < 2; v++) {
        for (int i = 0; i < 5; i++) ints[v][i] = poisoned_dev<int32_t>(sizes[i]);
        wts[v] = poisoned_dev<float>(n);
    }
    kdt_status s = kdt_mk_route(dl, db, R, E, G, tg, K, 1, 2.5f, ints[0][0], wts[0], 0);
    if (s == KDT_OK) s = kdt_mk_moe_plan(ints[0][0], n, E, ints[0][1], ints[0][2], ints[0][3], ints[0][4], 0);
    if (s == KDT_OK)
        s = kdt_mk_route_plan(nullptr, nullptr, 0, dl, db, R, E, G, tg, K, 1, 2.5f, ints[1][0], wts[1], ints[1][1], ints[1][2],
                              ints[1][3], ints[1][4], nullptr, nullptr, KDT_BF16, nullptr, 0);
    bool same = s == KDT_OK;
    for (int i = 0; i < 5; i++) {
        int32_t *a = (int32_t *)malloc(sizes[i] * 4), *b = (int32_t *)malloc(sizes[i] * 4);
        download(a, ints[0][i], sizes[i]);
        download(b, ints[1][i], sizes[i]);
        same &= !memcmp(a, b, sizes[i] * 4);
        free(a), free(b);
    }
    float *a = kt_poisoned(n), *b = kt_poisoned(n);
    download(a, wts[0], n);
    download(b, wts[1], n);
    same &= !memcmp(a, b, (size_t)n * 4) && !isnan(a[0]);
    kt_check(same, "route_plan: %d rows, %d experts in %d groups (%d kept), top %d: the bits of route + moe_plan", R, E, G, tg, K);
    free(a), free(b), free(logits), free(bias);
    for (int v = 0; v < 2; v++) {
        for (int i = 0; i < 5; i++) cudaFree(ints[v][i]);
        cudaFree(wts[v]);
    }
    cudaFree(dl), cudaFree(db);
}

/* The wide router on R rows of x [R, hid] (its norm first) and w [E, hid]; with R > 1, row 0 again alone. */
void wide_case(int R, int E, int G, int tg, int K, int hid) {
    const int n = R * K;
    float *x = (float *)malloc((size_t)R * hid * 4), *nw = (float *)malloc((size_t)hid * 4), *w = (float *)malloc((size_t)E * hid * 4);
    float *bias = (float *)malloc((size_t)E * 4);
    for (size_t i = 0; i < (size_t)R * hid; i++) x[i] = 2.f * uniform();
    for (int j = 0; j < hid; j++) nw[j] = 1.f + 0.3f * uniform();
    for (size_t i = 0; i < (size_t)E * hid; i++) w[i] = uniform() / sqrtf((float)hid);
    for (int e = 0; e < E; e++) bias[e] = 0.05f * uniform();
    float *dx = upload(x, (size_t)R * hid), *dnw = upload(nw, hid), *dw = upload(w, (size_t)E * hid), *db = upload(bias, E);
    int32_t zero = 0, *ticket = upload(&zero, 1);
    float *h = poisoned_dev<float>((size_t)R * hid), *h2 = poisoned_dev<float>((size_t)R * hid), *lg = poisoned_dev<float>((size_t)R * E);
    __nv_bfloat16 *hn = poisoned_dev<__nv_bfloat16>((size_t)R * hid);
    int32_t *o[2][5];
    float *wt[2];
    const size_t sizes[5] = {(size_t)n, (size_t)E, (size_t)E, (size_t)n, (size_t)n};
    for (int v = 0; v < 2; v++) {
        for (int i = 0; i < 5; i++) o[v][i] = poisoned_dev<int32_t>(sizes[i]);
        wt[v] = poisoned_dev<float>(n);
    }
    const kdt_mk_norm nin = {dx, dnw, nullptr, 1e-6f};
    kdt_status s = KDT_OK;
    int32_t *first[5] = {};
    float *first_wt = nullptr, *first_lg = nullptr;
    for (int run = 0; run < 2 && s == KDT_OK; run++) { /* twice: the ticket is left at zero, the bits do not change */
        s = kdt_mk_route_plan(h, dw, hid, lg, db, R, E, G, tg, K, 1, 2.5f, o[1][0], wt[1], o[1][1], o[1][2], o[1][3], o[1][4], &nin, hn,
                              KDT_BF16, ticket, 0);
        if (run == 0) {
            for (int i = 0; i < 5; i++) {
                first[i] = (int32_t *)malloc(sizes[i] * 4);
                download(first[i], o[1][i], sizes[i]);
            }
            first_wt = kt_poisoned(n);
            first_lg = kt_poisoned((size_t)R * E);
            download(first_wt, wt[1], n);
            download(first_lg, lg, (size_t)R * E);
        }
    }
    if (s == KDT_OK) s = kdt_mk_rmsnorm(dx, hid, nullptr, R, hid, dnw, 1e-6f, h2, hid, nullptr, 0, KDT_BF16, 0);
    if (s == KDT_OK) s = kdt_mk_route(lg, db, R, E, G, tg, K, 1, 2.5f, o[0][0], wt[0], 0);
    if (s == KDT_OK) s = kdt_mk_moe_plan(o[0][0], n, E, o[0][1], o[0][2], o[0][3], o[0][4], 0);
    float *gh = kt_poisoned((size_t)R * hid), *gh2 = kt_poisoned((size_t)R * hid), *glg = kt_poisoned((size_t)R * E);
    download(gh, h, (size_t)R * hid);
    download(gh2, h2, (size_t)R * hid);
    download(glg, lg, (size_t)R * E);
    double err = 0;
    for (int r = 0; r < R; r++)
        for (int e = 0; e < E; e++) {
            double want = 0;
            for (int i = 0; i < hid; i++) want += (double)gh[(size_t)r * hid + i] * w[(size_t)e * hid + i];
            const double d = fabs(glg[(size_t)r * E + e] - want);
            err = isnan(d) ? INFINITY : fmax(err, d);
        }
    bool same = s == KDT_OK && !memcmp(gh, gh2, (size_t)R * hid * 4) && !memcmp(glg, first_lg, (size_t)R * E * 4);
    for (int i = 0; i < 5; i++) {
        int32_t *a = (int32_t *)malloc(sizes[i] * 4), *b = (int32_t *)malloc(sizes[i] * 4);
        download(a, o[0][i], sizes[i]);
        download(b, o[1][i], sizes[i]);
        same &= !memcmp(a, b, sizes[i] * 4) && !memcmp(b, first[i], sizes[i] * 4);
        free(a), free(b);
    }
    float *a = kt_poisoned(n), *b = kt_poisoned(n);
    download(a, wt[0], n);
    download(b, wt[1], n);
    same &= !memcmp(a, b, (size_t)n * 4) && !memcmp(b, first_wt, (size_t)n * 4) && !isnan(a[0]);
    int32_t left = -1;
    download(&left, ticket, 1);
    kt_check(same && err <= 1e-5 && left == 0,
             "wide router: %d rows, %d experts in %d groups, top %d, hidden %d: norm as kdt_mk_rmsnorm, scores err %.1e (<= 1e-5), choice "
             "and grouping as route + moe_plan, two runs alike: %s; ticket left %d",
             R, E, G, K, hid, err, same ? "yes" : "NO", left);
    if (R > 1) { /* row 0 alone: the same norm, scores and choice */
        s = kdt_mk_route_plan(h2, dw, hid, lg, db, 1, E, G, tg, K, 1, 2.5f, o[0][0], wt[0], o[0][1], o[0][2], o[0][3], o[0][4], &nin,
                              hn, KDT_BF16, ticket, 0);
        float *l1 = kt_poisoned(E), *w1 = kt_poisoned(K);
        int32_t i1[64];
        download(l1, lg, E);
        download(i1, o[0][0], K);
        download(w1, wt[0], K);
        kt_check(s == KDT_OK && !memcmp(l1, glg, (size_t)E * 4) && !memcmp(i1, first[0], (size_t)K * 4) &&
                     !memcmp(w1, first_wt, (size_t)K * 4),
                 "wide router: row 0's scores, experts and weights have the same bits alone and in a batch of %d", R);
        free(l1), free(w1);
    }
    for (int i = 0; i < 5; i++) free(first[i]);
    free(x), free(nw), free(w), free(bias), free(gh), free(gh2), free(glg), free(a), free(b), free(first_wt), free(first_lg);
    for (int v = 0; v < 2; v++) {
        for (int i = 0; i < 5; i++) cudaFree(o[v][i]);
        cudaFree(wt[v]);
    }
    cudaFree(dx), cudaFree(dnw), cudaFree(dw), cudaFree(db), cudaFree(ticket), cudaFree(h), cudaFree(h2), cudaFree(lg), cudaFree(hn);
}

} // namespace

int main() {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        kt_skip("model kernels: rmsnorm, moe_combine, route_plan: no CUDA device");
        return 0;
    }
    rmsnorm_case(1, 7168, 1, false);
    rmsnorm_case(16, 7168, 16, false);
    rmsnorm_case(300, 7168, 300, false);
    rmsnorm_case(5, 1536, 40, true);
    rmsnorm_case(3, 100, 3, false);
    combine_case(1, 8, 384, 7168, true);
    combine_case(16, 8, 384, 7168, false);
    combine_case(3, 6, 16, 7166, true);
    combine_case(200, 8, 64, 256, true);
    route_case(1, 384, 1, 1, 8);
    route_case(16, 384, 1, 1, 8);
    route_case(64, 384, 1, 1, 8);
    route_case(16, 256, 8, 4, 8);
    wide_case(1, 384, 1, 1, 8, 7168);
    wide_case(16, 384, 1, 1, 8, 7168);
    wide_case(7, 256, 8, 4, 8, 1024);
    wide_case(3, 16, 1, 1, 8, 7168);
    wide_case(17, 16, 1, 1, 8, 7168);  /* a 17-row tree (bench_spec's oracle): the wide router past 16 rows */
    wide_case(64, 384, 1, 1, 8, 7168); /* the most rows it takes */
    return kt_exit_code();
}
