/* The CUDA forward's layers (forward.cuh): MLA attention (absorbed, over the paged latent cache),
 * the dense MLP and the MoE layer, each as kernels queued on the forward's stream. */
#include "model/cuda/forward.cuh"

namespace kdt_fwd {

/* ---- cuBLAS ---- */

/* The per-head products of absorbed MLA, one strided batched GEMM over the H heads of kv_b
 * [H, nope + v, Dv] (dt):
 *   absorb: qabs[r, h, :Dv] = qn[r, h, :] . W_UK_h   (W_UK_h [nope, Dv], the first nope rows)
 *   values: ov[r, h, :]     = olat[r, h, :] . W_UV_h^T (W_UV_h [v, Dv], the next v rows) */
kdt_status absorb_query(cublasHandle_t h, const Dims &d, const void *kv_b, const void *qn, void *qabs) {
    const float alpha = 1.0f, beta = 0.0f;
    const long long w_stride = (long long)(d.nope + d.vd) * d.Dv;
    KDT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, d.Dv, (int)d.R, d.nope, &alpha, kv_b, d.ct, d.Dv,
                                                w_stride, qn, d.ct, d.H * d.nope, d.nope, &beta, qabs, d.ct, d.H * d.Dqk, d.Dqk,
                                                d.H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return KDT_OK;
}

kdt_status apply_values(cublasHandle_t h, const Dims &d, const void *kv_b, const void *olat, void *ov) {
    const float alpha = 1.0f, beta = 0.0f;
    const long long w_stride = (long long)(d.nope + d.vd) * d.Dv;
    const void *wuv = (const char *)kv_b + (size_t)d.nope * d.Dv * d.es;
    KDT_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, d.vd, (int)d.R, d.Dv, &alpha, wuv, d.ct, d.Dv,
                                                w_stride, olat, d.ct, d.H * d.Dv, d.Dv, &beta, ov, d.ct, d.H * d.vd, d.vd, d.H,
                                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return KDT_OK;
}


/* Whether a product of M rows with W [N, K] (in the model's dtype, one part) runs moe.cu's
 * small-batch kernel: with f.gemv (any_size: the projections KDT_MODEL_GEMV names), or with f.fused
 * where W is so small that the launch, not the bandwidth, is the cost (the small models: cuBLAS has
 * no edge there, and the kernel gives a row the same bits in a decode step and in a tree). */
bool small_product(const Fwd &f, int64_t M, int64_t N, int64_t K, bool any_size) {
    if (M > GEMV_MAX_ROWS || K % 8 != 0 || N > INT_MAX || K > INT_MAX) return false;
    return (f.gemv && any_size) || (f.fused && M <= FUSED_MAX_ROWS && (uint64_t)N * (uint64_t)K * f.d.es <= GEMV_SMALL_WEIGHT_BYTES);
}
bool small_product(const Fwd &f, int64_t M, const kdt_dlin &W, bool any_size) {
    return W.fmt == KDT_WFMT_DENSE && W.parts == 1 && small_product(f, M, W.N, W.K, any_size);
}

/* y [M, N] f32 (+)= x [M, K] (dt) . W^T, W [N, K], all contiguous: kdt_lin, or moe.cu's
 * small-batch kernel where small_product says so. */
kdt_status proj(Fwd &f, int64_t M, const kdt_dlin &W, const void *x, float *y, float beta, bool any_size) {
    if (small_product(f, M, W, any_size))
        return kdt_mk_dense_small((int32_t)M, x, W.w[0], W.K, W.N, 0, y, beta != 0.0f, nullptr, f.d.dt, f.s);
    return kdt_lin(&f.lc, &W, 0, M, x, y, beta != 0.0f);
}

/* u.hn [M, hidden] (dt) = the norm's M rows. */
kdt_status norm_rows(Fwd &f, int64_t M, const kdt_mk_norm &n) {
    return kdt_mk_rmsnorm(n.x, f.d.hid, n.rows, M, f.d.hid, n.w, n.eps, nullptr, 0, f.u.hn, f.d.hid, f.d.dt, f.s);
}

/* y [M, N] f32 = norm's M rows . W^T: normalized inside the small-batch kernel (no norm launch), or
 * to u.hn first, then kdt_lin. */
kdt_status proj_normed(Fwd &f, int64_t M, const kdt_dlin &W, const kdt_mk_norm &n, float *y, bool any_size) {
    if (small_product(f, M, W, any_size)) return kdt_mk_dense_small((int32_t)M, nullptr, W.w[0], W.K, W.N, 0, y, 0, &n, f.d.dt, f.s);
    KDT_TRY(norm_rows(f, M, n));
    return kdt_lin(&f.lc, &W, 0, M, f.u.hn, y, 0);
}

/* MLA attention of layer l on the attention norm of u.x: x += o_proj(attention). */
kdt_status attention(Fwd &f, int32_t l) {
    const Dims &d = f.d;
    const Bufs &u = f.u;
    const kdt_layer_dw *L = &f.m->dlayers[l];
    const kdt_model_config *cf = &f.m->cfg;
    cublasHandle_t h = f.x->blas;
    /* [q_a | kv_a] (or [q_proj | kv_a]) of the normed rows: a_out [R, Wa] f32 */
    KDT_TRY(proj_normed(f, d.R, L->attn_in, kdt_mk_norm{u.x, L->attn_norm, nullptr, cf->rms_norm_eps}, u.a_out, false));
    const float *q = u.a_out;
    int64_t q_ld = d.Wa;
    /* With f.fused both norms of [q_a | kv_a] (and the cache append) are one launch. */
    const bool qa_fused = d.ql && f.fused;
    KDT_TRY(kdt_mk_kv_append_qa(u.a_out + d.qw, d.Wa, L->kv_a_norm, LORA_NORM_EPS, u.cs, u.sn, u.slots, d.R, d.Dv, d.rope,
                            cf->rope_interleave, f.c->dpool[l], qa_fused ? u.a_out : nullptr, L->q_a_norm, d.ql, u.qa, d.dt, f.s));
    if (d.ql) {
        if (!qa_fused)
            KDT_TRY(kdt_mk_rmsnorm(u.a_out, d.Wa, nullptr, d.R, d.ql, L->q_a_norm, LORA_NORM_EPS, nullptr, 0, u.qa, d.ql, d.dt, f.s));
        KDT_TRY(proj(f, d.R, L->q_b, u.qa, u.q, 0.0f));
        q = u.q;
        q_ld = (int64_t)d.H * d.qk;
    }
    /* With f.fused and a small kv_b, q_prep and the absorb GEMM are one launch. */
    const uint64_t kv_b_bytes = (uint64_t)d.H * (d.nope + d.vd) * d.Dv * d.es;
    if (d.nope && f.fused && d.R <= GEMV_MAX_ROWS && kv_b_bytes <= GEMV_SMALL_WEIGHT_BYTES) {
        KDT_TRY(kdt_mk_q_absorb(q, q_ld, u.cs, u.sn, d.R, d.H, d.nope, d.rope, d.Dv, cf->rope_interleave, L->kv_b, d.vd, u.qabs, d.dt,
                            f.s));
    } else {
        KDT_TRY(kdt_mk_q_prep(q, q_ld, u.cs, u.sn, d.R, d.H, d.nope, d.rope, d.Dv, cf->rope_interleave, u.qn, u.qabs, d.dt, f.s));
        if (d.nope) KDT_TRY(absorb_query(h, d, L->kv_b, u.qn, u.qabs));
        else KDT_CUDA_CHECK(cudaMemset2DAsync(u.qabs, (size_t)d.Dqk * d.es, 0, (size_t)d.Dv * d.es, (size_t)(d.R * d.H), f.s));
    }
    for (int32_t i = 0; i < f.plan->n_calls; i++) {
        const Call &k = f.plan->calls[i];
        kdt_verify_attn_params p = {};
        p.B = k.B;
        p.Q = k.Q;
        p.H = d.H;
        p.Dv = d.Dv;
        p.Dr = d.rope;
        p.dtype = d.dt;
        p.q = (const char *)u.qabs + (size_t)k.row * d.H * d.Dqk * d.es;
        p.kv_cache = f.c->dpool[l];
        p.NB = f.c->NB;
        p.BS = KDT_CACHE_BLOCK;
        p.block_table = u.tables + (size_t)k.entry * d.MB;
        p.MB = d.MB;
        p.kv_len = u.kv_len + k.entry;
        p.tree_mask = u.masks + k.mask_off;
        p.sm_scale = (float)cf->softmax_scale;
        p.o = (char *)u.olat + (size_t)k.row * d.H * d.Dv * d.es;
        p.lse = u.lse + k.row * d.H;
        KDT_TRY(kdt_verify_attn(&p, KDT_BACKEND_CUDA, f.s));
    }
    KDT_TRY(apply_values(h, d, L->kv_b, u.olat, u.ov));
    return proj(f, d.R, L->o, u.ov, u.x, 1.0f);
}

/* A SiLU-gated MLP on the rows u.hn [R, hidden] (dt), or on norm's rows: x += down(silu(gate hn) * up hn). */
kdt_status mlp(Fwd &f, const kdt_mlp_dw *w, const kdt_mk_norm *norm) {
    const Dims &d = f.d;
    const int64_t I = w->inter;
    if (small_product(f, d.R, w->gate_up, true))
        KDT_TRY(kdt_mk_dense_small((int32_t)d.R, f.u.hn, w->gate_up.w[0], d.hid, (int32_t)I, 1, f.u.act, 0, norm, d.dt, f.s));
    else {
        if (norm) KDT_TRY(norm_rows(f, d.R, *norm));
        KDT_TRY(kdt_lin_glu(&f.lc, &w->gate_up, d.R, f.u.hn, f.u.gu, f.u.act));
    }
    return proj(f, d.R, w->down, f.u.act, f.u.x, 1.0f);
}

/* Routed experts then the shared ones on the ffn norm of u.x (u.hf f32, the router's input; u.hn
 * dt, the experts'): x += out.
 * f.moe_small: moe.cu's two kernels read the grouping on the device. Else the rows of each
 * expert are gathered next to each other, so that an expert is two GEMMs sized on the host. */
kdt_status moe(Fwd &f, int32_t l) {
    const Dims &d = f.d;
    const Bufs &u = f.u;
    const kdt_layer_dw *L = &f.m->dlayers[l];
    const kdt_model_config *cf = &f.m->cfg;
    cublasHandle_t h = f.x->blas;
    const int64_t RK = d.R * d.K, I = cf->moe_intermediate_size;
    const bool plan = f.fused && kdt_mk_route_plan_fits(d.R, d.E, cf->n_group, d.K, d.hid, 0);
    const bool scores = plan && kdt_mk_route_plan_fits(d.R, d.E, cf->n_group, d.K, d.hid, 1);
    /* The layer's norm: u.hf (f32) for the router, u.hn for the experts; in the router's block
     * where that block computes the scores. */
    const kdt_mk_norm ffn = {u.x, L->ffn_norm, nullptr, cf->rms_norm_eps};
    if (!scores) { /* the norm, then the router's logits u.rlog */
        KDT_TRY(kdt_mk_rmsnorm(u.x, d.hid, nullptr, d.R, d.hid, L->ffn_norm, cf->rms_norm_eps, u.hf, d.hid, u.hn, d.hid, d.dt, f.s));
        KDT_TRY(kdt_lin_gemm(h, d.R, d.E, d.hid, L->router, CUDA_R_32F, d.hid, u.hf, CUDA_R_32F, d.hid, u.rlog, CUDA_R_32F, d.E, 0.0f));
    }
    if (plan) {
        KDT_TRY(kdt_mk_route_plan(scores ? u.hf : nullptr, L->router, d.hid, u.rlog, L->router_bias, d.R, d.E, cf->n_group,
                              cf->topk_group, d.K, cf->norm_topk_prob, cf->routed_scaling_factor, u.gi, u.gw, u.counts, u.offs,
                              u.perm, u.posa, scores ? &ffn : nullptr, u.hn, d.dt, u.ticket, f.s));
    } else {
        KDT_TRY(kdt_mk_route(u.rlog, L->router_bias, d.R, d.E, cf->n_group, cf->topk_group, d.K, cf->norm_topk_prob,
                         cf->routed_scaling_factor, u.gi, u.gw, f.s));
        KDT_TRY(kdt_mk_moe_plan(u.gi, RK, d.E, u.counts, u.offs, u.perm, u.posa, f.s));
    }
    if (f.moe_bf16) { /* a shared expert of the experts' width in the same two launches */
        const kdt_mlp_dw &sh = L->shared;
        const bool fold = sh.inter == I && sh.gate_up.fmt == KDT_WFMT_DENSE && sh.gate_up.parts == 1 && sh.down.fmt == KDT_WFMT_DENSE;
        KDT_TRY(kdt_moe_bf16(d.R, u.hn, u.perm, d.K, u.counts, u.offs, L->exp_gate_up.w[0], L->exp_down.w[0],
                             fold ? sh.gate_up.w[0] : nullptr, fold ? sh.down.w[0] : nullptr, d.E, d.hid, (int32_t)I, u.act, u.ye, f.s));
        KDT_TRY(kdt_mk_moe_combine(u.x, u.ye, u.gi, u.gw, u.posa, d.R, d.K, d.E, d.hid, fold, f.s));
        return sh.inter && !fold ? mlp(f, &sh, nullptr) : KDT_OK;
    }
    if (f.moe_small) {
        /* A small shared expert of the experts' width rides in the routed experts' two launches
         * (one more grid row) and the combine adds it: 2 launches fewer, the same bits. */
        const kdt_mlp_dw &sh = L->shared;
        const bool fold = sh.inter == I && L->exp_gate_up.fmt == KDT_WFMT_DENSE && L->exp_down.fmt == KDT_WFMT_DENSE &&
                          small_product(f, d.R, sh.gate_up, true) && small_product(f, d.R, sh.down, true);
        if (fold)
            KDT_TRY(kdt_mk_moe_small(d.R, u.hn, u.perm, d.K, u.counts, u.offs, L->exp_gate_up.w[0], L->exp_down.w[0], sh.gate_up.w[0],
                                 sh.down.w[0], d.E, d.hid, (int32_t)I, u.act, u.ye, d.dt, f.s));
        else
            KDT_TRY(kdt_lin_moe_small(d.R, u.hn, u.perm, d.K, u.counts, u.offs, &L->exp_gate_up, &L->exp_down, d.hid, (int32_t)I,
                                  u.act, u.ye, d.dt, f.s));
        KDT_TRY(kdt_mk_moe_combine(u.x, u.ye, u.gi, u.gw, u.posa, d.R, d.K, d.E, d.hid, fold, f.s));
        return sh.inter && !fold ? mlp(f, &sh, nullptr) : KDT_OK;
    }
    KDT_CUDA_CHECK(cudaMemcpyAsync(f.x->h_counts, u.counts, (size_t)d.E * sizeof(int32_t), cudaMemcpyDeviceToHost, f.s));
    KDT_CUDA_CHECK(cudaStreamSynchronize(f.s));
    int64_t total = 0;
    for (int32_t e = 0; e < d.E; e++) total += f.x->h_counts[e];
    if (total > RK) return kdt_fail(KDT_ERR_INTERNAL, "forward: layer %d routed %lld rows, more than %lld", l, (long long)total,
                                    (long long)RK);
    KDT_TRY(kdt_mk_gather_rows(u.hn, u.perm, total, d.K, d.hid, u.xe, d.dt, f.s));
    for (int64_t e = 0, off = 0; e < d.E; off += f.x->h_counts[e], e++)
        KDT_TRY(kdt_lin(&f.lc, &L->exp_gate_up, e, f.x->h_counts[e], (const char *)u.xe + off * d.hid * d.es, u.gu + off * 2 * I, 0));
    KDT_TRY(kdt_mk_silu_mul(u.gu, total, (int32_t)I, u.act, d.dt, f.s));
    for (int64_t e = 0, off = 0; e < d.E; off += f.x->h_counts[e], e++)
        KDT_TRY(kdt_lin(&f.lc, &L->exp_down, e, f.x->h_counts[e], (const char *)u.act + off * I * d.es, u.ye + off * d.hid, 0));
    KDT_TRY(kdt_mk_moe_combine(u.x, u.ye, u.gi, u.gw, u.posa, d.R, d.K, d.E, d.hid, 0, f.s));
    return L->shared.inter ? mlp(f, &L->shared, nullptr) : KDT_OK;
}

} // namespace kdt_fwd
