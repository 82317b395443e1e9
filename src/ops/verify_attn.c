/* verify_attn (docs/interfaces.md 2.2): validation, backend dispatch and the tensor adapter.
 *
 * Value rules the kernels rely on (kv_len, block table, mask) are checked on the host: by the
 * adapter before staging, and by kdt_verify_attn itself for the CPU backend, whose pointers are
 * host memory. The CUDA kernels, given device memory that nobody checked, still never read
 * outside the cache: they clamp kv_len to the cache and skip keys whose block is out of range. */
#include <math.h>

#include "common/internal.h"
#include "ops/backends.h"
#include "ops/io.h"

#define VERIFY_MAX_Q (KDT_TREE_MAX_BUDGET + 1)
#define VERIFY_MAX_H 1024

static kdt_status validate(const kdt_verify_attn_params *p) {
    if (!p) return kdt_fail(KDT_ERR_INVALID_ARG, "verify_attn: params is NULL");
    if (p->B < 0) return kdt_fail(KDT_ERR_SHAPE, "verify_attn: B = %d is negative", p->B);
    if (p->Q < 1 || p->Q > VERIFY_MAX_Q)
        return kdt_fail(KDT_ERR_SHAPE, "verify_attn: Q (q_len) = %d outside 1 .. %d", p->Q, VERIFY_MAX_Q);
    if (p->H < 1 || p->H > VERIFY_MAX_H)
        return kdt_fail(KDT_ERR_SHAPE, "verify_attn: H = %d outside 1 .. %d", p->H, VERIFY_MAX_H);
    if (p->Dv < 1 || p->Dr < 0 || (int64_t)p->Dv + p->Dr > INT32_MAX)
        return kdt_fail(KDT_ERR_SHAPE, "verify_attn: Dv = %d, Dr = %d: need Dv >= 1, Dr >= 0", p->Dv, p->Dr);
    if (p->dtype != KDT_F32 && p->dtype != KDT_BF16)
        return kdt_fail(KDT_ERR_DTYPE, "verify_attn: dtype %s, expected f32 or bf16", kdt_dtype_name(p->dtype));
    if (!isfinite(p->sm_scale)) return kdt_fail(KDT_ERR_INVALID_ARG, "verify_attn: sm_scale = %g is not finite", p->sm_scale);
    if (!p->kv == !p->kv_cache)
        return kdt_fail(KDT_ERR_INVALID_ARG, "verify_attn: give exactly one KV layout: kv (contiguous) or kv_cache (paged)");
    if (p->kv && p->L < 0) return kdt_fail(KDT_ERR_SHAPE, "verify_attn: L = %lld is negative", (long long)p->L);
    if (p->kv_cache && (p->NB < 0 || p->BS < 1 || p->MB < 0))
        return kdt_fail(KDT_ERR_SHAPE, "verify_attn: paged cache NB = %d, BS = %d, MB = %d: need NB >= 0, BS >= 1, MB >= 0",
                        p->NB, p->BS, p->MB);
    if (p->B == 0) return KDT_OK;
    if (!p->q || !p->kv_len || !p->tree_mask || (p->kv_cache && !p->block_table))
        return kdt_fail(KDT_ERR_INVALID_ARG, "verify_attn: an input pointer is NULL");
    if (!p->o || !p->lse) return kdt_fail(KDT_ERR_INVALID_ARG, "verify_attn: an output pointer is NULL");
    return KDT_OK;
}

/* The values behind the pointers (host memory): kv_len within [Q, cache], every block-table
 * entry of a block that holds keys inside the cache, mask entries 0 or 1. Entries of blocks past
 * kv_len are never read, so they may hold anything (serving stacks leave -1 there). */
static kdt_status check_data(const kdt_verify_attn_params *p) {
    const int64_t cap = p->kv ? p->L : (int64_t)p->MB * p->BS;
    const size_t qq = (size_t)p->Q * p->Q;
    for (int32_t b = 0; b < p->B; b++) {
        const int32_t n = p->kv_len[b];
        if (n < p->Q)
            return kdt_fail(KDT_ERR_INVALID_ARG, "tensor 'kv_len': request %d has %d keys, fewer than its %d tree rows (q_len)",
                            b, n, p->Q);
        if (n > cap)
            return kdt_fail(KDT_ERR_INVALID_ARG, "tensor 'kv_len': request %d has %d keys, more than the cache holds (%s = %lld)",
                            b, n, p->kv ? "L" : "MB * BS", (long long)cap);
        for (int32_t t = 0; p->kv_cache && t < (int32_t)(((int64_t)n + p->BS - 1) / p->BS); t++) {
            const int32_t e = p->block_table[(size_t)b * p->MB + t];
            if (e < 0 || e >= p->NB)
                return kdt_fail(KDT_ERR_INVALID_ARG,
                                "tensor 'block_table': request %d entry %d is %d, outside 0 .. %d (the block holds keys of kv_len %d)",
                                b, t, e, p->NB - 1, n);
        }
        const uint8_t *m = p->tree_mask + (size_t)b * qq;
        for (size_t k = 0; k < qq; k++)
            if (m[k] > 1)
                return kdt_fail(KDT_ERR_INVALID_ARG, "tensor 'tree_mask': request %d row %d column %d is %u, not 0 or 1", b,
                                (int)(k / (size_t)p->Q), (int)(k % (size_t)p->Q), m[k]);
    }
    return KDT_OK;
}

