/* Communicators (include/kdt/comm.h): the world, rendezvous with a timeout and aborts, and the
 * local backend, whose ranks are threads reading each other's posted buffers. A collective posts
 * this rank's call, meets the others, computes this rank's output from every rank's input in rank
 * order (so sums are the same bits everywhere), and meets them again so that no input is freed or
 * overwritten while another rank still reads it. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/internal.h"
#include "model/comm_internal.h"

#define DEFAULT_TIMEOUT_MS 300000

const char *kdt_comm_op_name(kdt_comm_op op) {
    static const char *names[] = {"barrier", "all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all_v"};
    return names[op];
}

static void fail_locked(kdt_comm_world *w, const char *fmt, va_list ap) {
    if (!w->aborted) {
        vsnprintf(w->why, sizeof w->why, fmt, ap);
        w->aborted = 1;
    }
    pthread_cond_broadcast(&w->cv);
}

kdt_status kdt_comm_fail_world(kdt_comm_world *w, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&w->mu);
    fail_locked(w, fmt, ap);
    pthread_mutex_unlock(&w->mu);
    va_end(ap);
    return kdt_comm_check(w);
}

static kdt_status fail_world_locked(kdt_comm_world *w, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static kdt_status fail_world_locked(kdt_comm_world *w, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fail_locked(w, fmt, ap);
    va_end(ap);
    return KDT_ERR_COMM;
}

int kdt_comm_aborted(kdt_comm_world *w) {
    pthread_mutex_lock(&w->mu);
    const int a = w->aborted;
    pthread_mutex_unlock(&w->mu);
    return a;
}

kdt_status kdt_comm_check(kdt_comm_world *w) {
    char why[sizeof w->why];
    pthread_mutex_lock(&w->mu);
    const int aborted = w->aborted;
    if (aborted) memcpy(why, w->why, sizeof why);
    pthread_mutex_unlock(&w->mu);
    return aborted ? kdt_fail(KDT_ERR_COMM, "comm: %s", why) : KDT_OK;
}

kdt_status kdt_comm_world_create(kdt_comm_backend backend, int32_t size, int32_t timeout_ms, kdt_comm_world **out) {
    if (!out) return kdt_fail(KDT_ERR_INVALID_ARG, "comm: out is NULL");
    *out = NULL;
    if (backend != KDT_COMM_LOCAL && backend != KDT_COMM_NCCL)
        return kdt_fail(KDT_ERR_INVALID_ARG, "comm: unknown backend %d", (int)backend);
    if (size < 1 || size > 4096) return kdt_fail(KDT_ERR_INVALID_ARG, "comm: size = %d outside 1 .. 4096", size);
    if (timeout_ms < 0) return kdt_fail(KDT_ERR_INVALID_ARG, "comm: timeout_ms = %d is negative", timeout_ms);
    const char *env = getenv("KDT_COMM_TIMEOUT_MS");
    if (timeout_ms == 0) timeout_ms = env && *env ? (int32_t)strtol(env, NULL, 10) : DEFAULT_TIMEOUT_MS;
    kdt_comm_world *w = calloc(1, sizeof *w);
    if (!w) return kdt_fail(KDT_ERR_NOMEM, "comm: out of memory");
    w->backend = backend;
    w->size = size;
    w->timeout_ms = timeout_ms > 0 ? timeout_ms : DEFAULT_TIMEOUT_MS;
    w->entered = calloc((size_t)size, sizeof *w->entered);
    w->posted = calloc((size_t)size, sizeof *w->posted);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&w->mu, NULL);
    kdt_status s = w->entered && w->posted ? KDT_OK : kdt_fail(KDT_ERR_NOMEM, "comm: out of memory");
    if (s == KDT_OK && backend == KDT_COMM_NCCL) s = kdt_nccl_world_init(w);
    if (s != KDT_OK) {
        kdt_comm_world_free(w);
        return s;
    }
    *out = w;
    return KDT_OK;
}

void kdt_comm_world_free(kdt_comm_world *w) {
    if (!w) return;
    if (w->nccl) kdt_nccl_world_free(w);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->entered);
    free(w->posted);
    free(w);
}

kdt_status kdt_comm_init(kdt_comm_world *w, int32_t rank, kdt_comm **out) {
    if (!out) return kdt_fail(KDT_ERR_INVALID_ARG, "comm: out is NULL");
    *out = NULL;
    if (!w || rank < 0 || rank >= w->size)
        return kdt_fail(KDT_ERR_INVALID_ARG, "comm: rank %d outside 0 .. %d", rank, w ? w->size - 1 : -1);
    kdt_comm *c = calloc(1, sizeof *c);
    if (!c) return kdt_fail(KDT_ERR_NOMEM, "comm: rank %d: out of memory", rank);
    *c = (kdt_comm){.w = w, .rank = rank, .timeout_ms = w->timeout_ms};
    kdt_status s = w->backend == KDT_COMM_NCCL ? kdt_nccl_init(c) : KDT_OK;
    if (s != KDT_OK) {
        kdt_comm_fail_world(w, "rank %d could not join: %s", rank, kdt_last_error());
        free(c);
        return s;
    }
    *out = c;
    return KDT_OK;
}

void kdt_comm_free(kdt_comm *c) {
    if (!c) return;
    if (c->nccl) kdt_nccl_free(c);
    free(c);
}

int32_t kdt_comm_rank(const kdt_comm *c) { return c ? c->rank : 0; }
int32_t kdt_comm_size(const kdt_comm *c) { return c ? c->w->size : 1; }
kdt_comm_backend kdt_comm_get_backend(const kdt_comm *c) { return c ? c->w->backend : KDT_COMM_LOCAL; }
void kdt_comm_set_timeout(kdt_comm *c, int32_t timeout_ms) { c->timeout_ms = timeout_ms > 0 ? timeout_ms : 0; }

void kdt_comm_abort(kdt_comm *c, const char *why) {
    if (c) kdt_comm_fail_world(c->w, "rank %d aborted: %s", c->rank, why ? why : "no reason given");
}

/* Waits until every rank has entered this rendezvous; the timeout or an abort ends the wait. */
static kdt_status rendezvous(kdt_comm *c, const char *what) {
    kdt_comm_world *w = c->w;
    pthread_mutex_lock(&w->mu);
    const uint64_t mine = w->gen;
    if (!w->aborted) {
        w->entered[c->rank] = mine + 1;
        if (++w->arrived == w->size) {
            w->arrived = 0;
            w->gen++;
            pthread_cond_broadcast(&w->cv);
        }
    }
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += c->timeout_ms / 1000;
    dl.tv_nsec += (long)(c->timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) { dl.tv_sec++; dl.tv_nsec -= 1000000000L; }
    while (w->gen == mine && !w->aborted) {
        if (!c->timeout_ms) { pthread_cond_wait(&w->cv, &w->mu); continue; }
        if (pthread_cond_timedwait(&w->cv, &w->mu, &dl) != ETIMEDOUT || w->gen != mine || w->aborted) continue;
        char missing[256] = "";
        size_t k = 0;
        for (int32_t r = 0; r < w->size && k + 12 < sizeof missing; r++)
            if (w->entered[r] != mine + 1) k += (size_t)snprintf(missing + k, sizeof missing - k, "%s%d", k ? ", " : "", r);
        fail_world_locked(w, "%s: rank %d waited %d ms; rank(s) %s never arrived", what, c->rank, c->timeout_ms, missing);
    }
    const int done = w->gen != mine;
    pthread_mutex_unlock(&w->mu);
    return done ? KDT_OK : kdt_comm_check(w);
}

