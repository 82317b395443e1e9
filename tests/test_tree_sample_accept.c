/* tree_sample_accept (docs/interfaces.md 2.4) against the numpy bundles of python/gen_tree_sample_accept.py,
 * every output exact, on cpu and (where a device is present) cuda; cuda against cpu bit for bit on
 * fresh random batches; Philox4x32-10 against the published known-answer vectors; the errors
 * the op must report. The statistical tests are in test_sample_stats.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>

#include "common/sample_math.h"
#include "harness.h"
#include "sample_device.h"

static const char *const outputs[] = {"accept_len", "accept_index", "accept_tokens", "status"};

static void check_bundle(const char *path, kdt_backend be) {
    const char *name = kt_basename(path);
    if (!kt_backend_usable(be, name)) return;
    kdt_kdtr *in = NULL, *got = NULL;
    kdt_tensor_view lg;
    kdt_status s = kdt_kdtr_open_file(path, &in);
    if (s == KDT_OK) s = kdt_kdtr_find(in, "target_logits", &lg);
    if (s == KDT_OK) s = kt_run_op("tree_sample_accept", in, be, &got);
    if (s != KDT_OK) {
        kt_fail("%s [%s]  %s: %s", name, kdt_backend_name(be), kdt_status_name(s), kdt_last_error());
    } else {
        char msg[256] = "";
        int ok = kt_compare_outputs(got, in, outputs, sizeof outputs / sizeof outputs[0], msg, sizeof msg);
        kt_check(ok, "%s [%s]  B=%llu Q=%llu V=%llu%s%s", name, kdt_backend_name(be), (unsigned long long)lg.dims[0],
                 (unsigned long long)lg.dims[1], (unsigned long long)lg.dims[2], ok ? "" : "  ", msg);
    }
    kdt_kdtr_close(got);
    kdt_kdtr_close(in);
}

/* Random123's kat_vectors for philox4x32 with 10 rounds. */
static void check_philox(void) {
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
        {~0u, ~0u, ~0u, ~0u, ~0u, ~0u, 0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
        {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u, 0xd16cfe09u, 0x94fdccebu,
         0x5001e420u, 0x24126ea1u},
    };
    for (int i = 0; i < 3; i++) {
        uint32_t o[4];
        kdt_philox4x32_10(kat[i], kat[i] + 4, o);
        kt_check(!memcmp(o, kat[i] + 6, sizeof o), "philox4x32-10 known answer %d: %08x %08x %08x %08x", i, o[0], o[1],
                 o[2], o[3]);
    }
}

/* kdt_sample_exp against libm's exp over [-87, 0]: the relative error the doc states. */
static void check_exp(void) {
    double worst = 0;
    for (int i = 0; i <= 2000000; i++) {
        const float x = -87.0f * (float)i / 2000000.0f;
        const double want = exp((double)x), got = kdt_sample_exp(x);
        const double rel = fabs(got - want) / want;
        if (rel > worst) worst = rel;
    }
    kt_check(worst < 5e-7 && kdt_sample_exp(0.0f) == 1.0f && kdt_sample_exp(-88.0f) == 0.0f,
             "kdt_sample_exp: max relative error %.3g over [-87, 0] (bound 5e-7), exp(0) = 1, exp(-88) = 0", worst);
}

typedef struct batch {
    kdt_tree_sample_accept_params p;
    int32_t *tok, *par, *num, *topk, *out[4];
    float *lg, *q, *temp, *topp;
    uint64_t *seed;
} batch;

static double rng_unit(uint64_t *s) { return (double)(kt_splitmix64(s) >> 11) * 0x1p-53; }

/* A fresh random batch in host memory: random trees whose children's tokens the parent's row
 * favours, mixed temperatures (0 included), top-k and top-p; draft rows when sampled. */
