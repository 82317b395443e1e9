/* tree_accept (docs/interfaces.md 2.3): validation, backend dispatch and the tensor adapter. */
#include "common/internal.h"
#include "ops/backends.h"
#include "ops/io.h"

static kdt_status validate(const kdt_tree_accept_params *p) {
    if (!p) return kdt_fail(KDT_ERR_INVALID_ARG, "tree_accept: params is NULL");
    if (p->B < 0) return kdt_fail(KDT_ERR_SHAPE, "tree_accept: B = %d is negative", p->B);
    if (p->Q < 1 || p->Q > KDT_TREE_MAX_BUDGET + 1)
        return kdt_fail(KDT_ERR_SHAPE, "tree_accept: Q = %d outside 1 .. %d", p->Q, KDT_TREE_MAX_BUDGET + 1);
    if (p->B == 0) return KDT_OK;
    if (!p->node_token || !p->node_parent || !p->num_nodes || !p->target_pred)
        return kdt_fail(KDT_ERR_INVALID_ARG, "tree_accept: an input pointer is NULL");
    if (!p->accept_len || !p->accept_index || !p->accept_tokens || !p->status)
        return kdt_fail(KDT_ERR_INVALID_ARG, "tree_accept: an output pointer is NULL");
    return KDT_OK;
}

kdt_status kdt_tree_accept(const kdt_tree_accept_params *p, kdt_backend backend, void *stream) {
    kdt_status s = validate(p);
    if (s != KDT_OK || p->B == 0) return s;
    if (backend == KDT_BACKEND_CPU) return kdt_tree_accept_cpu(p);
    return kdt_tree_accept_cuda(p, stream);
}

enum { B, Q };
enum { NODE_TOKEN, NODE_PARENT, NUM_NODES, TARGET_PRED, ACCEPT_LEN, ACCEPT_INDEX, ACCEPT_TOKENS, STATUS };
#define I32 KDT_IO_DT(KDT_I32)

static kdt_status call(const kdt_io *io, kdt_backend backend) {
    void *const *t = io->ptr;
    const kdt_tree_accept_params p = {
        .B = (int32_t)io->dim[B], .Q = (int32_t)io->dim[Q], .node_token = t[NODE_TOKEN], .node_parent = t[NODE_PARENT],
        .num_nodes = t[NUM_NODES], .target_pred = t[TARGET_PRED], .accept_len = t[ACCEPT_LEN],
        .accept_index = t[ACCEPT_INDEX], .accept_tokens = t[ACCEPT_TOKENS], .status = t[STATUS]};
    return kdt_tree_accept(&p, backend, NULL);
}

static const kdt_io_op io_op = {
    "tree_accept",
    .dims = {[B] = {"B", 0, INT32_MAX}, [Q] = {"Q", 1, KDT_TREE_MAX_BUDGET + 1}},
    .tensors = {
        [NODE_TOKEN] = {"node_token", I32, "B Q"},
        [NODE_PARENT] = {"node_parent", I32, "B Q"},
        [NUM_NODES] = {"num_nodes", I32, "B"},
        [TARGET_PRED] = {"target_pred", I32, "B Q"},
        [ACCEPT_LEN] = {"accept_len", I32, "B", KDT_IO_OUT},
        [ACCEPT_INDEX] = {"accept_index", I32, "B Q", KDT_IO_OUT},
        [ACCEPT_TOKENS] = {"accept_tokens", I32, "B Q", KDT_IO_OUT},
        [STATUS] = {"status", I32, "B", KDT_IO_OUT},
    },
    .call = call,
};

kdt_status kdt_tree_accept_run(const kdt_kdtr *in, kdt_kdtr_writer *out, kdt_backend backend) {
    return kdt_io_run(&io_op, in, out, backend);
}
