/* tree_sample_accept (docs/interfaces.md 2.4): validation, backend dispatch and the tensor adapter. */
#include <math.h>

#include "common/internal.h"
#include "ops/backends.h"
#include "ops/io.h"

static kdt_status validate(const kdt_tree_sample_accept_params *p) {
    if (!p) return kdt_fail(KDT_ERR_INVALID_ARG, "tree_sample_accept: params is NULL");
    if (p->B < 0) return kdt_fail(KDT_ERR_SHAPE, "tree_sample_accept: B = %d is negative", p->B);
    if (p->Q < 1 || p->Q > KDT_TREE_MAX_BUDGET + 1)
        return kdt_fail(KDT_ERR_SHAPE, "tree_sample_accept: Q = %d outside 1 .. %d", p->Q, KDT_TREE_MAX_BUDGET + 1);
    if (p->V < 1 || p->V > KDT_SAMPLE_MAX_VOCAB)
        return kdt_fail(KDT_ERR_SHAPE, "tree_sample_accept: V = %d outside 1 .. %d", p->V, KDT_SAMPLE_MAX_VOCAB);
    if (p->B == 0) return KDT_OK;
    if (!p->node_token || !p->node_parent || !p->num_nodes || !p->target_logits || !p->temperature ||
        !p->top_k || !p->top_p || !p->seed)
        return kdt_fail(KDT_ERR_INVALID_ARG, "tree_sample_accept: an input pointer is NULL");
    if (!p->accept_len || !p->accept_index || !p->accept_tokens || !p->status)
        return kdt_fail(KDT_ERR_INVALID_ARG, "tree_sample_accept: an output pointer is NULL");
    return KDT_OK;
}

/* The per-request sampling values, in host memory (what kdt run checks before staging). */
static kdt_status validate_values(int32_t B, const float *temperature, const int32_t *top_k, const float *top_p) {
    for (int32_t b = 0; b < B; b++) {
        if (!isfinite(temperature[b]) || temperature[b] < 0.0f)
            return kdt_fail(KDT_ERR_INVALID_ARG, "tensor 'temperature': request %d holds %g (needs a finite value >= 0)",
                            b, (double)temperature[b]);
        if (top_k[b] < 0)
            return kdt_fail(KDT_ERR_INVALID_ARG, "tensor 'top_k': request %d holds %d (needs >= 0, 0 is off)", b,
                            top_k[b]);
        if (!(top_p[b] > 0.0f && top_p[b] <= 1.0f))
            return kdt_fail(KDT_ERR_INVALID_ARG, "tensor 'top_p': request %d holds %g (needs 0 < top_p <= 1)", b,
                            (double)top_p[b]);
    }
    return KDT_OK;
}

kdt_status kdt_tree_sample_accept(const kdt_tree_sample_accept_params *p, kdt_backend backend, void *stream) {
    kdt_status s = validate(p);
    if (s != KDT_OK || p->B == 0) return s;
    if (backend == KDT_BACKEND_CPU) return kdt_tree_sample_accept_cpu(p);
    return kdt_tree_sample_accept_cuda(p, stream);
}

enum { B, Q, V };
enum { NODE_TOKEN, NODE_PARENT, NUM_NODES, TARGET_LOGITS, DRAFT_PROBS, TEMPERATURE, TOP_K, TOP_P, SEED,
       ACCEPT_LEN, ACCEPT_INDEX, ACCEPT_TOKENS, STATUS };
#define I32 KDT_IO_DT(KDT_I32)
#define F32 KDT_IO_DT(KDT_F32)

static kdt_status check(const kdt_io *io) {
    return validate_values((int32_t)io->dim[B], io->host[TEMPERATURE], io->host[TOP_K], io->host[TOP_P]);
}

static kdt_status call(const kdt_io *io, kdt_backend backend) {
    void *const *t = io->ptr;
    const kdt_tree_sample_accept_params p = {
        .B = (int32_t)io->dim[B], .Q = (int32_t)io->dim[Q], .V = (int32_t)io->dim[V], .node_token = t[NODE_TOKEN],
        .node_parent = t[NODE_PARENT], .num_nodes = t[NUM_NODES], .target_logits = t[TARGET_LOGITS],
        .draft_probs = io->present[DRAFT_PROBS] ? t[DRAFT_PROBS] : NULL, .temperature = t[TEMPERATURE],
        .top_k = t[TOP_K], .top_p = t[TOP_P], .seed = t[SEED], .accept_len = t[ACCEPT_LEN],
        .accept_index = t[ACCEPT_INDEX], .accept_tokens = t[ACCEPT_TOKENS], .status = t[STATUS]};
    return kdt_tree_sample_accept(&p, backend, NULL);
}

static const kdt_io_op io_op = {
    "tree_sample_accept",
    .dims = {[B] = {"B", 0, INT32_MAX}, [Q] = {"Q", 1, KDT_TREE_MAX_BUDGET + 1}, [V] = {"V", 1, KDT_SAMPLE_MAX_VOCAB}},
    .tensors = {
        [NODE_TOKEN] = {"node_token", I32, "B Q"},
        [NODE_PARENT] = {"node_parent", I32, "B Q"},
        [NUM_NODES] = {"num_nodes", I32, "B"},
        [TARGET_LOGITS] = {"target_logits", F32, "B Q V"},
        [DRAFT_PROBS] = {"draft_probs", F32, "B Q V", KDT_IO_OPTIONAL},
        [TEMPERATURE] = {"temperature", F32, "B"},
        [TOP_K] = {"top_k", I32, "B"},
        [TOP_P] = {"top_p", F32, "B"},
        [SEED] = {"seed", KDT_IO_DT(KDT_U64), "B"},
        [ACCEPT_LEN] = {"accept_len", I32, "B", KDT_IO_OUT},
        [ACCEPT_INDEX] = {"accept_index", I32, "B Q", KDT_IO_OUT},
        [ACCEPT_TOKENS] = {"accept_tokens", I32, "B Q", KDT_IO_OUT},
        [STATUS] = {"status", I32, "B", KDT_IO_OUT},
    },
    .check = check,
    .call = call,
};

kdt_status kdt_tree_sample_accept_run(const kdt_kdtr *in, kdt_kdtr_writer *out, kdt_backend backend) {
    return kdt_io_run(&io_op, in, out, backend);
}
