/* The communicator (include/kdt/comm.h). Local backend, N = 1 .. 4 ranks as threads: every
 * collective against the same result computed here from every rank's inputs (each rank's data comes
 * from its own seed, so the expected values are independent of the library), outputs poisoned
 * first; sums exactly in rank order. Faults: an abort by one rank ends the others' collective with
 * its message; a rank that never arrives ends the others' wait at the timeout, naming it; mismatched
 * counts are an error on every rank. NCCL: unavailable in a CPU build (a clear error); with GPUs
 * and the library, worlds of 1 .. min(GPUs, 4) ranks on the same checks, through device memory. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/device.h"
#include "harness.h"
#include "kdt/comm.h"

#define MAXN 4
#define CNT 37

static uint64_t g_seed;

static float val(int32_t rank, size_t i) { /* rank r's i-th input: fresh random f32 */
    uint64_t st = g_seed ^ ((uint64_t)rank << 32) ^ i;
    return (float)((double)(kt_splitmix64(&st) >> 11) * 0x1.0p-53 * 8.0 - 4.0);
}

static size_t a2a_count(int32_t from, int32_t to) { return (size_t)((from * 7 + to * 3 + 1) % 5); }

typedef struct job {
    kdt_comm_world *w;
    int32_t rank, N, bad;        /* bad: mismatches found */
    int nccl;                    /* buffers staged through device memory */
    void *ds, *dr;               /* NCCL: device send and receive buffers */
    char why[256];
} job;

enum { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, ALL_TO_ALL };

/* One collective on host buffers: as they are (local), or through device copies (NCCL). */
typedef struct call {
    int op;
    const void *send;
    void *recv;                  /* == send: in place */
    size_t count, in_bytes, out_bytes;
    kdt_dtype dt;
    const size_t *sc, *so, *rc, *ro;
} call;

static kdt_status run(kdt_comm *c, int32_t N, const call *a) {
    switch (a->op) {
    case ALL_REDUCE: return kdt_comm_all_reduce(c, a->send, a->recv, a->count, a->dt, NULL);
    case ALL_GATHER: return kdt_comm_all_gather(c, a->send, a->recv, a->count, a->dt, NULL);
    case REDUCE_SCATTER: return kdt_comm_reduce_scatter(c, a->send, a->recv, a->count, a->dt, NULL);
    case BROADCAST: return kdt_comm_broadcast(c, a->recv, a->count, a->dt, N - 1, NULL);
    default: return kdt_comm_all_to_all_v(c, a->send, a->sc, a->so, a->recv, a->rc, a->ro, a->dt, NULL);
    }
}

static kdt_status coll(job *j, kdt_comm *c, call a) {
    if (!j->nccl) return run(c, j->N, &a);
    void *host_out = a.recv;
    const int in_place = a.send == a.recv;
    kdt_status s = kdt_dev_h2d(j->ds, a.send, a.in_bytes);
    if (s == KDT_OK && !in_place) s = kdt_dev_h2d(j->dr, a.recv, a.out_bytes); /* the poison */
    a.send = j->ds;
    a.recv = in_place ? j->ds : j->dr;
    if (s == KDT_OK) s = run(c, j->N, &a);
    if (s == KDT_OK) s = kdt_dev_d2h(host_out, a.recv, a.out_bytes);
    return s;
}