/* dst [n] = the sum over ranks of posted[r] + off, in rank order. */
static void sum_ranks(const kdt_comm_world *w, size_t off, size_t n, kdt_dtype dt, void *dst) {
#define SUM(T)                                                                                     \
    for (size_t i = 0; i < n; i++) {                                                               \
        T a = ((const T *)w->posted[0].send)[off + i];                                             \
        for (int32_t r = 1; r < w->size; r++) a += ((const T *)w->posted[r].send)[off + i];        \
        ((T *)dst)[i] = a;                                                                         \
    }
    switch (dt) {
    case KDT_F32: SUM(float) break;
    case KDT_F64: SUM(double) break;
    case KDT_I32: SUM(int32_t) break;
    default: SUM(int64_t) break;
    }
#undef SUM
}

/* Every rank's call must match rank 0's; checked by each rank on the posted calls. */
static kdt_status check_calls(kdt_comm *c, const kdt_comm_call *mine) {
    const kdt_comm_world *w = c->w;
    for (int32_t r = 0; r < w->size; r++) {
        const kdt_comm_call *o = &w->posted[r];
        if (o->op != mine->op || o->count != mine->count || o->dtype != mine->dtype || o->root != mine->root)
            return kdt_comm_fail_world(c->w, "%s: rank %d called %s with %zu x %s (root %d), rank %d %s with %zu x %s (root %d)",
                                       kdt_comm_op_name(mine->op), c->rank, kdt_comm_op_name(mine->op), mine->count,
                                       kdt_dtype_name(mine->dtype), mine->root, r, kdt_comm_op_name(o->op), o->count,
                                       kdt_dtype_name(o->dtype), o->root);
        if (mine->op == KDT_COMM_OP_ALL_TO_ALL && o->send_counts[c->rank] != mine->recv_counts[r])
            return kdt_comm_fail_world(c->w, "all_to_all_v: rank %d sends %zu elements to rank %d, which expects %zu", r,
                                       o->send_counts[c->rank], c->rank, mine->recv_counts[r]);
    }
    return KDT_OK;
}

