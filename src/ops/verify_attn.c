/* verify_attn (SPEC 2.2): validation, backend dispatch and the tensor adapter.
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

/* Reads a dim that must fit an int32 param. */
static kdt_status dim32(const kdt_tensor_view *v, int d, int32_t *out) {
    if (v->dims[d] > INT32_MAX)
        return kdt_fail(KDT_ERR_SHAPE, "tensor '%s': dim %d = %llu is above %d", v->name, d,
                        (unsigned long long)v->dims[d], INT32_MAX);
    *out = (int32_t)v->dims[d];
    return KDT_OK;
}

/* Finds the KV tensors of one layout and fills the layout's params. */
static kdt_status find_kv(const kdt_kdtr *in, kdt_verify_attn_params *p, int64_t Dqk, kdt_tensor_view *kv,
                          kdt_tensor_view *bt) {
    kdt_tensor_view probe;
    const int has_kv = kdt_kdtr_find(in, "kv", &probe) == KDT_OK;
    const int has_cache = kdt_kdtr_find(in, "kv_cache", &probe) == KDT_OK;
    if (has_kv && has_cache)
        return kdt_fail(KDT_ERR_INVALID_ARG,
                        "tensors 'kv' (contiguous layout) and 'kv_cache' (paged layout) are both present: give one");
    if (!has_kv && !has_cache)
        return kdt_fail(KDT_ERR_NOT_FOUND, "neither tensor 'kv' (contiguous layout) nor 'kv_cache' (paged layout) is present");
    kdt_status s;
    if (has_kv) {
        const int64_t d[3] = {p->B, -1, Dqk};
        if ((s = kdt_kdtr_find_typed(in, "kv", p->dtype, 3, d, kv)) != KDT_OK) return s;
        p->L = (int64_t)kv->dims[1];
        p->kv = kv->data;
        return KDT_OK;
    }
    const int64_t dc[3] = {-1, -1, Dqk}, db[2] = {p->B, -1};
    if ((s = kdt_kdtr_find_typed(in, "kv_cache", p->dtype, 3, dc, kv)) != KDT_OK ||
        (s = kdt_kdtr_find_typed(in, "block_table", KDT_I32, 2, db, bt)) != KDT_OK || (s = dim32(kv, 0, &p->NB)) != KDT_OK ||
        (s = dim32(kv, 1, &p->BS)) != KDT_OK || (s = dim32(bt, 1, &p->MB)) != KDT_OK)
        return s;
    if (p->BS < 1) return kdt_fail(KDT_ERR_SHAPE, "tensor 'kv_cache': block size (dim 1) is 0");
    p->kv_cache = kv->data;
    p->block_table = bt->data;
    return KDT_OK;
}

kdt_status kdt_verify_attn_run(const kdt_kdtr *in, kdt_kdtr_writer *out, kdt_backend backend) {
    kdt_tensor_view q, kv, bt = {0}, len, mask;
    kdt_status s;
    if ((s = kdt_kdtr_find(in, "q", &q)) != KDT_OK) return s;
    if (q.dtype != KDT_F32 && q.dtype != KDT_BF16)
        return kdt_fail(KDT_ERR_DTYPE, "tensor 'q': dtype %s, expected f32 or bf16", kdt_dtype_name(q.dtype));
    if (q.ndim != 4) return kdt_fail(KDT_ERR_SHAPE, "tensor 'q': expected 4 dims [B, Q, H, Dqk], got %d", q.ndim);
    kdt_verify_attn_params p = {.dtype = q.dtype};
    int32_t Dqk = 0, dv = 0;
    if ((s = dim32(&q, 0, &p.B)) || (s = dim32(&q, 1, &p.Q)) || (s = dim32(&q, 2, &p.H)) || (s = dim32(&q, 3, &Dqk)))
        return s;
    if ((s = kdt_kdtr_scalar_i32(in, "dv", &dv)) != KDT_OK) return s;
    if (dv < 1 || dv > Dqk)
        return kdt_fail(KDT_ERR_INVALID_ARG, "scalar 'dv' = %d outside 1 .. %d (Dqk, the last dim of 'q')", dv, Dqk);
    p.Dv = dv;
    p.Dr = Dqk - dv;
    if ((s = kdt_kdtr_scalar_f32(in, "sm_scale", &p.sm_scale)) != KDT_OK) return s;
    if (!isfinite(p.sm_scale)) return kdt_fail(KDT_ERR_INVALID_ARG, "scalar 'sm_scale' = %g is not finite", p.sm_scale);
    if ((s = find_kv(in, &p, Dqk, &kv, &bt)) != KDT_OK) return s;
    const int64_t d_b[1] = {p.B}, d_bqq[3] = {p.B, p.Q, p.Q};
    if ((s = kdt_kdtr_find_typed(in, "kv_len", KDT_I32, 1, d_b, &len)) != KDT_OK ||
        (s = kdt_kdtr_find_typed(in, "tree_mask", KDT_U8, 3, d_bqq, &mask)) != KDT_OK)
        return s;
    const uint64_t d_o[4] = {(uint64_t)p.B, (uint64_t)p.Q, (uint64_t)p.H, (uint64_t)p.Dv};
    void *h_o;
    float *h_lse;
    if ((s = kdt_io_output(out, "o", p.dtype, 4, d_o, &h_o)) != KDT_OK ||
        (s = kdt_io_output(out, "lse", KDT_F32, 3, d_o, (void **)&h_lse)) != KDT_OK)
        return s;
    p.q = q.data;
    p.kv_len = len.data;
    p.tree_mask = mask.data;
    p.o = h_o;
    p.lse = h_lse;
    /* Every check on the host data, before anything is staged. */
    if ((s = validate(&p)) != KDT_OK || (s = check_data(&p)) != KDT_OK || p.B == 0) return s;

    kdt_stage st;
    kdt_stage_init(&st, backend);
    const size_t es = kdt_dtype_size(p.dtype), n_lse = (size_t)p.B * p.Q * p.H;
    const int paged = p.kv_cache != NULL;
    if ((s = kdt_stage_in(&st, "q", q.data, q.nbytes, &p.q)) ||
        (s = kdt_stage_in(&st, paged ? "kv_cache" : "kv", kv.data, kv.nbytes, paged ? &p.kv_cache : &p.kv)) ||
        (paged && (s = kdt_stage_in(&st, "block_table", bt.data, bt.nbytes, (const void **)&p.block_table))) ||
        (s = kdt_stage_in(&st, "kv_len", len.data, len.nbytes, (const void **)&p.kv_len)) ||
        (s = kdt_stage_in(&st, "tree_mask", mask.data, mask.nbytes, (const void **)&p.tree_mask)) ||
        (s = kdt_stage_out(&st, "o", h_o, n_lse * p.Dv * es, &p.o)) ||
        (s = kdt_stage_out(&st, "lse", h_lse, n_lse * sizeof(float), (void **)&p.lse)) ||
        (s = kdt_verify_attn(&p, backend, NULL)) || (s = kdt_stage_finish(&st))) {
        kdt_stage_release(&st);
        return s;
    }
    kdt_stage_release(&st);
    return KDT_OK;
}