/* Moves exactly; sums exactly in rank order on the local backend, within f32 rounding of any order on NCCL. */
static int same(const job *j, const float *got, const float *want, size_t n, int sum) {
    if (!j->nccl || !sum) return !memcmp(got, want, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        if (!(fabsf(got[i] - want[i]) <= 1e-5f * (4.0f * (float)j->N))) return 0;
    return 1;
}

static void *rank_main(void *arg) {
    job *j = arg;
    kdt_comm *c = NULL;
    const size_t cap = MAXN * CNT * sizeof(float);
    if (kdt_comm_init(j->w, j->rank, &c) != KDT_OK ||
        (j->nccl && (kdt_dev_alloc(&j->ds, cap) != KDT_OK || kdt_dev_alloc(&j->dr, cap) != KDT_OK))) {
        j->bad++;
        snprintf(j->why, sizeof j->why, "init: %s", kdt_last_error());
        kdt_comm_free(c);
        return NULL;
    }
    const int32_t N = j->N, r = j->rank;
    float send[MAXN * CNT], recv[MAXN * CNT], want[MAXN * CNT];
    const size_t B = CNT * sizeof(float);
#define POISON(b) for (size_t i_ = 0; i_ < sizeof(b) / sizeof(float); i_++) (b)[i_] = NAN
#define CALL(op_, s_, r_, n_, in_, out_, dt_) \
    coll(j, c, (call){.op = op_, .send = s_, .recv = r_, .count = n_, .in_bytes = in_, .out_bytes = out_, .dt = dt_})
#define EXPECT(cond, what) do { if (!(cond)) { j->bad++; snprintf(j->why, sizeof j->why, "%s", what); } } while (0)
    /* all_reduce, out of place and in place: the sum in rank order. */
    for (size_t i = 0; i < CNT; i++) {
        send[i] = val(r, i);
        float a = val(0, i);
        for (int32_t k = 1; k < N; k++) a += val(k, i);
        want[i] = a;
    }
    POISON(recv);
    EXPECT(CALL(ALL_REDUCE, send, recv, CNT, B, B, KDT_F32) == KDT_OK && same(j, recv, want, CNT, 1), "all_reduce");
    EXPECT(CALL(ALL_REDUCE, send, send, CNT, B, B, KDT_F32) == KDT_OK && same(j, send, want, CNT, 1),
           "all_reduce in place");
    /* all_gather */
    for (size_t i = 0; i < CNT; i++) send[i] = val(r, i);
    for (int32_t k = 0; k < N; k++)
        for (size_t i = 0; i < CNT; i++) want[k * CNT + i] = val(k, i);
    POISON(recv);
    EXPECT(CALL(ALL_GATHER, send, recv, CNT, B, N * B, KDT_F32) == KDT_OK && same(j, recv, want, N * CNT, 0),
           "all_gather");
    /* reduce_scatter: row r of everyone's [N, CNT], summed */
    for (size_t i = 0; i < (size_t)N * CNT; i++) send[i] = val(r, 1000 + i);
    for (size_t i = 0; i < CNT; i++) {
        float a = val(0, 1000 + r * CNT + i);
        for (int32_t k = 1; k < N; k++) a += val(k, 1000 + r * CNT + i);
        want[i] = a;
    }
    POISON(recv);
    EXPECT(CALL(REDUCE_SCATTER, send, recv, CNT, N * B, B, KDT_F32) == KDT_OK && same(j, recv, want, CNT, 1),
           "reduce_scatter");
    /* broadcast from the last rank; i32 sums */
    for (size_t i = 0; i < CNT; i++) send[i] = r == N - 1 ? val(N - 1, 77 + i) : NAN, want[i] = val(N - 1, 77 + i);
    EXPECT(CALL(BROADCAST, send, send, CNT, B, B, KDT_F32) == KDT_OK && same(j, send, want, CNT, 0), "broadcast");
    int32_t iv[3] = {r, 10 * r, -r}, isum[3] = {-1, -1, -1};
    EXPECT(CALL(ALL_REDUCE, iv, isum, 3, 12, 12, KDT_I32) == KDT_OK && isum[0] == N * (N - 1) / 2 &&
           isum[1] == 5 * N * (N - 1) && isum[2] == -isum[0], "all_reduce i32");
    /* all_to_all_v: rank r sends a2a_count(r, p) values val(r, 500 + p * 10 + i) to rank p */
    size_t sc[MAXN], so[MAXN], rc[MAXN], ro[MAXN], off = 0, roff = 0;
    for (int32_t p = 0; p < N; p++) {
        sc[p] = a2a_count(r, p), so[p] = off;
        for (size_t i = 0; i < sc[p]; i++) send[off + i] = val(r, 500 + p * 10 + i);
        off += sc[p];
        rc[p] = a2a_count(p, r), ro[p] = roff;
        for (size_t i = 0; i < rc[p]; i++) want[roff + i] = val(p, 500 + r * 10 + i);
        roff += rc[p];
    }
    POISON(recv);
    EXPECT(coll(j, c, (call){ALL_TO_ALL, send, recv, 0, off * 4 + 4, roff * 4 + 4, KDT_F32, sc, so, rc, ro}) == KDT_OK &&
           same(j, recv, want, roff, 0), "all_to_all_v");
    EXPECT(kdt_comm_barrier(c) == KDT_OK, "barrier");
    kdt_dev_free(j->ds);
    kdt_dev_free(j->dr);
    kdt_comm_free(c);
    return NULL;
}

static void check_world(kdt_comm_backend backend, int32_t N) {
    const char *name = backend == KDT_COMM_NCCL ? "nccl" : "local";
    kdt_comm_world *w;
    if (kdt_comm_world_create(backend, N, 10000, &w) != KDT_OK) {
        kt_fail("%s world of %d: %s", name, N, kdt_last_error());
        return;
    }
    pthread_t th[MAXN];
    job jobs[MAXN];
    for (int32_t r = 0; r < N; r++) {
        jobs[r] = (job){.w = w, .rank = r, .N = N, .nccl = backend == KDT_COMM_NCCL};
        pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    int bad = 0;
    const char *why = "";
    for (int32_t r = 0; r < N; r++) {
        pthread_join(th[r], NULL);
        if (jobs[r].bad) { bad += jobs[r].bad; why = jobs[r].why; }
    }
    kt_check(!bad, "%s, %d ranks: all_reduce (f32 %s, in place, i32), all_gather, reduce_scatter, broadcast, all_to_all_v, "
                   "barrier equal the values computed here%s%s", name, N, backend == KDT_COMM_NCCL ? "within rounding" : "rank order",
             bad ? ": first wrong: " : "", why);
    kdt_comm_world_free(w);
}

/* ---- faults ---- */

typedef struct fjob {
    kdt_comm_world *w;
    int32_t rank, mode;          /* 0: all_reduce; 1: abort; 2: do nothing; 3: all_reduce of another count */
    kdt_status s;
    char msg[512];
    double secs;
} fjob;

static void *fault_main(void *arg) {
    fjob *j = arg;
    kdt_comm *c;
    if (kdt_comm_init(j->w, j->rank, &c) != KDT_OK) return NULL;
    float x[8] = {0};
    const double t0 = kt_now_s();
    if (j->mode == 1) kdt_comm_abort(c, "the test's rank died");
    else if (j->mode != 2) j->s = kdt_comm_all_reduce(c, x, x, j->mode == 3 ? 7 : 8, KDT_F32, NULL);
    j->secs = kt_now_s() - t0;
    snprintf(j->msg, sizeof j->msg, "%s", j->s ? kdt_last_error() : "");
    kdt_comm_free(c);
    return NULL;
}

/* Runs N ranks of the given modes; timeout_ms for the world. */
static void run_faults(int32_t N, const int32_t *modes, int32_t timeout_ms, fjob *jobs) {
    kdt_comm_world *w;
    if (kdt_comm_world_create(KDT_COMM_LOCAL, N, timeout_ms, &w) != KDT_OK) return;
    pthread_t th[MAXN];
    for (int32_t r = 0; r < N; r++) {
        jobs[r] = (fjob){.w = w, .rank = r, .mode = modes[r]};
        pthread_create(&th[r], NULL, fault_main, &jobs[r]);
    }
    for (int32_t r = 0; r < N; r++) pthread_join(th[r], NULL);
    kdt_comm_world_free(w);
}

static void check_faults(void) {
    fjob j[MAXN];
    /* Rank 1 aborts: ranks 0 and 2 end at once (the timeout is a minute) with its message. */
    run_faults(3, (const int32_t[]){0, 1, 0}, 60000, j);
    int ok = 1;
    for (int r = 0; r < 3; r += 2)
        ok &= j[r].s == KDT_ERR_COMM && strstr(j[r].msg, "rank 1 aborted") && strstr(j[r].msg, "died") && j[r].secs < 5;
    kt_check(ok, "abort: rank 1's abort ends ranks 0 and 2's all_reduce with KDT_ERR_COMM in %.3f s: \"%s\"", j[0].secs, j[0].msg);
    /* Rank 1 never comes: the others' wait ends at the 300 ms timeout, naming it. */
    run_faults(3, (const int32_t[]){0, 2, 0}, 300, j);
    ok = 1;
    for (int r = 0; r < 3; r += 2) ok &= j[r].s == KDT_ERR_COMM && strstr(j[r].msg, "rank(s) 1 never arrived") && j[r].secs < 5;
    kt_check(ok, "timeout: a rank that never calls ends the others' all_reduce after %.3f s: \"%s\"", j[0].secs, j[0].msg);
    /* Counts differ: an error on both ranks. */
    run_faults(2, (const int32_t[]){0, 3}, 10000, j);
    kt_check(j[0].s == KDT_ERR_COMM && j[1].s == KDT_ERR_COMM && strstr(j[0].msg, "8 x f32") && strstr(j[0].msg, "7 x f32"),
             "mismatch: all_reduce of 8 and of 7 elements fails on both ranks: \"%s\"", j[0].msg);
}

/* NCCL: a clear error where it cannot run; with GPUs and the library, worlds of 1 .. min(GPUs, 4). */
static void check_nccl(void) {
    kdt_comm_world *w = NULL;
    kdt_status s = kdt_comm_world_create(KDT_COMM_NCCL, 1, 10000, &w);
    kdt_comm_world_free(w);
    if (s != KDT_OK) {
        kt_check(s == KDT_ERR_UNSUPPORTED && strstr(kdt_last_error(), "NCCL"), "nccl: unavailable here, said so: %s",
                 kdt_last_error());
        if (kdt_cuda_available()) kt_skip("nccl worlds: no libnccl.so.2 ($KDT_NCCL_LIB)");
        return;
    }
    const int ndev = kdt_cuda_device_count();
    if (!ndev) kt_skip("nccl worlds: no CUDA device (the library loads)");
    for (int32_t N = 1; N <= ndev && N <= MAXN; N++) check_world(KDT_COMM_NCCL, N);
}

int main(void) {
    const char *seed = getenv("KDT_SEED");
    g_seed = seed && *seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL);
    printf("test_comm: seed %llu\n", (unsigned long long)g_seed);
    for (int32_t N = 1; N <= MAXN; N++) check_world(KDT_COMM_LOCAL, N);
    check_faults();
    check_nccl();
    return kt_exit_code();
}
