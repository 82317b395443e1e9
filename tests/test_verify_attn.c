/* verify_attn (docs/interfaces.md 2.2) against the numpy bundles of python/gen_verify_attn.py, on the CPU
 * backend always and on CUDA where a device is present; then the C API's refusals, and the CUDA
 * kernel's own safety on unchecked device inputs (run this binary under compute-sanitizer). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/device.h"
#include "harness.h"

/* Tolerances: f32 inputs against the f64 reference, bf16 inputs against the f64
 * reference of the same bf16-rounded inputs; lse in absolute terms. */
#define F32_MAX_ABS_REL 1e-5
#define F32_REL_L2 1e-5
#define BF16_REL_L2 1e-2
#define LSE_MAX_ABS 1e-3

static const char *backend_tag(kdt_backend b) { return b == KDT_BACKEND_CPU ? "cpu" : "cuda"; }

/* "B=1 H=64 q_len=33 kv_len=161" (kv_len=a..b when ragged) */
static void describe(const kdt_kdtr *in, char *buf, size_t cap) {
    kdt_tensor_view q, len;
    if (kdt_kdtr_find(in, "q", &q) != KDT_OK || q.ndim != 4 || kdt_kdtr_find(in, "kv_len", &len) != KDT_OK ||
        len.dtype != KDT_I32 || len.numel == 0) {
        snprintf(buf, cap, "(malformed)");
        return;
    }
    const int32_t *kl = len.data;
    int32_t lo = kl[0], hi = kl[0];
    for (uint64_t b = 1; b < len.numel; b++) lo = kl[b] < lo ? kl[b] : lo, hi = kl[b] > hi ? kl[b] : hi;
    int n = snprintf(buf, cap, "B=%llu H=%llu q_len=%llu kv_len=%d", (unsigned long long)q.dims[0],
                     (unsigned long long)q.dims[2], (unsigned long long)q.dims[1], lo);
    if (hi != lo && n > 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, "..%d", hi);
}

static void check_good(const char *name, const kdt_kdtr *in, kdt_backend be) {
    char what[160], msg[300] = "";
    describe(in, what, sizeof what);
    kdt_tensor_view q;
    kdt_kdtr_find(in, "q", &q);
    const int bf16 = q.dtype == KDT_BF16;
    kdt_kdtr *got = NULL;
    kdt_status s = kt_run_op("verify_attn", in, be, &got);
    if (s != KDT_OK) {
        kt_fail("%s [%s]  %s  run failed: %s (%s)", name, backend_tag(be), what, kdt_last_error(), kdt_status_name(s));
        return;
    }
    kt_err eo, el;
    char msg_l[300] = "";
    const int ok_o = kt_compare_float(got, in, "o", &eo, msg, sizeof msg);
    const int ok_l = kt_compare_float(got, in, "lse", &el, msg_l, sizeof msg_l);
    kdt_kdtr_close(got);
    const int tol_o = bf16 ? eo.rel_l2 <= BF16_REL_L2
                           : eo.max_abs <= F32_MAX_ABS_REL * eo.ref_max_abs && eo.rel_l2 <= F32_REL_L2;
    const int tol_l = el.max_abs <= LSE_MAX_ABS;
    kt_check(ok_o && ok_l && tol_o && tol_l, "%s [%s]  %s  max_abs=%.3g max_rel=%.3g rel_l2=%.3g (max|ref|=%.3g) lse_max_abs=%.3g%s%s%s%s",
             name, backend_tag(be), what, eo.max_abs, eo.max_rel, eo.rel_l2, eo.ref_max_abs, el.max_abs,
             ok_o ? "" : "  o: ", ok_o ? "" : msg, ok_l ? "" : "  lse: ", ok_l ? "" : msg_l);
}

static void check_bad(const char *name, const kdt_kdtr *in, kdt_backend be, int32_t want) {
    kdt_kdtr *got = NULL;
    kdt_status s = kt_run_op("verify_attn", in, be, &got);
    if (got) kdt_kdtr_close(got);
    kt_check((int32_t)s == want, "%s [%s]  refused with %s, expected %s: %s", name, backend_tag(be), kdt_status_name(s),
             kdt_status_name((kdt_status)want), s == KDT_OK ? "(ran)" : kdt_last_error());
}

static void run_bundles(void) {
    char **paths = NULL;
    size_t n = kt_list_bundles("verify_attn_", &paths);
    if (!kt_check(n > 0, "verify_attn bundles found in %s (%zu)", kt_data_dir(), n)) return;
    for (size_t i = 0; i < n; i++) {
        const char *name = kt_basename(paths[i]);
        kdt_kdtr *in = NULL;
        kdt_status s = kdt_kdtr_open_file(paths[i], &in);
        if (s != KDT_OK) {
            kt_fail("%s  cannot open: %s", name, kdt_last_error());
            continue;
        }
        int32_t want = 0;
        const int bad = kdt_kdtr_scalar_i32(in, "expected.error", &want) == KDT_OK;
        for (int b = 0; b < 2; b++) {
            const kdt_backend be = b ? KDT_BACKEND_CUDA : KDT_BACKEND_CPU;
            char what[300];
            snprintf(what, sizeof what, "%s", name);
            if (!kt_backend_usable(be, what)) continue;
            if (bad) check_bad(name, in, be, want);
            else check_good(name, in, be);
        }
        kdt_kdtr_close(in);
    }
    kt_free_list(paths, n);
}

