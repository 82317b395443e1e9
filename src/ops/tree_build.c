/* tree_build (docs/interfaces.md 2.1): validation, backend dispatch and the tensor adapter. */
#include <math.h>

#include "common/internal.h"
#include "ops/backends.h"
#include "ops/io.h"

static kdt_status validate(const kdt_tree_build_params *p) {
    if (!p) return kdt_fail(KDT_ERR_INVALID_ARG, "tree_build: params is NULL");
    if (p->B < 0) return kdt_fail(KDT_ERR_SHAPE, "tree_build: B = %d is negative", p->B);
    if (p->D < 1 || p->D > KDT_TREE_MAX_DEPTH)
        return kdt_fail(KDT_ERR_SHAPE, "tree_build: D = %d outside 1 .. %d", p->D, KDT_TREE_MAX_DEPTH);
    if (p->K < 1 || p->K > KDT_TREE_MAX_TOPK)
        return kdt_fail(KDT_ERR_SHAPE, "tree_build: K = %d outside 1 .. %d", p->K, KDT_TREE_MAX_TOPK);
    if (p->budget < 1 || p->budget > KDT_TREE_MAX_BUDGET)
        return kdt_fail(KDT_ERR_INVALID_ARG, "tree_build: budget = %d outside 1 .. %d", p->budget,
                        KDT_TREE_MAX_BUDGET);
    if (p->B == 0) return KDT_OK;
    if (!p->scores || !p->tokens || !p->root_token || !p->seq_len)
        return kdt_fail(KDT_ERR_INVALID_ARG, "tree_build: an input pointer is NULL");
    if (!p->num_nodes || !p->node_token || !p->node_parent || !p->node_depth || !p->node_cand ||
        !p->node_score || !p->positions || !p->tree_mask || !p->first_child || !p->next_sibling)
        return kdt_fail(KDT_ERR_INVALID_ARG, "tree_build: an output pointer is NULL");
    return KDT_OK;
}

kdt_status kdt_tree_build(const kdt_tree_build_params *p, kdt_backend backend, void *stream) {
    kdt_status s = validate(p);
    if (s != KDT_OK || p->B == 0) return s;
    if (backend == KDT_BACKEND_CPU) return kdt_tree_build_cpu(p);
    return kdt_tree_build_cuda(p, stream);
}

/* -inf and NaN rank below every finite score (docs/interfaces.md 2.1). */
static int is_bottom(float x) { return isnan(x) || x == -INFINITY; }

/* Each (b, d) row non-increasing in the order of docs/interfaces.md 2.1: -inf and NaN only at the end. */
static kdt_status check_sorted(const float *scores, int32_t B, int32_t D, int32_t K) {
    for (int32_t b = 0; b < B; b++)
        for (int32_t d = 0; d < D; d++) {
            const float *row = scores + ((size_t)b * D + d) * K;
            for (int32_t k = 1; k < K; k++) {
                float prev = row[k - 1], cur = row[k];
                if (is_bottom(cur) || (!is_bottom(prev) && cur <= prev)) continue;
                return kdt_fail(KDT_ERR_INVALID_ARG,
                                "tensor 'scores': scores[%d][%d][%d] = %g ranks above scores[%d][%d][%d] = %g; "
                                "each (b, d) row must be non-increasing, -inf and NaN only at its end",
                                b, d, k, cur, b, d, k - 1, prev);
            }
        }
    return KDT_OK;
}

/* positions = seq_len + depth must fit in i32. */
static kdt_status check_seq_len(const int32_t *seq_len, int32_t B, int32_t D) {
    for (int32_t b = 0; b < B; b++)
        if (seq_len[b] < 0 || seq_len[b] > INT32_MAX - D)
            return kdt_fail(KDT_ERR_INVALID_ARG, "tensor 'seq_len': seq_len[%d] = %d outside 0 .. %d", b,
                            seq_len[b], INT32_MAX - D);
    return KDT_OK;
}

