/* tree_accept (SPEC 2.3): validation, backend dispatch and the tensor adapter. */
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

kdt_status kdt_tree_accept_run(const kdt_kdtr *in, kdt_kdtr_writer *out, kdt_backend backend) {
    kdt_tensor_view tok, par, num, pred;
    kdt_status s;
    if ((s = kdt_kdtr_find_typed(in, "node_token", KDT_I32, 2, NULL, &tok)) != KDT_OK) return s;
    const int64_t bq[2] = {(int64_t)tok.dims[0], (int64_t)tok.dims[1]};
    const int64_t b1[1] = {bq[0]};
    if ((s = kdt_kdtr_find_typed(in, "node_parent", KDT_I32, 2, bq, &par)) != KDT_OK) return s;
    if ((s = kdt_kdtr_find_typed(in, "num_nodes", KDT_I32, 1, b1, &num)) != KDT_OK) return s;
    if ((s = kdt_kdtr_find_typed(in, "target_pred", KDT_I32, 2, bq, &pred)) != KDT_OK) return s;
    if (bq[0] > INT32_MAX)
        return kdt_fail(KDT_ERR_SHAPE, "tensor 'node_token': B = %lld exceeds %d", (long long)bq[0], INT32_MAX);
    if (bq[1] < 1 || bq[1] > KDT_TREE_MAX_BUDGET + 1)
        return kdt_fail(KDT_ERR_SHAPE, "tensor 'node_token': Q = %lld outside 1 .. %d",
                        (long long)bq[1], KDT_TREE_MAX_BUDGET + 1);

    kdt_tree_accept_params p = {.B = (int32_t)bq[0], .Q = (int32_t)bq[1]};
    const uint64_t d_b[1] = {(uint64_t)p.B}, d_bq[2] = {(uint64_t)p.B, (uint64_t)p.Q};
    int32_t *h_len, *h_idx, *h_tok, *h_status;
    if ((s = kdt_io_output(out, "accept_len", KDT_I32, 1, d_b, (void **)&h_len)) != KDT_OK) return s;
    if ((s = kdt_io_output(out, "accept_index", KDT_I32, 2, d_bq, (void **)&h_idx)) != KDT_OK) return s;
    if ((s = kdt_io_output(out, "accept_tokens", KDT_I32, 2, d_bq, (void **)&h_tok)) != KDT_OK) return s;
    if ((s = kdt_io_output(out, "status", KDT_I32, 1, d_b, (void **)&h_status)) != KDT_OK) return s;

    kdt_stage st;
    kdt_stage_init(&st, backend);
    const size_t bq_bytes = (size_t)p.B * p.Q * 4, b_bytes = (size_t)p.B * 4;
    if ((s = kdt_stage_in(&st, "node_token", tok.data, bq_bytes, (const void **)&p.node_token)) ||
        (s = kdt_stage_in(&st, "node_parent", par.data, bq_bytes, (const void **)&p.node_parent)) ||
        (s = kdt_stage_in(&st, "num_nodes", num.data, b_bytes, (const void **)&p.num_nodes)) ||
        (s = kdt_stage_in(&st, "target_pred", pred.data, bq_bytes, (const void **)&p.target_pred)) ||
        (s = kdt_stage_out(&st, "accept_len", h_len, b_bytes, (void **)&p.accept_len)) ||
        (s = kdt_stage_out(&st, "accept_index", h_idx, bq_bytes, (void **)&p.accept_index)) ||
        (s = kdt_stage_out(&st, "accept_tokens", h_tok, bq_bytes, (void **)&p.accept_tokens)) ||
        (s = kdt_stage_out(&st, "status", h_status, b_bytes, (void **)&p.status)) ||
        (s = kdt_tree_accept(&p, backend, NULL)) || (s = kdt_stage_finish(&st))) {
        kdt_stage_release(&st);
        return s;
    }
    kdt_stage_release(&st);
    return KDT_OK;
}
