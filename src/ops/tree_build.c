/* tree_build (SPEC 2.1): validation, backend dispatch and the tensor adapter. */
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

/* -inf and NaN rank below every finite score (SPEC 2.1). */
static int is_bottom(float x) { return isnan(x) || x == -INFINITY; }

/* Each (b, d) row non-increasing in the SPEC's order: -inf and NaN only at the end. */
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

kdt_status kdt_tree_build_run(const kdt_kdtr *in, kdt_kdtr_writer *out, kdt_backend backend) {
    kdt_tensor_view sc, tok, root, seq;
    int32_t budget = 0;
    kdt_status s;
    if ((s = kdt_kdtr_find_typed(in, "scores", KDT_F32, 3, NULL, &sc)) != KDT_OK) return s;
    if (sc.dims[0] > INT32_MAX || sc.dims[1] < 1 || sc.dims[1] > KDT_TREE_MAX_DEPTH || sc.dims[2] < 1 ||
        sc.dims[2] > KDT_TREE_MAX_TOPK)
        return kdt_fail(KDT_ERR_SHAPE, "tensor 'scores': shape [%llu, %llu, %llu] needs B <= %d, D in 1 .. %d, K in 1 .. %d",
                        (unsigned long long)sc.dims[0], (unsigned long long)sc.dims[1],
                        (unsigned long long)sc.dims[2], INT32_MAX, KDT_TREE_MAX_DEPTH, KDT_TREE_MAX_TOPK);
    const int64_t bdk[3] = {(int64_t)sc.dims[0], (int64_t)sc.dims[1], (int64_t)sc.dims[2]};
    if ((s = kdt_kdtr_find_typed(in, "tokens", KDT_I32, 3, bdk, &tok)) != KDT_OK) return s;
    if ((s = kdt_kdtr_find_typed(in, "root_token", KDT_I32, 1, bdk, &root)) != KDT_OK) return s;
    if ((s = kdt_kdtr_find_typed(in, "seq_len", KDT_I32, 1, bdk, &seq)) != KDT_OK) return s;
    if ((s = kdt_kdtr_scalar_i32(in, "budget", &budget)) != KDT_OK) return s;
    if (budget < 1 || budget > KDT_TREE_MAX_BUDGET)
        return kdt_fail(KDT_ERR_INVALID_ARG, "tensor 'budget': %d outside 1 .. %d", budget, KDT_TREE_MAX_BUDGET);

    kdt_tree_build_params p = {.B = (int32_t)bdk[0], .D = (int32_t)bdk[1], .K = (int32_t)bdk[2], .budget = budget};
    if ((s = check_sorted(sc.data, p.B, p.D, p.K)) != KDT_OK) return s;
    if ((s = check_seq_len(seq.data, p.B, p.D)) != KDT_OK) return s;

    const int32_t Q = budget + 1;
    const uint64_t d_b[1] = {(uint64_t)p.B}, d_bq[2] = {(uint64_t)p.B, (uint64_t)Q};
    const uint64_t d_bqq[3] = {(uint64_t)p.B, (uint64_t)Q, (uint64_t)Q};
    if ((s = kdt_io_output(out, "num_nodes", KDT_I32, 1, d_b, (void **)&p.num_nodes)) ||
        (s = kdt_io_output(out, "node_token", KDT_I32, 2, d_bq, (void **)&p.node_token)) ||
        (s = kdt_io_output(out, "node_parent", KDT_I32, 2, d_bq, (void **)&p.node_parent)) ||
        (s = kdt_io_output(out, "node_depth", KDT_I32, 2, d_bq, (void **)&p.node_depth)) ||
        (s = kdt_io_output(out, "node_cand", KDT_I32, 2, d_bq, (void **)&p.node_cand)) ||
        (s = kdt_io_output(out, "node_score", KDT_F32, 2, d_bq, (void **)&p.node_score)) ||
        (s = kdt_io_output(out, "positions", KDT_I32, 2, d_bq, (void **)&p.positions)) ||
        (s = kdt_io_output(out, "tree_mask", KDT_U8, 3, d_bqq, (void **)&p.tree_mask)) ||
        (s = kdt_io_output(out, "first_child", KDT_I32, 2, d_bq, (void **)&p.first_child)) ||
        (s = kdt_io_output(out, "next_sibling", KDT_I32, 2, d_bq, (void **)&p.next_sibling)))
        return s;

    /* The host pointers, kept while p's fields are swapped for device copies. */
    const kdt_tree_build_params h = p;
    const size_t b4 = (size_t)p.B * 4, bdk4 = b4 * p.D * p.K, bq4 = b4 * Q, bqq = (size_t)p.B * Q * Q;
    kdt_stage st;
    kdt_stage_init(&st, backend);
    if ((s = kdt_stage_in(&st, "scores", sc.data, bdk4, (const void **)&p.scores)) ||
        (s = kdt_stage_in(&st, "tokens", tok.data, bdk4, (const void **)&p.tokens)) ||
        (s = kdt_stage_in(&st, "root_token", root.data, b4, (const void **)&p.root_token)) ||
        (s = kdt_stage_in(&st, "seq_len", seq.data, b4, (const void **)&p.seq_len)) ||
        (s = kdt_stage_out(&st, "num_nodes", h.num_nodes, b4, (void **)&p.num_nodes)) ||
        (s = kdt_stage_out(&st, "node_token", h.node_token, bq4, (void **)&p.node_token)) ||
        (s = kdt_stage_out(&st, "node_parent", h.node_parent, bq4, (void **)&p.node_parent)) ||
        (s = kdt_stage_out(&st, "node_depth", h.node_depth, bq4, (void **)&p.node_depth)) ||
        (s = kdt_stage_out(&st, "node_cand", h.node_cand, bq4, (void **)&p.node_cand)) ||
        (s = kdt_stage_out(&st, "node_score", h.node_score, bq4, (void **)&p.node_score)) ||
        (s = kdt_stage_out(&st, "positions", h.positions, bq4, (void **)&p.positions)) ||
        (s = kdt_stage_out(&st, "tree_mask", h.tree_mask, bqq, (void **)&p.tree_mask)) ||
        (s = kdt_stage_out(&st, "first_child", h.first_child, bq4, (void **)&p.first_child)) ||
        (s = kdt_stage_out(&st, "next_sibling", h.next_sibling, bq4, (void **)&p.next_sibling)) ||
        (s = kdt_tree_build(&p, backend, NULL)) || (s = kdt_stage_finish(&st))) {
        kdt_stage_release(&st);
        return s;
    }
    kdt_stage_release(&st);
    return KDT_OK;
}