/* A tiny valid contiguous f32 problem: B=2 Q=2 H=1 Dv=2 Dr=1 L=4. */
typedef struct tiny {
    float q[2 * 2 * 1 * 3], kv[2 * 4 * 3], o[2 * 2 * 1 * 2], lse[2 * 2 * 1];
    int32_t kv_len[2], table[2 * 2];
    uint8_t mask[2 * 2 * 2];
    kdt_verify_attn_params p;
} tiny;

static void tiny_init(tiny *t) {
    memset(t, 0, sizeof *t);
    for (int i = 0; i < 12; i++) t->q[i] = 0.1f * (float)i;
    for (int i = 0; i < 24; i++) t->kv[i] = 0.05f * (float)(i % 7);
    t->kv_len[0] = 4, t->kv_len[1] = 2;
    const uint8_t m[4] = {1, 0, 1, 1};
    memcpy(t->mask, m, 4), memcpy(t->mask + 4, m, 4);
    t->p = (kdt_verify_attn_params){.B = 2, .Q = 2, .H = 1, .Dv = 2, .Dr = 1, .dtype = KDT_F32, .q = t->q, .kv = t->kv,
                                    .L = 4, .kv_len = t->kv_len, .tree_mask = t->mask, .sm_scale = 0.5f, .o = t->o,
                                    .lse = t->lse};
}

static void expect_api(const char *what, kdt_status got, kdt_status want) {
    kt_check(got == want, "verify_attn api [cpu]  %s: %s, expected %s (%s)", what, kdt_status_name(got), kdt_status_name(want),
             got == KDT_OK ? "ran" : kdt_last_error());
}

static void run_api_checks(void) {
    tiny t;
    tiny_init(&t);
    expect_api("valid contiguous call", kdt_verify_attn(&t.p, KDT_BACKEND_CPU, NULL), KDT_OK);
    expect_api("NULL params", kdt_verify_attn(NULL, KDT_BACKEND_CPU, NULL), KDT_ERR_INVALID_ARG);
    t.p.kv_cache = t.kv, t.p.NB = 2, t.p.BS = 4, t.p.MB = 2, t.p.block_table = t.table;
    expect_api("both layouts", kdt_verify_attn(&t.p, KDT_BACKEND_CPU, NULL), KDT_ERR_INVALID_ARG);
    t.p.kv = NULL;
    t.table[0] = 0, t.table[1] = 9, t.table[2] = 1, t.table[3] = -1; /* request 0's keys 0..3 lie in block 0 only */
    expect_api("paged, unused entries out of range", kdt_verify_attn(&t.p, KDT_BACKEND_CPU, NULL), KDT_OK);
    t.p.BS = 2; /* now request 0's keys 2..3 lie in block 9 */
    expect_api("paged, a used entry out of range", kdt_verify_attn(&t.p, KDT_BACKEND_CPU, NULL), KDT_ERR_INVALID_ARG);
    tiny_init(&t);
    t.kv_len[1] = 1;
    expect_api("kv_len below Q", kdt_verify_attn(&t.p, KDT_BACKEND_CPU, NULL), KDT_ERR_INVALID_ARG);
    t.kv_len[1] = 5;
    expect_api("kv_len above L", kdt_verify_attn(&t.p, KDT_BACKEND_CPU, NULL), KDT_ERR_INVALID_ARG);
    tiny_init(&t);
    t.p.Q = 0;
    expect_api("Q = 0", kdt_verify_attn(&t.p, KDT_BACKEND_CPU, NULL), KDT_ERR_SHAPE);
    tiny_init(&t);
    t.p.H = 0;
    expect_api("H = 0", kdt_verify_attn(&t.p, KDT_BACKEND_CPU, NULL), KDT_ERR_SHAPE);
    tiny_init(&t);
    t.p.dtype = KDT_F16;
    expect_api("dtype f16", kdt_verify_attn(&t.p, KDT_BACKEND_CPU, NULL), KDT_ERR_DTYPE);
    tiny_init(&t);
    t.p.sm_scale = INFINITY;
    expect_api("sm_scale inf", kdt_verify_attn(&t.p, KDT_BACKEND_CPU, NULL), KDT_ERR_INVALID_ARG);
    tiny_init(&t);
    t.mask[3] = 7;
    expect_api("mask value 7", kdt_verify_attn(&t.p, KDT_BACKEND_CPU, NULL), KDT_ERR_INVALID_ARG);
    tiny_init(&t);
    t.p.o = NULL;
    expect_api("NULL o", kdt_verify_attn(&t.p, KDT_BACKEND_CPU, NULL), KDT_ERR_INVALID_ARG);
    tiny_init(&t);
    t.p.B = 0, t.p.q = NULL, t.p.o = NULL;
    expect_api("B = 0 (nothing to do)", kdt_verify_attn(&t.p, KDT_BACKEND_CPU, NULL), KDT_OK);
}

