/* Expert parallel (docs/multi_gpu.md). Rank r of N holds the routed experts [r*E/N, (r+1)*E/N)
 * of every MoE layer. Rank 0 drives: it holds everything else (embedding, attention and its
 * latent cache, dense layers, router, shared experts, LM head), runs the forwards and the loop
 * above them unchanged, and at each MoE layer broadcasts the layer's rows with their routing; every
 * rank runs its own experts on them into per-(row, choice) slots, and an all-reduce gives rank 0
 * every slot. Each slot is written by exactly one rank (zeros elsewhere), and rank 0 adds a row's
 * slots in expert order as the one-rank forward does, so N ranks give the one-rank f32 logits bit
 * for bit. Ranks > 0 sit in kdt_model_serve_experts until rank 0's model is freed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "model/comm_internal.h"
#include "model/ep.h"

enum { EP_STOP = 0, EP_MOE = 1 };

void kdt_ep_assign(kdt_model *m, kdt_comm *comm) {
    const int64_t E = m->cfg.n_routed_experts, r = kdt_comm_rank(comm), N = kdt_comm_size(comm);
    m->comm = N > 1 ? comm : NULL;
    m->e_lo = (int32_t)(r * E / N);
    m->e_n = (int32_t)((r + 1) * E / N - r * E / N);
}

int kdt_ep_driver(const kdt_model *m) { return !m->comm || m->comm->rank == 0; }

/* Ends a rank's failure on every rank: the others' next collective names it. */
static kdt_status spread(const kdt_model *m, kdt_status s) {
    if (s != KDT_OK && m->comm && s != KDT_ERR_COMM) kdt_comm_abort(m->comm, kdt_last_error());
    return s;
}

/* The rows of one MoE layer: xin [R, hidden] f32, then gate_i [R, K] i32 and gate_w [R, K] f32. */
static size_t payload_floats(const kdt_model *m, int64_t R) {
    return (size_t)R * ((size_t)m->cfg.hidden_size + 2 * (size_t)m->cfg.num_experts_per_tok);
}

/* Every rank's experts on the rows, then the slots summed over ranks (rank 0 only reads them). */
static kdt_status exchange(const kdt_model *m, int32_t l, int64_t R, float *pay, float *slots) {
    const size_t hid = (size_t)m->cfg.hidden_size, K = (size_t)m->cfg.num_experts_per_tok;
    kdt_status s = kdt_comm_broadcast(m->comm, pay, payload_floats(m, R), KDT_F32, 0, NULL);
    const float *xin = pay, *gw = pay + (size_t)R * (hid + K);
    const int32_t *gi = (const int32_t *)(pay + (size_t)R * hid);
    if (s == KDT_OK) s = spread(m, kdt_moe_experts_cpu(m, &m->layers[l], R, xin, gi, gw, slots));
    if (s == KDT_OK) s = kdt_comm_all_reduce(m->comm, slots, slots, (size_t)R * K * hid, KDT_F32, NULL);
    return s;
}

kdt_status kdt_ep_moe(const kdt_model *m, int32_t l, int64_t R, const float *xin, const int32_t *gi, const float *gw,
                      float *slots) {
    if (!m->comm) return kdt_moe_experts_cpu(m, &m->layers[l], R, xin, gi, gw, slots);
    const size_t hid = (size_t)m->cfg.hidden_size, K = (size_t)m->cfg.num_experts_per_tok;
    float *pay = malloc(payload_floats(m, R) * sizeof(float));
    if (!pay) return spread(m, kdt_fail(KDT_ERR_NOMEM, "expert parallel: out of memory for %lld rows", (long long)R));
    memcpy(pay, xin, (size_t)R * hid * sizeof(float));
    memcpy(pay + (size_t)R * hid, gi, (size_t)R * K * sizeof(int32_t));
    memcpy(pay + (size_t)R * (hid + K), gw, (size_t)R * K * sizeof(float));
    const int64_t head[3] = {EP_MOE, l, R};
    kdt_status s = kdt_comm_broadcast(m->comm, (void *)head, 3, KDT_I64, 0, NULL);
    if (s == KDT_OK) s = exchange(m, l, R, pay, slots);
    free(pay);
    return s;
}

void kdt_ep_stop(kdt_model *m) {
    if (!m->comm || m->comm->rank != 0 || kdt_comm_aborted(m->comm->w)) return;
    int64_t head[3] = {EP_STOP, 0, 0};
    (void)kdt_comm_broadcast(m->comm, head, 3, KDT_I64, 0, NULL);
}

