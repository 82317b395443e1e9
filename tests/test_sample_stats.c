/* Losslessness of tree_sample_accept by statistics: many requests over the same tree
 * and logits, each with its own seed, and chi-square tests that
 *   (a) the first emitted token is distributed as the target's filtered distribution at the root,
 *   (b) the token after an accepted child (node 1) is distributed as the target's distribution there,
 *   (c) tokens the filters (top-k, top-p) remove never appear,
 * for deterministic and for sampled children; and
 *   (d) wrong rules, reimplemented here on the same draws, fail the same test (a).
 * The expected distributions are computed here in double precision from the words of docs/interfaces.md 2.4 (softmax,
 * top-k, top-p by sorting), independently of the library's integer weights.
 *
 * Sizes: N = 200000 requests per configuration; the categories are the 16 tokens, those expected
 * below 20 pooled; a test fails at p < 1e-4 (Wilson-Hilferty). A bias of total variation d gives a
 * noncentrality of at least N (2d)^2: 320 for d = 2% at the root (power > 0.9999 against the
 * critical value ~42 at 15 degrees of freedom); the conditional test (b) sees the requests that
 * accept node 1 (44000 .. 146000 here). Each test also checks its power on its own counts: the
 * same counts against the target with 2% moved between its two likeliest tokens (the least
 * visible 2% bias) must be rejected. The seeds are fixed, so a run cannot flake: the same draws
 * come every time, on either backend. Runs on cpu, and on cuda where present. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sample_math.h"
#include "harness.h"
#include "sample_device.h"

enum { V = 16, Q = 8, NREQ = 200000, CHUNK = 50000 };
static const double kAlpha = 1e-4;
/* The tree: root 0 -> 1, 2, 3; 1 -> 4, 5; 2 -> 6; 4 -> 7. */
static const int32_t kParent[Q] = {-1, 0, 0, 0, 1, 1, 2, 4};

static const double kRootP[V] = {0.22, 0.15, 0.12, 0.1, 0.08, 0.07, 0.06, 0.05,
                                 0.04, 0.035, 0.025, 0.02, 0.015, 0.01, 0.004, 0.001};

typedef struct config {
    const char *name;
    float T, P;
    int32_t K;
    int sampled;          /* children drawn from draft rows; else the fixed tokens below */
    int32_t tok[Q];       /* deterministic children's tokens (node 3 repeats node 1's) */
} config;

static float logit(int32_t row, int32_t v) { return (float)log(kRootP[(v + 16 - 3 * row % 16) % 16]); }
static float draft_logit(int32_t row, int32_t v) { return logit(row, (v + 1) % V) + (v % 3 == 0 ? 0.5f : 0.0f); }

/* The filtered target distribution of a row in double: softmax(l / T), top-k then top-p. */
static void target_dist(const config *c, int32_t row, double *p) {
    double s[V], sorted[V], mx = -INFINITY, z = 0;
    for (int v = 0; v < V; v++) s[v] = (double)logit(row, v) / c->T, mx = fmax(mx, s[v]);
    for (int v = 0; v < V; v++) sorted[v] = s[v];
    for (int i = 0; i < V; i++) /* descending */
        for (int j = i + 1; j < V; j++)
            if (sorted[j] > sorted[i]) { double t = sorted[i]; sorted[i] = sorted[j]; sorted[j] = t; }
    double cut = c->K > 0 && c->K < V ? sorted[c->K - 1] : -INFINITY;
    for (int v = 0; v < V; v++) z += s[v] >= cut ? exp(s[v] - mx) : 0;
    if (c->P < 1.0f) {
        double cum = 0;
        for (int i = 0; i < V && sorted[i] >= cut; i++) {
            cum += exp(sorted[i] - mx) / z;
            if (cum >= c->P && (i + 1 == V || sorted[i + 1] != sorted[i])) { cut = sorted[i]; break; }
        }
    }
    z = 0;
    for (int v = 0; v < V; v++) z += p[v] = s[v] >= cut ? exp(s[v] - mx) : 0;
    for (int v = 0; v < V; v++) p[v] /= z;
}

typedef struct verdict {
    double chi2, pval;
    int df;
    long n, outside; /* samples; samples on tokens of probability 0 */
} verdict;

static verdict chi2_test(const long *count, const double *p) {
    verdict r = {0};
    for (int v = 0; v < V; v++) r.n += count[v];
    double pooled_o = 0, pooled_e = 0;
    int bins = 0;
    for (int v = 0; v < V; v++) {
        const double e = p[v] * r.n;
        if (p[v] == 0) { r.outside += count[v]; continue; }
        if (e < 20) { pooled_o += count[v], pooled_e += e; continue; }
        r.chi2 += (count[v] - e) * (count[v] - e) / e, bins++;
    }
    if (pooled_e > 0) r.chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e, bins++;
    r.df = bins - 1;
    r.pval = r.df > 0 ? kt_chi2_sf(r.chi2, r.df) : 1.0;
    return r;
}

/* p with 0.02 of probability moved from its most likely token to the second: a 2% bias where a
 * chi-square test is least sensitive (both categories large). */