static void batch_make(batch *t, int32_t B, int32_t Q, int32_t V, int sampled, uint64_t *rs) {
    memset(t, 0, sizeof *t);
    const size_t bq = (size_t)B * Q, bqv = bq * V;
    t->tok = malloc(bq * 4), t->par = malloc(bq * 4), t->num = malloc(B * 4), t->topk = malloc(B * 4);
    t->lg = malloc(bqv * 4), t->q = sampled ? malloc(bqv * 4) : NULL, t->temp = malloc(B * 4), t->topp = malloc(B * 4);
    t->seed = malloc(B * 8);
    for (int i = 0; i < 4; i++) t->out[i] = malloc(bq * 4);
    static const float temps[] = {0.0f, 0.5f, 1.0f, 1.0f, 1.7f}, topps[] = {1.0f, 1.0f, 0.9f, 0.5f};
    static const int32_t topks[] = {0, 0, 1, 20, 1000};
    for (int32_t b = 0; b < B; b++) {
        const int32_t n = (int32_t)(kt_splitmix64(rs) % (uint64_t)Q);
        t->num[b] = n;
        t->temp[b] = temps[kt_splitmix64(rs) % 5], t->topp[b] = topps[kt_splitmix64(rs) % 4], t->topk[b] = topks[kt_splitmix64(rs) % 5];
        t->seed[b] = kt_splitmix64(rs);
        for (size_t i = (size_t)b * Q * V; i < (size_t)(b + 1) * Q * V; i++) {
            t->lg[i] = (float)(3.0 * (rng_unit(rs) - 0.5));
            if (t->q) t->q[i] = (float)rng_unit(rs) / (float)V * 2.0f;
        }
        for (int32_t c = 0; c < Q; c++) {
            int32_t *tok = t->tok + (size_t)b * Q, *par = t->par + (size_t)b * Q;
            tok[c] = c <= n ? (int32_t)(kt_splitmix64(rs) % (uint64_t)(V + 2)) - 1 : -1;
            par[c] = c == 0 || c > n ? -1 : rng_unit(rs) < 0.6 ? c - 1 : (int32_t)(kt_splitmix64(rs) % (uint64_t)c);
            if (c >= 1 && c <= n && tok[c] >= 0 && tok[c] < V) t->lg[((size_t)b * Q + par[c]) * V + tok[c]] += 6.0f;
        }
    }
    t->p = (kdt_tree_sample_accept_params){B, Q, V, t->tok, t->par, t->num, t->lg, t->q, t->temp, t->topk, t->topp,
                                           t->seed, t->out[0], t->out[1], t->out[2], t->out[3]};
}

static void batch_free(batch *t) {
    free(t->tok), free(t->par), free(t->num), free(t->topk), free(t->lg), free(t->q), free(t->temp), free(t->topp);
    free(t->seed);
    for (int i = 0; i < 4; i++) free(t->out[i]);
}

static void check_random_cuda(int32_t B, int32_t Q, int32_t V, int sampled, uint64_t *rs) {
    char what[96];
    snprintf(what, sizeof what, "tree_sample_accept random B=%d Q=%d V=%d %s: cuda == cpu", B, Q, V,
             sampled ? "sampled" : "deterministic");
    if (!kt_backend_usable(KDT_BACKEND_CUDA, what)) return;
    batch t;
    batch_make(&t, B, Q, V, sampled, rs);
    int32_t *got[4];
    for (int i = 0; i < 4; i++) got[i] = malloc((size_t)B * Q * 4);
    for (int i = 0; i < 4; i++) memset(t.out[i], 0xFF, (size_t)B * Q * 4);
    kdt_status s = kdt_tree_sample_accept(&t.p, KDT_BACKEND_CPU, NULL);
    kdt_tree_sample_accept_params dp = t.p;
    dp.accept_len = got[0], dp.accept_index = got[1], dp.accept_tokens = got[2], dp.status = got[3];
    if (s == KDT_OK) s = kt_sample_accept_on_device(&dp);
    if (s != KDT_OK) {
        kt_fail("%s  %s: %s", what, kdt_status_name(s), kdt_last_error());
    } else {
        const size_t len[4] = {(size_t)B, (size_t)B * Q, (size_t)B * Q, (size_t)B};
        int bad = -1;
        size_t at = 0;
        for (int i = 0; i < 4 && bad < 0; i++)
            for (size_t j = 0; j < len[i] && bad < 0; j++)
                if (got[i][j] != t.out[i][j]) bad = i, at = j;
        kt_check(bad < 0, "%s%s%s[%zu] cuda %d cpu %d", what, bad < 0 ? "" : "  ", bad < 0 ? "" : outputs[bad], at,
                 bad < 0 ? 0 : got[bad][at], bad < 0 ? 0 : t.out[bad][at]);
    }
    for (int i = 0; i < 4; i++) free(got[i]);
    batch_free(&t);
}

