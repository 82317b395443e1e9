/* The model's CUDA forward: the CPU reference's steps (src/model/forward_cpu.c) with the
 * projections in cuBLAS (bf16 or f32 operands, f32 accumulation), or in quant_gemm's kernels where
 * the weights are kept quantized (linear.cu), the rest in the kernels of
 * kernels.cu, attention through verify_attn over the paged latent cache, and the MoE routed
 * on the device. Activations between GEMMs are in the model's dtype; the residual stream, norms,
 * rope, the router and every GEMM output that feeds a non-linearity are f32.
 *
 * A forward uploads its small inputs (tokens, positions, cache slots, block-table rows, masks)
 * in one copy, runs every layer on the caller's stream (then, where asked, each logits row's argmax:
 * pick.cu), and waits at the end (the outputs) unless the batch says no_wait. The
 * routed experts of a MoE layer run as cuBLAS GEMMs per expert, sized by the expert row counts
 * (the host waits for them once per MoE layer), or, with KDT_MODEL_MOE_DEVICE and few rows per
 * expert, in moe.cu's kernels (large bf16 experts: moe_bf16.cu's) from device-side counts: such a forward has no host wait
 * inside, and with KDT_MODEL_GRAPHS it is captured as a CUDA graph per shape and replayed
 * (graph.cu). Scratch memory is the model's, grown as batches grow, so a model serves one
 * forward at a time. The layers themselves are in layers.cu (forward.cuh: what both files share). */
#include "model/cuda/forward.cuh"

using namespace kdt_fwd;


