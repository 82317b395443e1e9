/* --gpus N: rank 0 in the caller's thread, the other ranks in threads of their own, each loading
 * its experts and serving them (kdt_model_serve_experts) until rank 0's model is freed. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/options.h"
#include "cli/ranks.h"
#include "common/internal.h"

#define MAX_RANKS 64

typedef struct follower {
    kdt_comm_world *w;
    const char *dir;
    uint64_t seed;
    kdt_backend backend;
    int32_t rank;
    pthread_t th;
} follower;

struct kdt_cli_ranks {
    kdt_comm_world *w;
    kdt_comm *c0;
    int n;
    follower f[MAX_RANKS];
};

static kdt_dtype default_dtype(kdt_backend b) { return b == KDT_BACKEND_CUDA ? KDT_BF16 : KDT_F32; }

static kdt_status load_rank(const char *dir, uint64_t seed, kdt_backend b, kdt_comm *c, kdt_model **m) {
    return dir ? kdt_model_load_ranked(dir, b, default_dtype(b), c, m) : kdt_model_builtin_ranked(seed, b, default_dtype(b), c, m);
}

static void *follow(void *arg) {
    follower *f = arg;
    kdt_comm *c = NULL;
    kdt_model *m = NULL;
    kdt_status s = kdt_comm_init(f->w, f->rank, &c);
    if (s == KDT_OK) s = load_rank(f->dir, f->seed, f->backend, c, &m);
    if (s == KDT_OK) s = kdt_model_serve_experts(m);
    /* Rank 0 reports a failure: its message names the rank at fault. */
    kdt_model_free(m);
    kdt_comm_free(c);
    return NULL;
}

void kdt_cli_ranks_end(kdt_cli_ranks *r) {
    if (!r) return;
    /* Rank 0's model was freed, which sent the others STOP, or its load failed, which aborted the world. */
    for (int i = 1; i < r->n; i++) pthread_join(r->f[i].th, NULL);
    kdt_comm_free(r->c0);
    kdt_comm_world_free(r->w);
    free(r);
}

kdt_status kdt_cli_load_model(const char *dir, uint64_t seed, kdt_backend backend, int n, kdt_model **m, kdt_cli_ranks **ranks) {
    *m = NULL;
    *ranks = NULL;
    if (n == 1) return dir ? kdt_model_load(dir, backend, m) : kdt_model_builtin(seed, backend, m);
    const int ndev = backend == KDT_BACKEND_CUDA ? kdt_cuda_device_count() : 0;
    if (backend == KDT_BACKEND_CUDA && n > ndev)
        return kdt_fail(KDT_ERR_INVALID_ARG, "--gpus %d asks for %d CUDA devices; this machine has %d (--backend cpu runs the ranks "
                        "as threads)", n, n, ndev);
    kdt_cli_ranks *r = calloc(1, sizeof *r);
    if (!r) return kdt_fail(KDT_ERR_NOMEM, "--gpus: out of memory");
    r->n = n;
    kdt_status s = kdt_comm_world_create(backend == KDT_BACKEND_CUDA ? KDT_COMM_NCCL : KDT_COMM_LOCAL, n, 0, &r->w);
    if (s != KDT_OK) { free(r); return s; }
    int started = 1;
    for (; started < n; started++) {
        r->f[started] = (follower){.w = r->w, .dir = dir, .seed = seed, .backend = backend, .rank = started};
        if (pthread_create(&r->f[started].th, NULL, follow, &r->f[started])) break;
    }
    s = kdt_comm_init(r->w, 0, &r->c0);
    if (s == KDT_OK && started < n) {
        s = kdt_fail(KDT_ERR_NOMEM, "--gpus %d: cannot start the thread of rank %d", n, started);
        kdt_comm_abort(r->c0, kdt_last_error());
    }
    if (s == KDT_OK) s = load_rank(dir, seed, backend, r->c0, m);
    if (s != KDT_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", kdt_last_error());
        r->n = started;
        kdt_cli_ranks_end(r);
        return kdt_fail(s, "%s", msg);
    }
    *ranks = r;
    return KDT_OK;
}

int kdt_cli_gpus(const char *cmd, const char *usage, const char *value, int *n) {
    char *end;
    const long v = strtol(value, &end, 10);
    if (end == value || *end || v < 1 || v > MAX_RANKS)
        return kdt_cli_usage_error(cmd, usage, "--gpus takes a number of ranks in 1 .. 64, not", value);
    *n = (int)v;
    return 0;
}
