/* tree_sample_accept (SPEC 2.4): validation, backend dispatch and the tensor adapter. */
#include <math.h>

#include "common/device.h"
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
#if KDT_HAVE_CUDA
    return kdt_tree_sample_accept_cuda(p, stream);
#else
    (void)stream;
    return kdt_no_cuda("tree_sample_accept");
#endif
}

kdt_status kdt_tree_sample_accept_run(const kdt_kdtr *in, kdt_kdtr_writer *out, kdt_backend backend) {
    kdt_tensor_view tok, par, num, logits, draft, temp, topk, topp, seed;
    kdt_status s;
    if ((s = kdt_kdtr_find_typed(in, "node_token", KDT_I32, 2, NULL, &tok)) != KDT_OK) return s;
    if ((s = kdt_kdtr_find_typed(in, "target_logits", KDT_F32, 3, NULL, &logits)) != KDT_OK) return s;
    const int64_t bq[2] = {(int64_t)tok.dims[0], (int64_t)tok.dims[1]}, b1[1] = {bq[0]};
    const int64_t bqv[3] = {bq[0], bq[1], (int64_t)logits.dims[2]};
    if ((s = kdt_kdtr_find_typed(in, "target_logits", KDT_F32, 3, bqv, &logits)) != KDT_OK) return s;
    if ((s = kdt_kdtr_find_typed(in, "node_parent", KDT_I32, 2, bq, &par)) != KDT_OK) return s;
    if ((s = kdt_kdtr_find_typed(in, "num_nodes", KDT_I32, 1, b1, &num)) != KDT_OK) return s;
    if ((s = kdt_kdtr_find_typed(in, "temperature", KDT_F32, 1, b1, &temp)) != KDT_OK) return s;
    if ((s = kdt_kdtr_find_typed(in, "top_k", KDT_I32, 1, b1, &topk)) != KDT_OK) return s;
    if ((s = kdt_kdtr_find_typed(in, "top_p", KDT_F32, 1, b1, &topp)) != KDT_OK) return s;
    if ((s = kdt_kdtr_find_typed(in, "seed", KDT_U64, 1, b1, &seed)) != KDT_OK) return s;
    const int has_draft = kdt_kdtr_find(in, "draft_probs", &draft) == KDT_OK;
    if (has_draft && (s = kdt_kdtr_find_typed(in, "draft_probs", KDT_F32, 3, bqv, &draft)) != KDT_OK) return s;
    if (bq[0] > INT32_MAX)
        return kdt_fail(KDT_ERR_SHAPE, "tensor 'node_token': B = %lld exceeds %d", (long long)bq[0], INT32_MAX);
    if (bq[1] < 1 || bq[1] > KDT_TREE_MAX_BUDGET + 1)
        return kdt_fail(KDT_ERR_SHAPE, "tensor 'node_token': Q = %lld outside 1 .. %d", (long long)bq[1],
                        KDT_TREE_MAX_BUDGET + 1);
    if (bqv[2] < 1 || bqv[2] > KDT_SAMPLE_MAX_VOCAB)
        return kdt_fail(KDT_ERR_SHAPE, "tensor 'target_logits': V = %lld outside 1 .. %d", (long long)bqv[2],
                        KDT_SAMPLE_MAX_VOCAB);
    kdt_tree_sample_accept_params p = {.B = (int32_t)bq[0], .Q = (int32_t)bq[1], .V = (int32_t)bqv[2]};
    if ((s = validate_values(p.B, temp.data, topk.data, topp.data)) != KDT_OK) return s;

    const uint64_t d_b[1] = {(uint64_t)p.B}, d_bq[2] = {(uint64_t)p.B, (uint64_t)p.Q};
    int32_t *h_len, *h_idx, *h_tok, *h_status;
    if ((s = kdt_io_output(out, "accept_len", KDT_I32, 1, d_b, (void **)&h_len)) != KDT_OK) return s;
    if ((s = kdt_io_output(out, "accept_index", KDT_I32, 2, d_bq, (void **)&h_idx)) != KDT_OK) return s;
    if ((s = kdt_io_output(out, "accept_tokens", KDT_I32, 2, d_bq, (void **)&h_tok)) != KDT_OK) return s;
    if ((s = kdt_io_output(out, "status", KDT_I32, 1, d_b, (void **)&h_status)) != KDT_OK) return s;

    kdt_stage st;
    kdt_stage_init(&st, backend);
    const size_t bq_bytes = (size_t)p.B * p.Q * 4, b_bytes = (size_t)p.B * 4;
    const size_t bqv_bytes = (size_t)p.B * p.Q * p.V * 4;
    if ((s = kdt_stage_in(&st, "node_token", tok.data, bq_bytes, (const void **)&p.node_token)) ||
        (s = kdt_stage_in(&st, "node_parent", par.data, bq_bytes, (const void **)&p.node_parent)) ||
        (s = kdt_stage_in(&st, "num_nodes", num.data, b_bytes, (const void **)&p.num_nodes)) ||
        (s = kdt_stage_in(&st, "target_logits", logits.data, bqv_bytes, (const void **)&p.target_logits)) ||
        (has_draft && (s = kdt_stage_in(&st, "draft_probs", draft.data, bqv_bytes, (const void **)&p.draft_probs))) ||
        (s = kdt_stage_in(&st, "temperature", temp.data, b_bytes, (const void **)&p.temperature)) ||
        (s = kdt_stage_in(&st, "top_k", topk.data, b_bytes, (const void **)&p.top_k)) ||
        (s = kdt_stage_in(&st, "top_p", topp.data, b_bytes, (const void **)&p.top_p)) ||
        (s = kdt_stage_in(&st, "seed", seed.data, b_bytes * 2, (const void **)&p.seed)) ||
        (s = kdt_stage_out(&st, "accept_len", h_len, b_bytes, (void **)&p.accept_len)) ||
        (s = kdt_stage_out(&st, "accept_index", h_idx, bq_bytes, (void **)&p.accept_index)) ||
        (s = kdt_stage_out(&st, "accept_tokens", h_tok, bq_bytes, (void **)&p.accept_tokens)) ||
        (s = kdt_stage_out(&st, "status", h_status, b_bytes, (void **)&p.status)) ||
        (s = kdt_tree_sample_accept(&p, backend, NULL)) || (s = kdt_stage_finish(&st))) {
        kdt_stage_release(&st);
        return s;
    }
    kdt_stage_release(&st);
    return KDT_OK;
}
