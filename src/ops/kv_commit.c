/* kv_commit (docs/interfaces.md 2.5): validation, backend dispatch and the tensor adapter. */
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

enum { B, Q, NB, BS, DQK, MB };
enum { KV_CACHE, ACCEPT_INDEX, BLOCK_TABLE, KV_LEN, ACCEPT_LEN, Q_SCALAR, NEW_KV_LEN, STATUS };
#define I32 KDT_IO_DT(KDT_I32)

static kdt_status call(const kdt_io *io, kdt_backend backend) {
    void *const *t = io->ptr;
    const kdt_kv_commit_params p = {
        .B = (int32_t)io->dim[B], .Q = (int32_t)io->dim[Q], .NB = (int32_t)io->dim[NB], .BS = (int32_t)io->dim[BS],
        .Dqk = (int32_t)io->dim[DQK], .dtype = io->T, .kv_cache = t[KV_CACHE], .block_table = t[BLOCK_TABLE],
        .MB = (int32_t)io->dim[MB], .kv_len = t[KV_LEN], .accept_index = t[ACCEPT_INDEX], .accept_len = t[ACCEPT_LEN],
        .new_kv_len = t[NEW_KV_LEN], .status = t[STATUS]};
    return kdt_kv_commit(&p, backend, NULL);
}

static const kdt_io_op io_op = {
    "kv_commit",
    .dims = {[B] = {"B", 0, INT32_MAX}, [Q] = {"Q", 1, KDT_TREE_MAX_BUDGET + 1}, [NB] = {"NB", 0, INT32_MAX},
             [BS] = {"BS", 0, INT32_MAX}, [DQK] = {"Dqk", 0, INT32_MAX}, [MB] = {"MB", 0, INT32_MAX}},
    .tensors = {
        /* in/out: the op changes only the moved rows */
        [KV_CACHE] = {"kv_cache", KDT_IO_DT(KDT_F32) | KDT_IO_DT(KDT_BF16), "NB BS Dqk", KDT_IO_INOUT | KDT_IO_T},
        [ACCEPT_INDEX] = {"accept_index", I32, "B Q"},
        [BLOCK_TABLE] = {"block_table", I32, "B MB"},
        [KV_LEN] = {"kv_len", I32, "B"},
        [ACCEPT_LEN] = {"accept_len", I32, "B"},
        [Q_SCALAR] = {"Q", I32, "", KDT_IO_OPTIONAL, .bind = "Q"}, /* must agree with accept_index */
        [NEW_KV_LEN] = {"new_kv_len", I32, "B", KDT_IO_OUT},
        [STATUS] = {"status", I32, "B", KDT_IO_OUT},
    },
    .call = call,
};

kdt_status kdt_kv_commit_run(const kdt_kdtr *in, kdt_kdtr_writer *out, kdt_backend backend) {
    return kdt_io_run(&io_op, in, out, backend);
}