kdt_status kdt_model_serve_experts(kdt_model *m) {
    if (!m || kdt_ep_driver(m))
        return kdt_fail(KDT_ERR_INVALID_ARG, "serve_experts: only a rank > 0 of a model loaded with a communicator serves experts");
    kdt_comm *c = m->comm;
    const int32_t timeout = c->timeout_ms;
    const size_t hid = (size_t)m->cfg.hidden_size, K = (size_t)m->cfg.num_experts_per_tok;
    for (;;) {
        int64_t head[3] = {0};
        kdt_comm_set_timeout(c, 0); /* rank 0 may be idle (a server between requests) for as long as it likes */
        kdt_status s = kdt_comm_broadcast(c, head, 3, KDT_I64, 0, NULL);
        kdt_comm_set_timeout(c, timeout);
        if (s != KDT_OK || head[0] == EP_STOP) return s;
        const int64_t l = head[1], R = head[2];
        if (head[0] != EP_MOE || l < 0 || l >= m->cfg.num_hidden_layers || !m->layers[l].is_moe || R < 1 || R > (1 << 24))
            return spread(m, kdt_fail(KDT_ERR_INTERNAL, "serve_experts: rank %d got command %lld for layer %lld, %lld rows",
                                      c->rank, (long long)head[0], (long long)l, (long long)R));
        float *pay = malloc(payload_floats(m, R) * sizeof(float)), *slots = calloc((size_t)R * K * hid, sizeof(float));
        s = pay && slots ? exchange(m, (int32_t)l, R, pay, slots)
                         : spread(m, kdt_fail(KDT_ERR_NOMEM, "serve_experts: rank %d: out of memory for %lld rows", c->rank,
                                              (long long)R));
        free(pay);
        free(slots);
        if (s != KDT_OK) return s;
    }
}

/* Every rank's load outcome: a failure aborts the world (the others then fail naming this rank);
 * a success waits, with no time limit, until every rank has loaded (or one failed). */
static kdt_status agree(kdt_comm *comm, kdt_status s, kdt_model **out) {
    if (s != KDT_OK) {
        char why[600];
        snprintf(why, sizeof why, "model load: %s", kdt_last_error());
        kdt_comm_abort(comm, why);
        return kdt_fail(s, "%s", why);
    }
    const int32_t timeout = comm->timeout_ms;
    kdt_comm_set_timeout(comm, 0);
    s = kdt_comm_barrier(comm);
    kdt_comm_set_timeout(comm, timeout);
    if (s != KDT_OK) {
        (*out)->comm = NULL; /* no STOP to send: the world is aborted */
        kdt_model_free(*out);
        *out = NULL;
    }
    return s;
}

/* The test hook of the fault tests: $KDT_TEST_FAIL_LOAD_RANK = r makes rank r's load fail. */
static kdt_status injected(kdt_comm *comm) {
    const char *v = getenv("KDT_TEST_FAIL_LOAD_RANK");
    if (!v || !*v || atoi(v) != comm->rank) return KDT_OK;
    return kdt_fail(KDT_ERR_IO, "rank %d: injected load failure ($KDT_TEST_FAIL_LOAD_RANK)", comm->rank);
}

static kdt_status ranked(const char *dir, uint64_t seed, kdt_backend backend, kdt_dtype dtype, kdt_comm *comm, kdt_model **out) {
    if (!out) return kdt_fail(KDT_ERR_INVALID_ARG, "model_load_ranked: out is NULL");
    *out = NULL;
    if (kdt_comm_size(comm) == 1)
        return dir ? kdt_model_load_as(dir, backend, dtype, out) : kdt_model_builtin_as(seed, backend, dtype, out);
    kdt_status s = injected(comm);
    if (s == KDT_OK && backend != KDT_BACKEND_CPU)
        s = kdt_fail(KDT_ERR_UNSUPPORTED, "model: %d ranks on the CUDA backend: the CUDA forward has no expert exchange yet "
                     "(docs/multi_gpu.md); run one GPU, or --backend cpu", kdt_comm_size(comm));
    if (s == KDT_OK)
        s = dir ? kdt_model_load_part(dir, backend, dtype, comm, out) : kdt_model_builtin_part(seed, backend, dtype, comm, out);
    return agree(comm, s, out);
}

kdt_status kdt_model_load_ranked(const char *dir, kdt_backend backend, kdt_dtype dtype, kdt_comm *comm, kdt_model **out) {
    if (!dir) return kdt_fail(KDT_ERR_INVALID_ARG, "model_load_ranked: dir is NULL");
    return ranked(dir, 0, backend, dtype, comm, out);
}

kdt_status kdt_model_builtin_ranked(uint64_t seed, kdt_backend backend, kdt_dtype dtype, kdt_comm *comm, kdt_model **out) {
    return ranked(NULL, seed, backend, dtype, comm, out);
}