static void check_errors(void) {
    uint64_t rs = 7;
    batch t;
    batch_make(&t, 2, 3, 5, 0, &rs);
    kdt_tree_sample_accept_params p = t.p;
    p.V = 0;
    kdt_status s = kdt_tree_sample_accept(&p, KDT_BACKEND_CPU, NULL);
    kt_check(s == KDT_ERR_SHAPE, "tree_sample_accept errors: V = 0 -> %s (%s)", kdt_status_name(s), kdt_last_error());
    p = t.p, p.Q = KDT_TREE_MAX_BUDGET + 2;
    s = kdt_tree_sample_accept(&p, KDT_BACKEND_CPU, NULL);
    kt_check(s == KDT_ERR_SHAPE, "tree_sample_accept errors: Q = %d -> %s (%s)", p.Q, kdt_status_name(s), kdt_last_error());
    p = t.p, p.seed = NULL;
    s = kdt_tree_sample_accept(&p, KDT_BACKEND_CPU, NULL);
    kt_check(s == KDT_ERR_INVALID_ARG, "tree_sample_accept errors: NULL seed -> %s (%s)", kdt_status_name(s), kdt_last_error());
    s = kdt_tree_sample_accept(NULL, KDT_BACKEND_CPU, NULL);
    kt_check(s == KDT_ERR_INVALID_ARG, "tree_sample_accept errors: NULL params -> %s", kdt_status_name(s));
    p = t.p, p.B = 0;
    s = kdt_tree_sample_accept(&p, KDT_BACKEND_CPU, NULL);
    kt_check(s == KDT_OK, "tree_sample_accept errors: B = 0 runs -> %s", kdt_status_name(s));

    /* Through kdt run: bad values and a missing tensor name the tensor at fault. */
    static const char *const bad_what[4] = {"temperature", "top_k", "top_p", "seed"};
    for (int bad = 0; bad < 4; bad++) {
        const uint64_t b1[1] = {2}, bq[2] = {2, 3}, bqv[3] = {2, 3, 5};
        float temp[2] = {1, bad == 0 ? -1.0f : 0.5f}, topp[2] = {1, bad == 2 ? 1.5f : 0.5f};
        int32_t topk[2] = {0, bad == 1 ? -3 : 2};
        kdt_kdtr_writer *w = NULL;
        kdt_kdtr *in = NULL, *got = NULL;
        void *buf = NULL;
        size_t size = 0;
        s = kdt_kdtr_writer_create(&w);
        if (s == KDT_OK) s = kdt_kdtr_writer_add(w, "node_token", KDT_I32, 2, bq, t.tok);
        if (s == KDT_OK) s = kdt_kdtr_writer_add(w, "node_parent", KDT_I32, 2, bq, t.par);
        if (s == KDT_OK) s = kdt_kdtr_writer_add(w, "num_nodes", KDT_I32, 1, b1, t.num);
        if (s == KDT_OK) s = kdt_kdtr_writer_add(w, "target_logits", KDT_F32, 3, bqv, t.lg);
        if (s == KDT_OK) s = kdt_kdtr_writer_add(w, "temperature", KDT_F32, 1, b1, temp);
        if (s == KDT_OK) s = kdt_kdtr_writer_add(w, "top_k", KDT_I32, 1, b1, topk);
        if (s == KDT_OK) s = kdt_kdtr_writer_add(w, "top_p", KDT_F32, 1, b1, topp);
        if (s == KDT_OK && bad != 3) s = kdt_kdtr_writer_add(w, "seed", KDT_U64, 1, b1, t.seed);
        if (s == KDT_OK) s = kdt_kdtr_writer_to_memory(w, &buf, &size);
        if (s == KDT_OK) s = kdt_kdtr_open_memory(buf, size, &in);
        if (s == KDT_OK) s = kt_run_op("tree_sample_accept", in, KDT_BACKEND_CPU, &got);
        const char *msg = kdt_last_error();
        kt_check(s != KDT_OK && strstr(msg, bad_what[bad]) != NULL, "tree_sample_accept errors: bad '%s' -> %s (%s)",
                 bad_what[bad], kdt_status_name(s), msg);
        kdt_kdtr_close(got);
        kdt_kdtr_close(in);
        free(buf);
        kdt_kdtr_writer_free(w);
    }
    batch_free(&t);
}

int main(void) {
    check_philox();
    check_exp();
    char **paths = NULL;
    size_t n = kt_list_bundles("tree_sample_accept_", &paths);
    if (n == 0) kt_fail("tree_sample_accept: no bundles in %s (run python/gen_tree_sample_accept.py)", kt_data_dir());
    for (size_t i = 0; i < n; i++) {
        check_bundle(paths[i], KDT_BACKEND_CPU);
        check_bundle(paths[i], KDT_BACKEND_CUDA);
    }
    kt_free_list(paths, n);
    uint64_t rs = (uint64_t)time(NULL);
    printf("random batches: splitmix64 state %llu\n", (unsigned long long)rs);
    check_random_cuda(64, 65, 3001, 0, &rs);
    check_random_cuda(64, 33, 1027, 1, &rs);
    if (!getenv("KDT_TEST_QUICK")) check_random_cuda(8, 129, 163840, 0, &rs); /* racecheck runs without it */
    check_errors();
    return kt_exit_code();
}