/* Device copy of n bytes of host (NULL: n bytes of 0xFF, NaN for f32); NULL on failure. */
static void *dev_copy(const void *host, size_t n) {
    void *d = NULL;
    if (kdt_dev_alloc(&d, n) != KDT_OK) return NULL;
    unsigned char *tmp = NULL;
    if (!host) {
        tmp = malloc(n);
        if (tmp) memset(tmp, 0xFF, n);
        host = tmp;
    }
    if (!host || kdt_dev_h2d(d, host, n) != KDT_OK) {
        free(tmp);
        kdt_dev_free(d);
        return NULL;
    }
    free(tmp);
    return d;
}

/* The CUDA kernel given device data nobody checked (the C API does not read device memory):
 * every used block-table entry out of range, kv_len above the cache or negative. It must not
 * read outside the cache (compute-sanitizer would say so) and, since no key is then visible,
 * must give o = 0 and lse = -inf everywhere. */
static void run_cuda_unchecked(void) {
    const char *what = "verify_attn api unchecked device inputs";
    if (!kt_backend_usable(KDT_BACKEND_CUDA, what)) return;
    enum { B = 2, Q = 3, H = 5, DV = 64, DR = 16, NB = 3, BS = 16, MB = 4 };
    const size_t nq = (size_t)B * Q * H * (DV + DR), nc = (size_t)NB * BS * (DV + DR), no = (size_t)B * Q * H * DV;
    float *hq = malloc(nq * sizeof *hq), *hc = malloc(nc * sizeof *hc), *ho = malloc(no * sizeof *ho),
          *hl = malloc((size_t)B * Q * H * sizeof *hl);
    int32_t table[B * MB] = {NB, 1 << 30, -1, -7, NB + 1, -1, NB, 99}, kv_len[B] = {1 << 30, -5};
    uint8_t mask[B * Q * Q];
    for (size_t i = 0; i < nq; i++) hq[i] = 0.01f * (float)(i % 13);
    for (size_t i = 0; i < nc; i++) hc[i] = 0.02f * (float)(i % 11);
    for (int i = 0; i < B * Q * Q; i++) mask[i] = 1;
    kdt_verify_attn_params p = {.B = B, .Q = Q, .H = H, .Dv = DV, .Dr = DR, .dtype = KDT_F32, .NB = NB, .BS = BS, .MB = MB,
                                .sm_scale = 0.13086f};
    p.q = dev_copy(hq, nq * 4);
    p.kv_cache = dev_copy(hc, nc * 4);
    p.block_table = dev_copy(table, sizeof table);
    p.kv_len = dev_copy(kv_len, sizeof kv_len);
    p.tree_mask = dev_copy(mask, sizeof mask);
    p.o = dev_copy(NULL, no * 4);
    p.lse = dev_copy(NULL, (size_t)B * Q * H * 4);
    kdt_status s = KDT_ERR_NOMEM;
    if (hq && hc && ho && hl && p.q && p.kv_cache && p.block_table && p.kv_len && p.tree_mask && p.o && p.lse) {
        s = kdt_verify_attn(&p, KDT_BACKEND_CUDA, NULL);
        if (s == KDT_OK) s = kdt_dev_sync();
        if (s == KDT_OK) s = kdt_dev_d2h(ho, p.o, no * 4);
        if (s == KDT_OK) s = kdt_dev_d2h(hl, p.lse, (size_t)B * Q * H * 4);
    }
    if (s != KDT_OK) {
        kt_fail("%s [cuda]  %s (%s)", what, kdt_last_error(), kdt_status_name(s));
    } else {
        size_t bad = 0;
        for (size_t i = 0; i < no; i++) bad += ho[i] != 0.f;
        for (int i = 0; i < B * Q * H; i++) bad += !(isinf(hl[i]) && hl[i] < 0);
        kt_check(bad == 0, "%s [cuda]  every key skipped: o = 0 and lse = -inf (%zu elements differ)", what, bad);
    }
    kdt_dev_free((void *)p.q), kdt_dev_free((void *)p.kv_cache), kdt_dev_free((void *)p.block_table);
    kdt_dev_free((void *)p.kv_len), kdt_dev_free((void *)p.tree_mask), kdt_dev_free(p.o), kdt_dev_free(p.lse);
    free(hq), free(hc), free(ho), free(hl);
}

int main(void) {
    run_bundles();
    run_api_checks();
    run_cuda_unchecked();
    return kt_exit_code();
}