static kdt_status run_local(kdt_comm *c, const kdt_comm_call *call) {
    kdt_comm_world *w = c->w;
    const size_t es = kdt_dtype_size(call->dtype), N = (size_t)w->size, n = call->count;
    size_t in_bytes = n * es, out_bytes = n * es;
    if (call->op == KDT_COMM_OP_ALL_GATHER) out_bytes *= N;
    if (call->op == KDT_COMM_OP_REDUCE_SCATTER) in_bytes *= N;
    /* In place: the others read this rank's input while it writes its output, so they read a copy. */
    const char *s = call->send, *r = call->recv;
    void *copy = NULL;
    kdt_comm_call posted = *call;
    if (call->op != KDT_COMM_OP_BROADCAST && call->op != KDT_COMM_OP_BARRIER && in_bytes && s < r + out_bytes && r < s + in_bytes) {
        if (!(copy = malloc(in_bytes)))
            return kdt_comm_fail_world(w, "%s: rank %d out of memory", kdt_comm_op_name(call->op), c->rank);
        posted.send = memcpy(copy, s, in_bytes);
    }
    w->posted[c->rank] = posted;
    kdt_status st = rendezvous(c, kdt_comm_op_name(call->op));
    if (st == KDT_OK) st = check_calls(c, call);
    if (st == KDT_OK) switch (call->op) {
    case KDT_COMM_OP_ALL_REDUCE: sum_ranks(w, 0, n, call->dtype, call->recv); break;
    case KDT_COMM_OP_REDUCE_SCATTER: sum_ranks(w, (size_t)c->rank * n, n, call->dtype, call->recv); break;
    case KDT_COMM_OP_ALL_GATHER:
        for (size_t k = 0; k < N; k++) memcpy((char *)call->recv + k * n * es, w->posted[k].send, n * es);
        break;
    case KDT_COMM_OP_BROADCAST:
        if (c->rank != call->root) memcpy(call->recv, w->posted[call->root].send, n * es);
        break;
    case KDT_COMM_OP_ALL_TO_ALL:
        for (size_t p = 0; p < N; p++) {
            const kdt_comm_call *o = &w->posted[p];
            memcpy((char *)call->recv + call->recv_offs[p] * es, (const char *)o->send + o->send_offs[c->rank] * es,
                   o->send_counts[c->rank] * es);
        }
        break;
    case KDT_COMM_OP_BARRIER: break;
    }
    if (st == KDT_OK) st = rendezvous(c, kdt_comm_op_name(call->op));
    free(copy);
    return st;
}