static void shift_mass(const double *p, double *out) {
    int a = 0, b = -1;
    for (int v = 0; v < V; v++) a = p[v] > p[a] ? v : a;
    for (int v = 0; v < V; v++)
        if (v != a && (b < 0 || p[v] > p[b])) b = v;
    for (int v = 0; v < V; v++) out[v] = p[v];
    out[a] -= 0.02, out[b] += 0.02;
}

static uint64_t mix(uint64_t z) { /* splitmix64's finalizer: the test's own draws of sampled children */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int32_t draw_token(const double *q, uint64_t key) {
    const double u = (double)(mix(key) >> 11) * 0x1p-53;
    double cum = 0;
    for (int v = 0; v < V; v++)
        if (u < (cum += q[v])) return v;
    return V - 1;
}

/* Wrong rules for (d), on the library's own draws at the root (no filters). WRONG_NONE must give
 * exactly the library's first token: it shows the reimplementation is faithful but for the bug. */
enum { WRONG_NONE, WRONG_KEEP_REJECTED, WRONG_ACCEPT_BY_P, WRONG_NO_RESIDUAL };

static int32_t first_token(const float *row, const float *qrow, const int32_t *tok, uint64_t seed, uint32_t b, int bug) {
    float key[V], m = -INFINITY;
    uint64_t w[V], qw[V], Z = 0, Qz = 0;
    for (int v = 0; v < V; v++) key[v] = kdt_sample_key(row[v], 1.0f), m = key[v] > m ? key[v] : m;
    for (int v = 0; v < V; v++) Z += w[v] = kdt_sample_weight(key[v], m);
    for (int v = 0; v < V && qrow; v++) Qz += qw[v] = kdt_draft_weight(qrow[v]);
    for (uint32_t j = 0, c = 1; c < Q; c++) {
        if (kParent[c] != 0) continue;
        const int32_t x = tok[c];
        const double u = kdt_sample_uniform(seed, b, 0, j++, KDT_SAMPLE_STREAM_ACCEPT);
        if (!qrow) {
            if (kdt_accept_det(u, w[x], Z)) return x;
            if (bug != WRONG_KEEP_REJECTED) Z -= w[x], w[x] = 0;
        } else {
            const int acc = bug == WRONG_ACCEPT_BY_P ? u < KDT_DDIV(KDT_U2D(w[x]), KDT_U2D(Z))
                                                     : kdt_accept_sampled(u, w[x], Z, qw[x], Qz);
            if (acc) return x;
            if (bug == WRONG_NO_RESIDUAL) continue;
            const double cz = KDT_DDIV(KDT_U2D(Z), KDT_U2D(Qz));
            Z = 0;
            for (int v = 0; v < V; v++) Z += w[v] = kdt_residual_step(w[v], qw[v], cz);
        }
    }
    const uint64_t t = kdt_sample_target(kdt_sample_uniform(seed, b, 0, KDT_SAMPLE_DRAW_BONUS, 0), Z);
    uint64_t cum = 0;
    for (int v = 0; v < V; v++)
        if ((cum += w[v]) > t) return v;
    return -1;
}

static void report(const char *what, verdict r, int want_pass) {
    const int ok = want_pass ? r.pval > kAlpha && r.outside == 0 : r.pval < kAlpha;
    kt_check(ok, "%s: chi2 %.1f df %d p %.3g n %ld outside %ld (%s)", what, r.chi2, r.df, r.pval, r.n, r.outside,
             want_pass ? "must pass" : "must be rejected");
}

static void run_config(const config *c, kdt_backend be) {
    char what[160];
    snprintf(what, sizeof what, "sample stats %s [%s]", c->name, kdt_backend_name(be));
    if (!kt_backend_usable(be, what)) return;
    double p_root[V], p_one[V], qd[Q][V];
    target_dist(c, 0, p_root);
    target_dist(c, 1, p_one);
    for (int r = 0; r < Q; r++) { /* draft rows: softmax of draft_logit */
        double z = 0;
        for (int v = 0; v < V; v++) z += qd[r][v] = exp((double)draft_logit(r, v));
        for (int v = 0; v < V; v++) qd[r][v] /= z;
    }
    long first[V] = {0}, after[V] = {0}, wrong[4][V] = {{0}};
    long mismatch = 0;
    const size_t bq = (size_t)CHUNK * Q, bqv = bq * V;
    int32_t *tok = malloc(bq * 4), *par = malloc(bq * 4), *num = malloc(CHUNK * 4), *topk = malloc(CHUNK * 4);
    int32_t *out[4] = {malloc(CHUNK * 4), malloc(bq * 4), malloc(bq * 4), malloc(CHUNK * 4)};
    float *lg = malloc(bqv * 4), *q = c->sampled ? malloc(bqv * 4) : NULL, *temp = malloc(CHUNK * 4), *topp = malloc(CHUNK * 4);
    uint64_t *seed = malloc(CHUNK * 8);
    kdt_status s = KDT_OK;
    for (int32_t base = 0; base < NREQ && s == KDT_OK; base += CHUNK) {
        for (int32_t b = 0; b < CHUNK; b++) {
            const uint32_t gb = (uint32_t)(base + b);
            num[b] = Q - 1, temp[b] = c->T, topp[b] = c->P, topk[b] = c->K;
            seed[b] = mix(0x5EED0000ull + gb) ^ ((uint64_t)c->sampled << 40);
            for (int i = 0; i < Q; i++) {
                par[(size_t)b * Q + i] = kParent[i];
                tok[(size_t)b * Q + i] = i == 0 ? 0 : c->sampled ? draw_token(qd[kParent[i]], seed[b] * 31 + (uint64_t)i) : c->tok[i];
                for (int v = 0; v < V; v++) {
                    lg[((size_t)b * Q + i) * V + v] = logit(i, v);
                    if (q) q[((size_t)b * Q + i) * V + v] = (float)qd[i][v];
                }
            }
        }
        kdt_tree_sample_accept_params p = {CHUNK, Q, V, tok, par, num, lg, q, temp, topk, topp, seed,
                                           out[0], out[1], out[2], out[3]};
        for (int i = 0; i < 4; i++) memset(out[i], 0xFF, i == 0 || i == 3 ? CHUNK * 4 : bq * 4);
        if (be == KDT_BACKEND_CUDA) s = kt_sample_accept_on_device(&p);
        else s = kdt_tree_sample_accept(&p, KDT_BACKEND_CPU, NULL);
        for (int32_t b = 0; s == KDT_OK && b < CHUNK; b++) {
            const int32_t *acc = out[2] + (size_t)b * Q, *idx = out[1] + (size_t)b * Q;
            if (acc[0] >= 0 && acc[0] < V) first[acc[0]]++;
            if (out[0][b] >= 1 && idx[1] == 1 && acc[1] >= 0 && acc[1] < V) after[acc[1]]++;
            if (c->P < 1.0f || c->K > 0) continue;
            for (int bug = 0; bug < 4; bug++) {
                if (bug == WRONG_KEEP_REJECTED ? c->sampled : bug != WRONG_NONE && !c->sampled) continue;
                const int32_t x = first_token(lg + (size_t)b * Q * V, q ? q + (size_t)b * Q * V : NULL, tok + (size_t)b * Q,
                                              seed[b], (uint32_t)b, bug);
                if (x >= 0) wrong[bug][x]++;
                if (bug == WRONG_NONE && x != acc[0]) mismatch++;
            }
        }
    }
    if (s != KDT_OK) {
        kt_fail("%s  %s: %s", what, kdt_status_name(s), kdt_last_error());
    } else {
        char line[320];
        snprintf(line, sizeof line, "%s (a) first token ~ target at the root", what);
        report(line, chi2_test(first, p_root), 1);
        snprintf(line, sizeof line, "%s (b) token after accepted node 1 ~ target at node 1", what);
        report(line, chi2_test(after, p_one), 1);
        double shifted[V]; /* power: the same counts against targets 2% off in total variation */
        shift_mass(p_root, shifted);
        snprintf(line, sizeof line, "%s (a) power: root target with 2%% moved between its top two tokens", what);
        report(line, chi2_test(first, shifted), 0);
        shift_mass(p_one, shifted);
        snprintf(line, sizeof line, "%s (b) power: node 1 target with 2%% moved between its top two tokens", what);
        report(line, chi2_test(after, shifted), 0);
        if (!(c->P < 1.0f || c->K > 0)) {
            kt_check(mismatch == 0, "%s (d) the reimplemented rule without a bug gives the library's first token: %ld differ",
                     what, mismatch);
            static const char *const names[4] = {"", "rejected child kept in the residual",
                                                 "accept by p(x) instead of min(1, p(x)/q(x))",
                                                 "residual not reduced by q after a rejection"};
            for (int bug = 1; bug < 4; bug++) {
                if (bug == WRONG_KEEP_REJECTED ? c->sampled : !c->sampled) continue;
                snprintf(line, sizeof line, "%s (d) wrong rule: %s", what, names[bug]);
                report(line, chi2_test(wrong[bug], p_root), 0);
            }
        }
    }
    free(tok), free(par), free(num), free(topk), free(lg), free(q), free(temp), free(topp), free(seed);
    for (int i = 0; i < 4; i++) free(out[i]);
}

int main(void) {
    static const config configs[] = {
        {"deterministic T=1", 1.0f, 1.0f, 0, 0, {0, 0, 2, 0, 5, 1, 4, 7}},
        {"deterministic T=0.8 top_k=8 top_p=0.85", 0.8f, 0.85f, 8, 0, {0, 0, 12, 2, 5, 1, 4, 7}},
        {"sampled T=1", 1.0f, 1.0f, 0, 1, {0}},
        {"sampled T=0.7 top_k=10 top_p=0.9", 0.7f, 0.9f, 10, 1, {0}},
    };
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        run_config(&configs[i], KDT_BACKEND_CPU);
        run_config(&configs[i], KDT_BACKEND_CUDA);
    }
    return kt_exit_code();
}