enum { B, D, K, N, Q };
enum { SCORES, TOKENS, ROOT_TOKEN, SEQ_LEN, BUDGET, NUM_NODES, NODE_TOKEN, NODE_PARENT, NODE_DEPTH, NODE_CAND, NODE_SCORE,
       POSITIONS, TREE_MASK, FIRST_CHILD, NEXT_SIBLING };
#define I32 KDT_IO_DT(KDT_I32)
#define F32 KDT_IO_DT(KDT_F32)

static kdt_status check(const kdt_io *io) {
    kdt_status s = check_sorted(io->host[SCORES], (int32_t)io->dim[B], (int32_t)io->dim[D], (int32_t)io->dim[K]);
    return s != KDT_OK ? s : check_seq_len(io->host[SEQ_LEN], (int32_t)io->dim[B], (int32_t)io->dim[D]);
}

static kdt_status call(const kdt_io *io, kdt_backend backend) {
    void *const *t = io->ptr;
    const kdt_tree_build_params p = {
        .B = (int32_t)io->dim[B], .D = (int32_t)io->dim[D], .K = (int32_t)io->dim[K], .budget = (int32_t)io->dim[N],
        .scores = t[SCORES], .tokens = t[TOKENS], .root_token = t[ROOT_TOKEN], .seq_len = t[SEQ_LEN],
        .num_nodes = t[NUM_NODES], .node_token = t[NODE_TOKEN], .node_parent = t[NODE_PARENT], .node_depth = t[NODE_DEPTH],
        .node_cand = t[NODE_CAND], .node_score = t[NODE_SCORE], .positions = t[POSITIONS], .tree_mask = t[TREE_MASK],
        .first_child = t[FIRST_CHILD], .next_sibling = t[NEXT_SIBLING]};
    return kdt_tree_build(&p, backend, NULL);
}

static const kdt_io_op io_op = {
    "tree_build",
    .dims = {[B] = {"B", 0, INT32_MAX}, [D] = {"D", 1, KDT_TREE_MAX_DEPTH}, [K] = {"K", 1, KDT_TREE_MAX_TOPK},
             [N] = {"N", 1, KDT_TREE_MAX_BUDGET}, [Q] = {"Q", .from = "N", .add = 1}},
    .tensors = {
        [SCORES] = {"scores", F32, "B D K"},
        [TOKENS] = {"tokens", I32, "B D K"},
        [ROOT_TOKEN] = {"root_token", I32, "B"},
        [SEQ_LEN] = {"seq_len", I32, "B"},
        [BUDGET] = {"budget", I32, "", .bind = "N"},
        [NUM_NODES] = {"num_nodes", I32, "B", KDT_IO_OUT},
        [NODE_TOKEN] = {"node_token", I32, "B Q", KDT_IO_OUT},
        [NODE_PARENT] = {"node_parent", I32, "B Q", KDT_IO_OUT},
        [NODE_DEPTH] = {"node_depth", I32, "B Q", KDT_IO_OUT},
        [NODE_CAND] = {"node_cand", I32, "B Q", KDT_IO_OUT},
        [NODE_SCORE] = {"node_score", F32, "B Q", KDT_IO_OUT},
        [POSITIONS] = {"positions", I32, "B Q", KDT_IO_OUT},
        [TREE_MASK] = {"tree_mask", KDT_IO_DT(KDT_U8), "B Q Q", KDT_IO_OUT},
        [FIRST_CHILD] = {"first_child", I32, "B Q", KDT_IO_OUT},
        [NEXT_SIBLING] = {"next_sibling", I32, "B Q", KDT_IO_OUT},
    },
    .check = check,
    .call = call,
};

kdt_status kdt_tree_build_run(const kdt_kdtr *in, kdt_kdtr_writer *out, kdt_backend backend) {
    return kdt_io_run(&io_op, in, out, backend);
}
