/* kv_commit (docs/ops.md): validation, backend dispatch and the tensor adapter. */
#include <string.h>

#include "common/internal.h"
#include "ops/backends.h"
#include "ops/io.h"

static kdt_status validate(const kdt_kv_commit_params *p) {
    if (!p) return kdt_fail(KDT_ERR_INVALID_ARG, "kv_commit: params is NULL");
    if (p->B < 0) return kdt_fail(KDT_ERR_SHAPE, "kv_commit: B = %d is negative", p->B);
    if (p->Q < 1 || p->Q > KDT_TREE_MAX_BUDGET + 1)
        return kdt_fail(KDT_ERR_SHAPE, "kv_commit: Q = %d outside 1 .. %d", p->Q, KDT_TREE_MAX_BUDGET + 1);
    if (p->NB < 0 || p->BS < 1 || p->Dqk < 1 || p->MB < 0)
        return kdt_fail(KDT_ERR_SHAPE, "kv_commit: NB = %d, BS = %d, Dqk = %d, MB = %d (need NB, MB >= 0, BS, Dqk >= 1)",
                        p->NB, p->BS, p->Dqk, p->MB);
    if (p->dtype != KDT_F32 && p->dtype != KDT_BF16)
        return kdt_fail(KDT_ERR_DTYPE, "kv_commit: dtype %s, expected f32 or bf16", kdt_dtype_name(p->dtype));
    uint64_t bytes;
    if (!kdt_mul_u64((uint64_t)p->NB * (uint64_t)p->BS, (uint64_t)p->Dqk * kdt_dtype_size(p->dtype), &bytes))
        return kdt_fail(KDT_ERR_SHAPE, "kv_commit: kv_cache [%d, %d, %d] is too large", p->NB, p->BS, p->Dqk);
    if (p->B == 0) return KDT_OK;
    if (!p->kv_cache || !p->block_table || !p->kv_len || !p->accept_index || !p->accept_len)
        return kdt_fail(KDT_ERR_INVALID_ARG, "kv_commit: an input pointer is NULL");
    if (!p->new_kv_len || !p->status) return kdt_fail(KDT_ERR_INVALID_ARG, "kv_commit: an output pointer is NULL");
    return KDT_OK;
}

kdt_status kdt_kv_commit(const kdt_kv_commit_params *p, kdt_backend backend, void *stream) {
    kdt_status s = validate(p);
    if (s != KDT_OK || p->B == 0) return s;
    if (backend == KDT_BACKEND_CPU) return kdt_kv_commit_cpu(p);
    return kdt_kv_commit_cuda(p, stream);
}

kdt_status kdt_kv_commit_run(const kdt_kdtr *in, kdt_kdtr_writer *out, kdt_backend backend) {
    kdt_tensor_view cache, table, kvl, idx, alen, qv;
    kdt_status s;
    if ((s = kdt_kdtr_find(in, "kv_cache", &cache)) != KDT_OK) return s;
    if (cache.dtype != KDT_F32 && cache.dtype != KDT_BF16)
        return kdt_fail(KDT_ERR_DTYPE, "tensor 'kv_cache': dtype %s, expected f32 or bf16", kdt_dtype_name(cache.dtype));
    if (cache.ndim != 3)
        return kdt_fail(KDT_ERR_SHAPE, "tensor 'kv_cache': %d dims, expected 3 [NB, BS, Dqk]", cache.ndim);
    if ((s = kdt_kdtr_find_typed(in, "accept_index", KDT_I32, 2, NULL, &idx)) != KDT_OK) return s;
    const int64_t b1[1] = {(int64_t)idx.dims[0]}, bm[2] = {b1[0], -1};
    if ((s = kdt_kdtr_find_typed(in, "block_table", KDT_I32, 2, bm, &table)) != KDT_OK) return s;
    if ((s = kdt_kdtr_find_typed(in, "kv_len", KDT_I32, 1, b1, &kvl)) != KDT_OK) return s;
    if ((s = kdt_kdtr_find_typed(in, "accept_len", KDT_I32, 1, b1, &alen)) != KDT_OK) return s;
    const uint64_t dims[5] = {cache.dims[0], cache.dims[1], cache.dims[2], idx.dims[0], table.dims[1]};
    const char *names[5] = {"kv_cache", "kv_cache", "kv_cache", "accept_index", "block_table"};
    for (int i = 0; i < 5; i++)
        if (dims[i] > INT32_MAX)
            return kdt_fail(KDT_ERR_SHAPE, "tensor '%s': dim %llu exceeds %d", names[i], (unsigned long long)dims[i], INT32_MAX);
    if (idx.dims[1] < 1 || idx.dims[1] > KDT_TREE_MAX_BUDGET + 1)
        return kdt_fail(KDT_ERR_SHAPE, "tensor 'accept_index': Q = %llu outside 1 .. %d",
                        (unsigned long long)idx.dims[1], KDT_TREE_MAX_BUDGET + 1);
    if (kdt_kdtr_find(in, "Q", &qv) == KDT_OK) { /* optional; must agree with accept_index */
        int32_t q;
        if ((s = kdt_kdtr_scalar_i32(in, "Q", &q)) != KDT_OK) return s;
        if ((uint64_t)q != idx.dims[1])
            return kdt_fail(KDT_ERR_SHAPE, "scalar 'Q' = %d differs from accept_index's second dim %llu", q,
                            (unsigned long long)idx.dims[1]);
    }

    kdt_kv_commit_params p = {.B = (int32_t)idx.dims[0], .Q = (int32_t)idx.dims[1], .NB = (int32_t)cache.dims[0],
                              .BS = (int32_t)cache.dims[1], .Dqk = (int32_t)cache.dims[2], .dtype = cache.dtype,
                              .MB = (int32_t)table.dims[1]};
    const uint64_t d_b[1] = {(uint64_t)p.B};
    void *h_cache;
    int32_t *h_len, *h_status;
    if ((s = kdt_io_output(out, "kv_cache", cache.dtype, 3, cache.dims, &h_cache)) != KDT_OK) return s;
    memcpy(h_cache, cache.data, cache.nbytes); /* in/out: the op changes only the moved rows */
    if ((s = kdt_io_output(out, "new_kv_len", KDT_I32, 1, d_b, (void **)&h_len)) != KDT_OK) return s;
    if ((s = kdt_io_output(out, "status", KDT_I32, 1, d_b, (void **)&h_status)) != KDT_OK) return s;

    kdt_stage st;
    kdt_stage_init(&st, backend);
    const size_t b_bytes = (size_t)p.B * 4;
    if ((s = kdt_stage_in(&st, "block_table", table.data, table.nbytes, (const void **)&p.block_table)) ||
        (s = kdt_stage_in(&st, "kv_len", kvl.data, b_bytes, (const void **)&p.kv_len)) ||
        (s = kdt_stage_in(&st, "accept_index", idx.data, idx.nbytes, (const void **)&p.accept_index)) ||
        (s = kdt_stage_in(&st, "accept_len", alen.data, b_bytes, (const void **)&p.accept_len)) ||
        (s = kdt_stage_out(&st, "kv_cache", h_cache, cache.nbytes, &p.kv_cache)) ||
        (s = kdt_stage_out(&st, "new_kv_len", h_len, b_bytes, (void **)&p.new_kv_len)) ||
        (s = kdt_stage_out(&st, "status", h_status, b_bytes, (void **)&p.status)) ||
        (s = kdt_kv_commit(&p, backend, NULL)) || (s = kdt_stage_finish(&st))) {
        kdt_stage_release(&st);
        return s;
    }
    kdt_stage_release(&st);
    return KDT_OK;
}
