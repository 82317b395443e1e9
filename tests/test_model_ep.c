/* Expert parallel on the CPU (docs/multi_gpu.md): N = 1 .. 4 ranks as threads on the local
 * communicator give exactly the one-rank f32 logits (memcmp) over a batched prefill, decode steps
 * and a verification tree, on the built-in model (f32 and the bf16 emulation), the shipped
 * models/kdt-small and the checkpoint fixtures of the other expert layouts (fused experts,
 * INT4 K2.6 groups, shards); ranks > 0 hold their experts and nothing else. Faults, each ending
 * every rank with an error that names the rank at fault, no hang: one rank's load fails
 * ($KDT_TEST_FAIL_LOAD_RANK); a rank dies (aborts) or vanishes (never serves) before a forward;
 * the CUDA backend with more than one rank. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "kdt/comm.h"
#include "kdt/model.h"
#include "model/internal.h"

#define MAXN 4
#define BUILTIN_SEED 77

static uint64_t g_seed;

typedef struct target {
    const char *name, *dir;      /* dir NULL: the built-in model */
    kdt_backend backend;
    kdt_dtype dtype;
} target;

static kdt_status load(const target *t, kdt_comm *comm, kdt_model **m) {
    return t->dir ? kdt_model_load_ranked(t->dir, t->backend, t->dtype, comm, m)
                  : kdt_model_builtin_ranked(BUILTIN_SEED, t->backend, t->dtype, comm, m);
}

#define ROWS 18 /* prefill 6 + 4, two decode steps of 2, a tree of 4 */

/* Prefill of two requests in one batch, two batched decode steps, a tree with two branches on
 * request 1: logits [ROWS, V] into out. Tokens from g_seed. */
static kdt_status run_seq(kdt_model *m, float *out) {
    const int32_t V = kdt_model_get_config(m)->vocab_size;
    kdt_cache *c;
    kdt_status s = kdt_cache_create(m, 2, 64, 0, &c);
    if (s != KDT_OK) return s;
    uint64_t st = g_seed;
    int32_t tok[10], req[2] = {0, 1}, n[2] = {6, 4};
    for (int i = 0; i < 10; i++) tok[i] = (int32_t)(kt_splitmix64(&st) % (uint64_t)V);
    kdt_batch b = {.B = 2, .req = req, .n_rows = n, .tokens = tok, .logits_rows = KDT_LOGITS_ALL};
    s = kdt_model_forward(m, c, &b, out, NULL, NULL);
    float *o = out + 10 * (size_t)V;
    for (int step = 0; step < 2 && s == KDT_OK; step++, o += 2 * (size_t)V) {
        int32_t one[2] = {1, 1}, t2[2] = {kt_argmax(o - 2 * (size_t)V, V), kt_argmax(o - (size_t)V, V)};
        b = (kdt_batch){.B = 2, .req = req, .n_rows = one, .tokens = t2, .logits_rows = KDT_LOGITS_ALL};
        s = kdt_model_forward(m, c, &b, o, NULL, NULL);
    }
    /* Tree: root, two children of the root, a grandchild under the first. */
    const int32_t len = kdt_cache_len(c, 1), q = 4, r1 = 1;
    int32_t tt[4] = {kt_argmax(o - (size_t)V, V), 3 % V, 5 % V, 7 % V}, pos[4] = {len, len + 1, len + 1, len + 2};
    const uint8_t mask[16] = {1, 0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 0, 1, 1, 0, 1};
    b = (kdt_batch){.B = 1, .req = &r1, .n_rows = &q, .tokens = tt, .positions = pos, .tree_mask = mask,
                    .logits_rows = KDT_LOGITS_ALL};
    if (s == KDT_OK) s = kdt_model_forward(m, c, &b, o, NULL, NULL);
    kdt_cache_free(c);
    return s;
}

typedef struct rank_job {
    kdt_comm_world *w;
    const target *t;
    int32_t rank;
    int mode;                    /* 0: serve; 1: abort after loading; 2: leave after loading */
    kdt_status load, serve;
    int holds_only_experts;      /* rank > 0: no embedding, attention or LM head, its experts' range */
    char msg[600];
} rank_job;