namespace {

size_t align_up(size_t n) { return (n + 255) & ~(size_t)255; }

/* Hands out 256-byte aligned pieces of one buffer; with base NULL it only measures. */
struct Bump {
    char *base;
    size_t off;
    template <typename P> void take(P **p, size_t bytes) {
        off = align_up(off);
        *p = base ? (P *)(base + off) : nullptr;
        off += bytes;
    }
};


void plan_free(Plan *p) {
    free(p->calls);
    free(p->entry_req);
    free(p->entry_len);
}

kdt_status plan_build(const kdt_batch *bt, const int32_t *start, Plan *p) {
    *p = Plan{};
    int64_t segs = 0;
    for (int32_t b = 0; b < bt->B; b++)
        segs += bt->tree_mask ? 1 : (bt->n_rows[b] + KDT_MODEL_MAX_TREE - 1) / KDT_MODEL_MAX_TREE;
    p->calls = (Call *)malloc((size_t)segs * sizeof(Call));
    p->entry_req = (int32_t *)malloc((size_t)segs * sizeof(int32_t));
    p->entry_len = (int32_t *)malloc((size_t)segs * sizeof(int32_t));
    if (!p->calls || !p->entry_req || !p->entry_len) return kdt_fail(KDT_ERR_NOMEM, "forward: out of memory");
    int64_t row = 0;
    for (int32_t b = 0; b < bt->B; b++) {
        const int32_t n = bt->n_rows[b];
        for (int32_t s0 = 0; s0 < n;) {
            const int32_t q = bt->tree_mask || n - s0 <= KDT_MODEL_MAX_TREE ? n - s0 : KDT_MODEL_MAX_TREE;
            Call *last = p->n_calls ? &p->calls[p->n_calls - 1] : nullptr;
            if (q == n && last && last->whole && last->Q == q && last->row + (int64_t)last->B * q == row) {
                last->B++;
            } else {
                p->calls[p->n_calls++] = Call{1, q, p->n_entries, row + s0, p->mask_bytes, q == n};
            }
            p->mask_bytes += (int64_t)q * q; /* a tree's mask or this chunk's causal mask, in batch order */
            p->entry_req[p->n_entries] = bt->req[b];
            p->entry_len[p->n_entries] = start[b] + s0 + q;
            p->n_entries++;
            s0 += q;
        }
        row += n;
    }
    return KDT_OK;
}


Dims dims_of(const kdt_model *m, const kdt_cache *c, const kdt_batch *bt, int64_t R) {
    const kdt_model_config *f = &m->cfg;
    Dims d;
    d.R = R;
    d.B = bt->B;
    d.RL = bt->logits_rows == KDT_LOGITS_LAST ? bt->B : R;
    d.hid = f->hidden_size;
    d.H = f->num_attention_heads;
    d.nope = f->qk_nope_head_dim;
    d.rope = f->qk_rope_head_dim;
    d.half = d.rope / 2;
    d.qk = d.nope + d.rope;
    d.Dv = f->kv_lora_rank;
    d.Dqk = d.Dv + d.rope;
    d.vd = f->v_head_dim;
    d.ql = f->q_lora_rank;
    d.qw = d.ql ? d.ql : d.H * d.qk;
    d.Wa = d.qw + d.Dqk;
    d.E = f->n_routed_experts;
    d.K = f->num_experts_per_tok;
    d.V = f->vocab_size;
    d.MB = c->MB;
    d.dt = m->dtype;
    d.es = kdt_dtype_size(m->dtype);
    d.ct = m->dtype == KDT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    d.mtp = m->d_mtp_eh != nullptr;
    return d;
}

void layout_inputs(Bump &b, Bufs &u, const Dims &d, const Plan &p) {
    b.take(&u.tokens, (size_t)d.R * 4);
    b.take(&u.pos, (size_t)d.R * 4);
    b.take(&u.slots, (size_t)d.R * 8);
    b.take(&u.last, (size_t)d.B * 4);
    b.take(&u.kv_len, (size_t)p.n_entries * 4);
    b.take(&u.tables, (size_t)p.n_entries * d.MB * 4);
    b.take(&u.masks, (size_t)p.mask_bytes);
}

void layout_scratch(Bump &b, Bufs &u, const Dims &d, const kdt_model_config *f) {
    const size_t R = (size_t)d.R, es = d.es, RK = (size_t)d.R * (d.E ? d.K : 0);
    const size_t RKS = d.E ? RK + R : 0; /* routed assignments, then the shared expert's rows (moe()'s fold) */
    b.take(&u.ticket, 4);
    size_t gu = R * 2 * (size_t)f->intermediate_size;
    if (d.E) {
        const size_t Im = (size_t)f->moe_intermediate_size, sh = R * 2 * Im * f->n_shared_experts;
        gu = gu > RKS * 2 * Im ? gu : RKS * 2 * Im;
        gu = gu > sh ? gu : sh;
    }
    b.take(&u.x, R * d.hid * 4);
    b.take(&u.hf, R * d.hid * 4);
    b.take(&u.hn, R * d.hid * es);
    b.take(&u.cs, R * d.half * 4);
    b.take(&u.sn, R * d.half * 4);
    b.take(&u.a_out, R * d.Wa * 4);
    b.take(&u.qa, R * d.ql * es);
    b.take(&u.q, d.ql ? R * d.H * d.qk * 4 : 0);
    b.take(&u.qn, R * d.H * d.nope * es);
    b.take(&u.qabs, R * d.H * d.Dqk * es);
    b.take(&u.olat, R * d.H * d.Dv * es);
    b.take(&u.lse, R * d.H * 4);
    b.take(&u.ov, R * d.H * d.vd * es);
    b.take(&u.gu, gu * 4);
    b.take(&u.act, gu / 2 * es);
    b.take(&u.rlog, R * d.E * 4);
    b.take(&u.gi, RK * 4);
    b.take(&u.gw, RK * 4);
    b.take(&u.counts, (size_t)d.E * 4);
    b.take(&u.offs, (size_t)d.E * 4);
    b.take(&u.perm, RK * 4);
    b.take(&u.posa, RK * 4);
    b.take(&u.xe, RK * d.hid * es);
    b.take(&u.ye, RKS * d.hid * 4);
    b.take(&u.logits, (size_t)d.RL * d.V * 4);
    size_t lt = gu > R * d.hid ? gu : R * d.hid; /* kdt_lin_ctx.tmp: any quantized product's [M, N] */
    b.take(&u.lt, (lt > R * d.Wa ? lt : R * d.Wa) * 4);
    b.take(&u.cat, d.mtp ? R * 2 * d.hid * es : 0);
}

/* The model's cuBLAS handle and scratch, made by its first forward. */
kdt_status ctx_make(const kdt_model *m, kdt_cuda_ctx *x) {
    KDT_CUBLAS_CHECK(cublasCreate(&x->blas));
    /* No split-K reductions in bf16: outputs are rounded once. */
    KDT_CUBLAS_CHECK(cublasSetMathMode(x->blas, CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    const size_t E = (size_t)(m->cfg.n_routed_experts > 0 ? m->cfg.n_routed_experts : 1);
    KDT_CUDA_CHECK(cudaMallocHost((void **)&x->h_counts, E * sizeof(int32_t)));
    KDT_CUDA_CHECK(cudaMalloc(&x->blas_ws, BLAS_WS_BYTES));
    KDT_CUDA_CHECK(cudaStreamCreateWithFlags(&x->cap, cudaStreamNonBlocking));
    return KDT_OK;
}

kdt_status ctx_get(kdt_model *m, kdt_cuda_ctx **out) {
    if (!m->ctx) {
        kdt_cuda_ctx *x = (kdt_cuda_ctx *)calloc(1, sizeof *x);
        if (!x) return kdt_fail(KDT_ERR_NOMEM, "forward: out of memory");
        const kdt_status s = ctx_make(m, x);
        if (s != KDT_OK) {
            kdt_cuda_ctx_free(x);
            return s;
        }
        m->ctx = x;
    }
    *out = m->ctx;
    return KDT_OK;
}

/* Grows *buf (device, or pinned host) to `need` bytes; the previous forward is over (each one
 * waits for its stream before returning). New device scratch is filled with 0xFF (NaN), so that
 * a read of something never written shows in the outputs. */
kdt_status grow(void **buf, size_t *have, size_t need, int pinned) {
    if (need <= *have) return KDT_OK;
    if (*buf && pinned) KDT_CUDA_CHECK(cudaFreeHost(*buf));
    else if (*buf) KDT_CUDA_CHECK(cudaFree(*buf));
    *buf = nullptr;
    *have = 0;
    need += need / 4; /* some room for the next, larger batch */
    cudaError_t e = pinned ? cudaMallocHost(buf, need) : cudaMalloc(buf, need);
    if (e != cudaSuccess) {
        *buf = nullptr;
        return kdt_fail(e == cudaErrorMemoryAllocation ? KDT_ERR_NOMEM : KDT_ERR_CUDA,
                        "forward: %s of %zu bytes of scratch: %s", pinned ? "cudaMallocHost" : "cudaMalloc", need,
                        cudaGetErrorString(e));
    }
    if (!pinned) {
        KDT_CUDA_CHECK(cudaMemset(*buf, 0xFF, need));
        KDT_CUDA_CHECK(cudaDeviceSynchronize()); /* before the forward's stream, which may not wait for this one */
    }
    *have = need;
    return KDT_OK;
}

/* Host side of the inputs: tokens, positions, each row's cache row, LOGITS_LAST rows, the
 * attention entries' kv_len and block-table rows, the masks (the batch's trees, or causal). */
void fill_inputs(const kdt_cache *c, const kdt_batch *bt, const int32_t *start, const int32_t *pos, const Plan &p,
                 const Dims &d, const Bufs &h) {
    if (!bt->dev_tokens) memcpy(h.tokens, bt->tokens, (size_t)d.R * 4);
    memcpy(h.pos, pos, (size_t)d.R * 4);
    for (int32_t b = 0, r = 0, last = -1; b < bt->B; b++) {
        const int32_t *table = c->block_table + (size_t)bt->req[b] * c->MB;
        for (int32_t i = 0; i < bt->n_rows[b]; i++, r++) {
            const int32_t slot = start[b] + i;
            h.slots[r] = (int64_t)table[slot / KDT_CACHE_BLOCK] * KDT_CACHE_BLOCK + slot % KDT_CACHE_BLOCK;
        }
        last += bt->n_rows[b];
        h.last[b] = last;
    }
    for (int32_t e = 0; e < p.n_entries; e++) {
        h.kv_len[e] = p.entry_len[e];
        memcpy(h.tables + (size_t)e * d.MB, c->block_table + (size_t)p.entry_req[e] * c->MB, (size_t)d.MB * 4);
    }
    if (bt->tree_mask) {
        memcpy(h.masks, bt->tree_mask, (size_t)p.mask_bytes);
        return;
    }
    uint8_t *mk = h.masks;
    for (int32_t i = 0; i < p.n_calls; i++)
        for (int32_t b = 0; b < p.calls[i].B; b++) {
            const int32_t Q = p.calls[i].Q;
            for (int32_t r = 0; r < Q; r++)
                for (int32_t j = 0; j < Q; j++) *mk++ = j <= r;
        }
}

/* Device memory (written in place by the last kernels), or host memory (copied to). */
bool on_device(const void *p) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError(); /* older runtimes fail on plain host pointers */
        return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* The forward's device work, from the uploaded inputs to f.log_out and f.hid_out, on f.s; no host
 * wait inside when f.moe_small or the model has no MoE layer. */
kdt_status compute_layers(Fwd &f) {
    const Dims &d = f.d;
    const Bufs &u = f.u;
    const kdt_model *m = f.m;
    const kdt_model_config *cf = &m->cfg;
    KDT_CUBLAS_CHECK(cublasSetStream(f.x->blas, f.s));
    KDT_CUBLAS_CHECK(cublasSetWorkspace(f.x->blas, f.x->blas_ws, BLAS_WS_BYTES)); /* cublasSetStream drops it */
    f.lc = kdt_lin_ctx{f.x->blas, f.s, d.dt, m->d_deq, u.lt};
    KDT_TRY(kdt_mk_embed(u.x, m->d_embed, d.dt, f.tok_in, d.R, d.hid, f.s));
    KDT_TRY(kdt_mk_rope_table(u.cs, u.sn, u.pos, m->d_inv_freq, d.R, d.half, (float)cf->rope_attention_factor, f.s));
    if (d.mtp) { /* x = eh_proj([enorm(embed); hnorm(h)]) */
        KDT_TRY(kdt_mk_rmsnorm(u.x, d.hid, nullptr, d.R, d.hid, m->d_mtp_enorm, cf->rms_norm_eps, nullptr, 0, u.cat, 2 * d.hid, d.dt, f.s));
        KDT_TRY(kdt_mk_rmsnorm(f.mtp_h, d.hid, nullptr, d.R, d.hid, m->d_mtp_hnorm, cf->rms_norm_eps, nullptr, 0,
                           (char *)u.cat + (size_t)d.hid * d.es, 2 * d.hid, d.dt, f.s));
        KDT_TRY(kdt_lin_gemm(f.x->blas, d.R, d.hid, 2 * d.hid, m->d_mtp_eh, d.ct, 2 * d.hid, u.cat, d.ct, 2 * d.hid, u.x, CUDA_R_32F, d.hid, 0.0f));
    }
    const int32_t nh = m->n_hid_layers;
    for (int32_t l = 0; l < cf->num_hidden_layers; l++) {
        const kdt_layer_dw *L = &m->dlayers[l];
        KDT_TRY(attention(f, l));
        const kdt_mk_norm ffn = {u.x, L->ffn_norm, nullptr, cf->rms_norm_eps};
        KDT_TRY(L->is_moe ? moe(f, l) : mlp(f, &L->dense, &ffn));
        for (int32_t i = 0; f.hid_out && i < nh; i++) /* the drafter's layers: hidden [R, nh * hidden] */
            if (m->hid_layers[i] == l)
                KDT_CUDA_CHECK(cudaMemcpy2DAsync(f.hid_out + (size_t)i * d.hid, (size_t)nh * d.hid * 4, u.x, (size_t)d.hid * 4,
                                                 (size_t)d.hid * 4, (size_t)d.R, cudaMemcpyDeviceToDevice, f.s));
    }
    /* The final norm: its own launch where the hidden states are wanted, else in the LM head's. */
    const bool hid_final = f.hid_out && !nh;
    if (hid_final)
        KDT_TRY(kdt_mk_rmsnorm(u.x, d.hid, nullptr, d.R, d.hid, m->d_final_norm, cf->rms_norm_eps, f.hid_out, d.hid,
                           f.log_out && f.all ? u.hn : nullptr, d.hid, d.dt, f.s));
    const kdt_dlin head = {KDT_WFMT_DENSE, d.V, d.hid, 1, 1, d.V, {m->d_lm_head, nullptr}, {nullptr, nullptr}};
    if (f.log_out && hid_final && f.all) return proj(f, d.RL, head, u.hn, f.log_out, 0.0f);
    if (f.log_out)
        return proj_normed(f, d.RL, head, kdt_mk_norm{u.x, m->d_final_norm, f.all ? nullptr : u.last, cf->rms_norm_eps}, f.log_out,
                           true);
    return KDT_OK;
}

/* compute_layers, its kernels launched with PDL where f.pdl says so. */
kdt_status compute(Fwd &f) {
    kdt_mk_set_pdl(f.pdl);
    const kdt_status s = compute_layers(f);
    kdt_mk_set_pdl(0);
    if (s != KDT_OK || !f.pick) return s;
    return kdt_mk_argmax(f.log_out, f.d.V, (int32_t)f.d.RL, 1, nullptr, f.pick, f.s); /* in the graph: no host turn for the pick */
}

kdt_status compute_on(void *arg, cudaStream_t s) {
    Fwd f = *(const Fwd *)arg;
    f.s = s;
    return compute(f);
}

/* Everything the captured work of f depends on besides its input buffers' contents: the graph's
 * key. $KDT_VA_SM90 picks verify_attn's kernel when a call is queued, so it is part of it. */
int64_t *graph_key(const Fwd &f, int32_t *n_key) {
    const Plan &p = *f.plan;
    const int32_t L = f.m->cfg.num_hidden_layers, n = 21 + 5 * p.n_calls + L + f.m->n_hid_layers;
    const char *va = getenv("KDT_VA_SM90");
    int64_t *k = (int64_t *)malloc((size_t)n * sizeof *k);
    if (!k) return nullptr;
    int32_t i = 0;
    k[i++] = f.m->flags;
    k[i++] = f.moe_small;
    k[i++] = f.d.R;
    k[i++] = f.d.RL;
    k[i++] = f.d.B;
    k[i++] = f.all;
    k[i++] = (int64_t)(uintptr_t)f.log_out;
    k[i++] = (int64_t)(uintptr_t)f.hid_out;
    k[i++] = (int64_t)(uintptr_t)f.pick;
    k[i++] = (int64_t)(uintptr_t)f.tok_in;
    k[i++] = (int64_t)(uintptr_t)f.x->ws;
    k[i++] = (int64_t)(uintptr_t)f.x->din;
    k[i++] = (int64_t)(uintptr_t)f.c;
    k[i++] = f.c->NB;
    k[i++] = f.c->MB;
    k[i++] = p.n_entries;
    k[i++] = p.mask_bytes;
    k[i++] = p.n_calls;
    k[i++] = va ? (int64_t)(unsigned char)va[0] << 8 | (va[0] ? (unsigned char)va[1] : 0) : -1; /* values are 1 digit */
    for (int32_t c = 0; c < p.n_calls; c++) {
        const Call &cl = p.calls[c];
        k[i++] = cl.B;
        k[i++] = cl.Q;
        k[i++] = cl.entry;
        k[i++] = cl.row;
        k[i++] = cl.mask_off;
    }
    for (int32_t l = 0; l < L; l++) k[i++] = (int64_t)(uintptr_t)f.c->dpool[l];
    k[i++] = (int64_t)(uintptr_t)f.mtp_h;
    k[i++] = f.m->n_hid_layers;
    for (int32_t l = 0; l < f.m->n_hid_layers; l++) k[i++] = f.m->hid_layers[l];
    *n_key = i;
    return k;
}

bool has_moe(const kdt_model *m) {
    for (int32_t l = 0; l < m->cfg.num_hidden_layers; l++)
        if (m->dlayers[l].is_moe) return true;
    return false;
}

/* Whether every MoE layer's routed experts are dense bf16 of sizes moe_bf16.cu takes. */
bool experts_bf16(const kdt_model *m, const Dims &d) {
    if (d.dt != KDT_BF16 || !kdt_moe_bf16_fits(d.hid, m->cfg.moe_intermediate_size)) return false;
    for (int32_t l = 0; l < m->cfg.num_hidden_layers; l++) {
        const kdt_layer_dw *L = &m->dlayers[l];
        if (L->is_moe && (L->exp_gate_up.fmt != KDT_WFMT_DENSE || L->exp_gate_up.parts != 1 || L->exp_down.fmt != KDT_WFMT_DENSE))
            return false;
    }
    return true;
}

/* Runs the device work (as a graph where the model's flags ask for it and nothing in it waits
 * for the host), then brings host outputs back and waits for the stream. */
kdt_status run(Fwd &f, const kdt_batch *bt, float *logits, float *hidden) {
    const Dims &d = f.d;
    const kdt_model *m = f.m;
    const int64_t I = m->cfg.moe_intermediate_size;
    const bool large = 3ull * (uint64_t)d.hid * (uint64_t)I * d.es >= MOE_LARGE_EXPERT_BYTES;
    const bool grouped = large && experts_bf16(m, d);
    const int64_t rows_per_expert = grouped ? MOE_BF16_ROWS_PER_EXPERT : large ? MOE_LARGE_ROWS_PER_EXPERT : MOE_SMALL_ROWS_PER_EXPERT;
    f.fused = (m->flags & KDT_MODEL_FUSED) != 0;
    const bool few_rows = d.R * d.K <= rows_per_expert * d.E;
    const bool few_macs = f.fused && !large && d.R * d.K * 3 * d.hid * I <= MOE_DEVICE_MAX_MACS;
    f.moe_small = (m->flags & (KDT_MODEL_MOE_DEVICE | KDT_MODEL_GRAPHS)) && d.E > 0 && kdt_mk_moe_small_fits(d.hid, (int32_t)I) &&
                  (few_rows || few_macs);
    f.moe_bf16 = f.moe_small && grouped && d.R * d.K > MOE_LARGE_ROWS_PER_EXPERT * d.E;
    f.gemv = (m->flags & KDT_MODEL_GEMV) && d.R <= GEMV_MAX_ROWS;
    /* Prefill-sized forwards on the device MoE (few_macs) run directly: their shapes follow the
     * prompts, and a graph per prompt length would pile up. */
    const bool graph = (m->flags & KDT_MODEL_GRAPHS) && ((f.moe_small && few_rows) || !has_moe(m));
    /* PDL in decode- and verify-sized forwards (H200, 2026-12-02: plain decoding of the shipped model
     * +7 to 8%, Kimi dims' decode at batch 8 1.52 -> 1.39 ms; the built-in model's prefill 0.78 -> 0.85
     * ms, one sample, so not prefill), not where a copy or a fill sits between kernels (the drafter's
     * hidden layers, a model without nope dims): programmatic edges kernel after kernel. */
    f.pdl = (graph || d.R <= PDL_MAX_ROWS) && (m->flags & KDT_MODEL_PDL) && d.nope && !(hidden && m->n_hid_layers);
    f.all = bt->logits_rows == KDT_LOGITS_ALL;
    f.log_out = logits ? (on_device(logits) ? logits : f.u.logits) : bt->argmax ? f.u.logits : nullptr;
    f.pick = bt->argmax;
    f.tok_in = bt->dev_tokens ? bt->dev_tokens : f.u.tokens; /* read by the embedding, in stream order */
    f.hid_out = hidden ? (on_device(hidden) ? hidden : f.u.hf) : nullptr;
    f.mtp_h = bt->mtp_hidden;
    if (hidden && m->n_hid_layers && f.hid_out != hidden)
        return kdt_fail(KDT_ERR_UNSUPPORTED, "forward: intermediate layers' hidden states go to device memory on CUDA");
    if (bt->argmax && !on_device(bt->argmax)) return kdt_fail(KDT_ERR_INVALID_ARG, "forward: argmax must be device memory");
    if (bt->no_wait && ((logits && f.log_out != logits) || (hidden && f.hid_out != hidden)))
        return kdt_fail(KDT_ERR_INVALID_ARG, "forward: no_wait needs logits and hidden in device memory");
    if (f.d.mtp && !on_device(bt->mtp_hidden))
        return kdt_fail(KDT_ERR_INVALID_ARG, "forward: an MTP model's mtp_hidden must be device memory on CUDA");
    if (graph) {
        int32_t n_key = 0;
        int64_t *key = graph_key(f, &n_key);
        if (!key) return kdt_fail(KDT_ERR_NOMEM, "forward: out of memory");
        const kdt_status s = kdt_graphs_run(&f.x->graphs, key, n_key, f.x->cap, f.s, compute_on, &f);
        free(key);
        KDT_TRY(s);
    } else {
        KDT_TRY(compute(f));
    }
    if (logits && f.log_out != logits)
        KDT_CUDA_CHECK(cudaMemcpyAsync(logits, f.log_out, (size_t)d.RL * d.V * 4, cudaMemcpyDeviceToHost, f.s));
    if (hidden && f.hid_out != hidden)
        KDT_CUDA_CHECK(cudaMemcpyAsync(hidden, f.hid_out, (size_t)d.R * d.hid * 4, cudaMemcpyDeviceToHost, f.s));
    f.x->queued = bt->no_wait != 0;
    if (!f.x->queued) KDT_CUDA_CHECK(cudaStreamSynchronize(f.s));
    return KDT_OK;
}

/* Sizes the inputs and scratch, uploads the inputs, runs. Graphs hold the scratch's addresses:
 * they are dropped when it moves. */
kdt_status forward_planned(Fwd &f, const Plan &plan, const kdt_batch *bt, const int32_t *start, const int32_t *pos,
                           float *logits, float *hidden) {
    f.plan = &plan;
    Bufs hb = {};
    Bump in = {nullptr, 0}, sc = {nullptr, 0};
    layout_inputs(in, hb, f.d, plan);
    layout_scratch(sc, f.u, f.d, &f.m->cfg);
    const void *din = f.x->din, *ws = f.x->ws;
    /* A forward still queued (no_wait) may be reading hin, din and ws: growing frees them. */
    if (f.x->queued && (in.off > f.x->hin_bytes || in.off > f.x->din_bytes || sc.off > f.x->ws_bytes))
        KDT_CUDA_CHECK(cudaDeviceSynchronize());
    KDT_TRY(grow(&f.x->hin, &f.x->hin_bytes, in.off, 1));
    KDT_TRY(grow(&f.x->din, &f.x->din_bytes, in.off, 0));
    KDT_TRY(grow(&f.x->ws, &f.x->ws_bytes, sc.off, 0));
    if (din != f.x->din || ws != f.x->ws) kdt_graphs_clear(f.x->graphs);
    Bump hp = {(char *)f.x->hin, 0}, dp = {(char *)f.x->din, 0}, wp = {(char *)f.x->ws, 0};
    layout_inputs(hp, hb, f.d, plan);
    layout_inputs(dp, f.u, f.d, plan);
    layout_scratch(wp, f.u, f.d, &f.m->cfg);
    if (ws != f.x->ws) { /* new scratch (0xFF): the ticket starts at zero, and every launch leaves it so */
        KDT_CUDA_CHECK(cudaMemset(f.u.ticket, 0, sizeof *f.u.ticket));
        KDT_CUDA_CHECK(cudaDeviceSynchronize());
    }
    if (!f.x->staged) KDT_CUDA_CHECK(cudaEventCreateWithFlags(&f.x->staged, cudaEventDisableTiming));
    KDT_CUDA_CHECK(cudaEventSynchronize(f.x->staged)); /* the previous upload has read hin (at once unless it was queued) */
    fill_inputs(f.c, bt, start, pos, plan, f.d, hb);
    KDT_CUDA_CHECK(cudaMemcpyAsync(f.x->din, f.x->hin, in.off, cudaMemcpyHostToDevice, f.s));
    KDT_CUDA_CHECK(cudaEventRecord(f.x->staged, f.s));
    return run(f, bt, logits, hidden);
}

} // namespace

extern "C" void kdt_cuda_ctx_free(kdt_cuda_ctx *x) {
    if (!x) return;
    if (x->blas) (void)cublasDestroy(x->blas);
    if (x->ws) (void)cudaFree(x->ws);
    if (x->din) (void)cudaFree(x->din);
    if (x->hin) (void)cudaFreeHost(x->hin);
    if (x->h_counts) (void)cudaFreeHost(x->h_counts);
    if (x->blas_ws) (void)cudaFree(x->blas_ws);
    if (x->cap) (void)cudaStreamDestroy(x->cap);
    if (x->staged) (void)cudaEventDestroy(x->staged);
    kdt_graphs_free(x->graphs);
    free(x);
}

extern "C" void kdt_cuda_graph_counts(const kdt_cuda_ctx *x, int64_t *replays, int64_t *captures) {
    kdt_graphs_counts(x ? x->graphs : nullptr, replays, captures);
}

extern "C" kdt_status kdt_forward_cuda(kdt_model *m, kdt_cache *c, const kdt_batch *bt, const int32_t *start,
                                       const int32_t *positions, float *logits, float *hidden, void *stream) {
    int64_t R = 0;
    for (int32_t b = 0; b < bt->B; b++) R += bt->n_rows[b];
    Fwd f = {};
    f.m = m;
    f.c = c;
    f.s = (cudaStream_t)stream;
    f.d = dims_of(m, c, bt, R);
    KDT_TRY(ctx_get(m, &f.x));
    KDT_TRY(kdt_lin_prepare(m));
    Plan plan;
    kdt_status s = plan_build(bt, start, &plan);
    if (s == KDT_OK) s = forward_planned(f, plan, bt, start, positions, logits, hidden);
    if (s != KDT_OK) (void)cudaStreamSynchronize(f.s); /* nothing of this forward is left running on the scratch */
    plan_free(&plan);
    return s;
}