kdt_status kdt_verify_attn(const kdt_verify_attn_params *p, kdt_backend backend, void *stream) {
    kdt_status s = validate(p);
    if (s != KDT_OK || p->B == 0) return s;
    if (backend == KDT_BACKEND_CPU) {
        if ((s = check_data(p)) != KDT_OK) return s;
        return kdt_verify_attn_cpu(p);
    }
    return kdt_verify_attn_cuda(p, stream); /* picks the kernel: src/cuda/verify_attn.cu */
}

enum { B, Q, H, DQK, DV, L, NB, BS, MB };
enum { QT, KV, KV_CACHE, BLOCK_TABLE, KV_LEN, TREE_MASK, DV_SCALAR, SM_SCALE, O, LSE };
#define F32_BF16 (KDT_IO_DT(KDT_F32) | KDT_IO_DT(KDT_BF16))

/* The params over t (io->host or io->ptr). */
static kdt_verify_attn_params params(const kdt_io *io, void *const *t) {
    return (kdt_verify_attn_params){
        .B = (int32_t)io->dim[B], .Q = (int32_t)io->dim[Q], .H = (int32_t)io->dim[H], .Dv = (int32_t)io->dim[DV],
        .Dr = (int32_t)(io->dim[DQK] - io->dim[DV]), .dtype = io->T, .q = t[QT], .kv = t[KV], .L = io->dim[L],
        .kv_cache = t[KV_CACHE], .NB = (int32_t)io->dim[NB], .BS = (int32_t)io->dim[BS], .block_table = t[BLOCK_TABLE],
        .MB = (int32_t)io->dim[MB], .kv_len = t[KV_LEN], .tree_mask = t[TREE_MASK], .sm_scale = kdt_io_f32(io, SM_SCALE),
        .o = t[O], .lse = t[LSE]};
}

/* Every check on the host data, before anything is staged. */
static kdt_status check(const kdt_io *io) {
    if (io->dim[DV] > io->dim[DQK])
        return kdt_fail(KDT_ERR_INVALID_ARG, "scalar 'dv' = %lld outside 1 .. %lld (Dqk, the last dim of 'q')",
                        (long long)io->dim[DV], (long long)io->dim[DQK]);
    if (!isfinite(kdt_io_f32(io, SM_SCALE)))
        return kdt_fail(KDT_ERR_INVALID_ARG, "scalar 'sm_scale' = %g is not finite", kdt_io_f32(io, SM_SCALE));
    const kdt_verify_attn_params p = params(io, io->host);
    kdt_status s = validate(&p);
    return s != KDT_OK || p.B == 0 ? s : check_data(&p);
}

static kdt_status call(const kdt_io *io, kdt_backend backend) {
    const kdt_verify_attn_params p = params(io, io->ptr);
    return kdt_verify_attn(&p, backend, NULL);
}

static const kdt_io_op io_op = {
    "verify_attn",
    .dims = {[B] = {"B", 0, INT32_MAX}, [Q] = {"Q", 1, VERIFY_MAX_Q}, [H] = {"H", 1, VERIFY_MAX_H},
             [DQK] = {"Dqk", 0, INT32_MAX}, [DV] = {"Dv", 1, INT32_MAX}, [L] = {"L", 0, INT64_MAX},
             [NB] = {"NB", 0, INT32_MAX}, [BS] = {"BS", 1, INT32_MAX}, [MB] = {"MB", 0, INT32_MAX}},
    .tensors = {
        [QT] = {"q", F32_BF16, "B Q H Dqk", KDT_IO_T},
        [KV] = {"kv", F32_BF16, "B L Dqk", KDT_IO_T | KDT_IO_ONE_OF},             /* contiguous layout */
        [KV_CACHE] = {"kv_cache", F32_BF16, "NB BS Dqk", KDT_IO_T | KDT_IO_ONE_OF}, /* paged layout */
        [BLOCK_TABLE] = {"block_table", KDT_IO_DT(KDT_I32), "B MB", .with = "kv_cache"},
        [KV_LEN] = {"kv_len", KDT_IO_DT(KDT_I32), "B"},
        [TREE_MASK] = {"tree_mask", KDT_IO_DT(KDT_U8), "B Q Q"},
        [DV_SCALAR] = {"dv", KDT_IO_DT(KDT_I32), "", .bind = "Dv"},
        [SM_SCALE] = {"sm_scale", KDT_IO_DT(KDT_F32), ""},
        [O] = {"o", F32_BF16, "B Q H Dv", KDT_IO_OUT | KDT_IO_T},
        [LSE] = {"lse", KDT_IO_DT(KDT_F32), "B Q H", KDT_IO_OUT},
    },
    .check = check,
    .call = call,
};

kdt_status kdt_verify_attn_run(const kdt_kdtr *in, kdt_kdtr_writer *out, kdt_backend backend) {
    return kdt_io_run(&io_op, in, out, backend);
}