static void *follower(void *arg) {
    rank_job *j = arg;
    kdt_comm *c;
    if ((j->load = kdt_comm_init(j->w, j->rank, &c)) != KDT_OK) return NULL;
    kdt_model *m = NULL;
    j->load = load(j->t, c, &m);
    if (j->load != KDT_OK) snprintf(j->msg, sizeof j->msg, "%s", kdt_last_error());
    if (m) {
        const int64_t E = m->cfg.n_routed_experts, N = kdt_comm_size(c), r = j->rank;
        const kdt_layer_w *last = &m->layers[m->cfg.num_hidden_layers - 1];
        j->holds_only_experts = m->e_lo == r * E / N && m->e_n == (r + 1) * E / N - r * E / N &&
                                (!j->t->dir || (!m->embed && !m->lm_head && !m->layers[0].kv_a && !last->o));
        if (j->mode == 1) kdt_comm_abort(c, "the test killed this rank");
        if (j->mode == 0) j->serve = kdt_model_serve_experts(m);
    }
    kdt_model_free(m);
    kdt_comm_free(c);
    return NULL;
}

/* Rank 0 in this thread, ranks 1 .. N-1 in others: logits into out (when the load succeeds). */
static kdt_status run_ranks(const target *t, int32_t N, int mode, int32_t timeout_ms, float *out, rank_job *jobs, char *msg,
                            size_t cap) {
    kdt_comm_world *w;
    kdt_status s = kdt_comm_world_create(KDT_COMM_LOCAL, N, timeout_ms, &w);
    if (s != KDT_OK) return s;
    pthread_t th[MAXN];
    for (int32_t r = 1; r < N; r++) {
        jobs[r] = (rank_job){.w = w, .t = t, .rank = r, .mode = mode};
        pthread_create(&th[r], NULL, follower, &jobs[r]);
    }
    kdt_comm *c = NULL;
    kdt_model *m = NULL;
    s = kdt_comm_init(w, 0, &c);
    if (s == KDT_OK) s = load(t, c, &m);
    if (s == KDT_OK) s = run_seq(m, out);
    snprintf(msg, cap, "%s", s ? kdt_last_error() : "");
    kdt_model_free(m);
    if (s != KDT_OK) kdt_comm_abort(c, msg); /* a failed forward: the others stop serving */
    for (int32_t r = 1; r < N; r++) pthread_join(th[r], NULL);
    kdt_comm_free(c);
    kdt_comm_world_free(w);
    return s;
}

static void check_equal(const target *t) {
    kdt_model *m;
    kdt_status s = t->dir ? kdt_model_load_as(t->dir, t->backend, t->dtype, &m)
                          : kdt_model_builtin_as(BUILTIN_SEED, t->backend, t->dtype, &m);
    if (s != KDT_OK) {
        kt_fail("%s: one-rank load: %s", t->name, kdt_last_error());
        return;
    }
    const size_t V = (size_t)kdt_model_get_config(m)->vocab_size, E = (size_t)kdt_model_get_config(m)->n_routed_experts;
    float *want = malloc(ROWS * V * sizeof(float)), *got = malloc(ROWS * V * sizeof(float));
    s = run_seq(m, want);
    kdt_model_free(m);
    if (s != KDT_OK) {
        kt_fail("%s: one-rank forward: %s", t->name, kdt_last_error());
        free(want); free(got);
        return;
    }
    for (int32_t N = 1; N <= MAXN; N++) {
        for (size_t i = 0; i < ROWS * V; i++) got[i] = (float)NAN;
        rank_job jobs[MAXN] = {0};
        char msg[600];
        s = run_ranks(t, N, 0, 60000, got, jobs, msg, sizeof msg);
        int ok = s == KDT_OK, only = 1;
        for (int32_t r = 1; r < N; r++) {
            ok &= jobs[r].load == KDT_OK && jobs[r].serve == KDT_OK;
            only &= jobs[r].holds_only_experts;
        }
        size_t first = ROWS * V;
        for (size_t i = 0; ok && i < ROWS * V && first == ROWS * V; i++)
            if (memcmp(&got[i], &want[i], sizeof(float))) first = i;
        kt_check(ok && first == ROWS * V && only,
                 "%s: %d rank(s) (experts split %zu / %d), local communicator: the %d x %zu logits of prefill, decode and tree "
                 "equal one rank's bit for bit; ranks > 0 hold only their experts%s%s",
                 t->name, N, E, N, ROWS, V, ok ? "" : ": ",
                 !ok ? msg : !only ? " [a rank holds more than its experts]" : first < ROWS * V ? " [the logits differ]" : "");
    }
    free(want);
    free(got);
}