static kdt_status run(kdt_comm *c, const kdt_comm_call *call) {
    if (!c) return kdt_fail(KDT_ERR_INVALID_ARG, "comm: %s on a NULL communicator", kdt_comm_op_name(call->op));
    const int reduce = call->op == KDT_COMM_OP_ALL_REDUCE || call->op == KDT_COMM_OP_REDUCE_SCATTER;
    const kdt_dtype dt = call->dtype;
    if (reduce && dt != KDT_F32 && dt != KDT_F64 && dt != KDT_I32 && dt != KDT_I64 &&
        (c->w->backend == KDT_COMM_LOCAL || (dt != KDT_BF16 && dt != KDT_F16)))
        return kdt_fail(KDT_ERR_DTYPE, "comm: %s does not sum %s", kdt_comm_op_name(call->op), kdt_dtype_name(dt));
    if (call->op == KDT_COMM_OP_BROADCAST && (call->root < 0 || call->root >= c->w->size))
        return kdt_fail(KDT_ERR_INVALID_ARG, "comm: broadcast root %d outside 0 .. %d", call->root, c->w->size - 1);
    if (call->op != KDT_COMM_OP_BARRIER && call->op != KDT_COMM_OP_ALL_TO_ALL && call->count && (!call->send || !call->recv))
        return kdt_fail(KDT_ERR_INVALID_ARG, "comm: %s with a NULL buffer", kdt_comm_op_name(call->op));
    kdt_status s = kdt_comm_check(c->w);
    if (s != KDT_OK) return s;
    return c->w->backend == KDT_COMM_LOCAL ? run_local(c, call) : kdt_nccl_run(c, call);
}

kdt_status kdt_comm_barrier(kdt_comm *c) { return run(c, &(kdt_comm_call){.op = KDT_COMM_OP_BARRIER, .dtype = KDT_U8}); }

kdt_status kdt_comm_all_reduce(kdt_comm *c, const void *send, void *recv, size_t count, kdt_dtype dtype, void *stream) {
    return run(c, &(kdt_comm_call){.op = KDT_COMM_OP_ALL_REDUCE, .send = send, .recv = recv, .count = count, .dtype = dtype,
                                   .stream = stream});
}

kdt_status kdt_comm_all_gather(kdt_comm *c, const void *send, void *recv, size_t count, kdt_dtype dtype, void *stream) {
    return run(c, &(kdt_comm_call){.op = KDT_COMM_OP_ALL_GATHER, .send = send, .recv = recv, .count = count, .dtype = dtype,
                                   .stream = stream});
}

kdt_status kdt_comm_reduce_scatter(kdt_comm *c, const void *send, void *recv, size_t count, kdt_dtype dtype, void *stream) {
    return run(c, &(kdt_comm_call){.op = KDT_COMM_OP_REDUCE_SCATTER, .send = send, .recv = recv, .count = count,
                                   .dtype = dtype, .stream = stream});
}

kdt_status kdt_comm_broadcast(kdt_comm *c, void *buf, size_t count, kdt_dtype dtype, int32_t root, void *stream) {
    return run(c, &(kdt_comm_call){.op = KDT_COMM_OP_BROADCAST, .send = buf, .recv = buf, .count = count, .dtype = dtype,
                                   .root = root, .stream = stream});
}

kdt_status kdt_comm_all_to_all_v(kdt_comm *c, const void *send, const size_t *send_counts, const size_t *send_offs, void *recv,
                                 const size_t *recv_counts, const size_t *recv_offs, kdt_dtype dtype, void *stream) {
    if (!send_counts || !send_offs || !recv_counts || !recv_offs)
        return kdt_fail(KDT_ERR_INVALID_ARG, "comm: all_to_all_v with a NULL count or offset array");
    return run(c, &(kdt_comm_call){.op = KDT_COMM_OP_ALL_TO_ALL, .send = send, .recv = recv, .dtype = dtype,
                                   .send_counts = send_counts, .send_offs = send_offs, .recv_counts = recv_counts,
                                   .recv_offs = recv_offs, .stream = stream});
}