static void check_faults(void) {
    const target bt = {"built-in", NULL, KDT_BACKEND_CPU, KDT_F32};
    float *out = malloc(ROWS * 512 * sizeof(float));
    rank_job jobs[MAXN];
    char msg[600];
    /* Rank 2 of 4 fails to load: every rank's load fails; rank 0 names rank 2. */
    setenv("KDT_TEST_FAIL_LOAD_RANK", "2", 1);
    double t0 = kt_now_s();
    kdt_status s = run_ranks(&bt, 4, 0, 60000, out, jobs, msg, sizeof msg);
    unsetenv("KDT_TEST_FAIL_LOAD_RANK");
    int all = s == KDT_ERR_COMM && strstr(msg, "rank 2") && strstr(msg, "injected");
    for (int r = 1; r < 4; r++) all &= jobs[r].load != KDT_OK;
    kt_check(all, "fault: rank 2 of 4 fails to load: all 4 loads fail in %.3f s, rank 0 says \"%s\"", kt_now_s() - t0, msg);
    /* Rank 1 dies after loading: rank 0's first forward fails at once with its message. */
    t0 = kt_now_s();
    s = run_ranks(&bt, 2, 1, 60000, out, jobs, msg, sizeof msg);
    kt_check(s == KDT_ERR_COMM && strstr(msg, "rank 1 aborted") && kt_now_s() - t0 < 30,
             "fault: rank 1 aborts after loading: rank 0's forward fails in %.3f s: \"%s\"", kt_now_s() - t0, msg);
    /* Rank 1 loads and vanishes: rank 0's forward ends at the 400 ms timeout, naming it. */
    t0 = kt_now_s();
    s = run_ranks(&bt, 3, 2, 400, out, jobs, msg, sizeof msg);
    kt_check(s == KDT_ERR_COMM && strstr(msg, "never arrived") && kt_now_s() - t0 < 30,
             "fault: ranks 1 and 2 load and never serve: rank 0's forward ends at the timeout (%.3f s): \"%s\"", kt_now_s() - t0, msg);
    /* The CUDA backend takes one rank only so far: every rank says so. */
    const target cu = {"built-in", NULL, KDT_BACKEND_CUDA, KDT_BF16};
    s = run_ranks(&cu, 2, 0, 60000, out, jobs, msg, sizeof msg);
    kt_check(s == KDT_ERR_UNSUPPORTED && jobs[1].load != KDT_OK && strstr(msg, "CUDA"),
             "2 ranks on the CUDA backend: refused on both ranks: \"%s\"", msg);
    free(out);
}

int main(void) {
    const char *seed = getenv("KDT_SEED");
    g_seed = seed && *seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL);
    printf("test_model_ep: seed %llu\n", (unsigned long long)g_seed);
    const char *fx = getenv("KDT_MODEL_FIXTURES");
    char dirs[3][512];
    const char *names[3] = {"tf5", "int4_k26", "sharded"};
    for (int i = 0; i < 3; i++) snprintf(dirs[i], sizeof dirs[i], "%s/%s", fx && *fx ? fx : "tests/fixtures/model", names[i]);
    const target targets[] = {
        {"built-in f32", NULL, KDT_BACKEND_CPU, KDT_F32},
        {"built-in bf16 emulation", NULL, KDT_BACKEND_CPU, KDT_BF16},
        {"models/kdt-small", "models/kdt-small", KDT_BACKEND_CPU, KDT_F32},
        {"fixture tf5 (fused experts)", dirs[0], KDT_BACKEND_CPU, KDT_F32},
        {"fixture int4_k26 (INT4 experts, nested)", dirs[1], KDT_BACKEND_CPU, KDT_F32},
        {"fixture sharded", dirs[2], KDT_BACKEND_CPU, KDT_F32},
    };
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) check_equal(&targets[i]);
    check_faults();
    return kt_exit_code();
}
