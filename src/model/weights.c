/* Loading a model folder: config.json, then every tensor the config calls for, checked for
 * presence, dtype and shape, converted to f32 (and for the CUDA backend uploaded piece by piece).
 * Linears may be quantized (FP8 blocks, INT4 groups: src/model/quant.h) and are dequantized
 * exactly; a nested checkpoint's names start with `language_model.`, and whatever else it holds
 * (the vision tower) is never read.
 * Experts come one tensor per expert (model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight,
 * the hub's layout) or fused (model.layers.L.mlp.experts.gate_up_proj [E, 2I, hidden], gate rows
 * first, and model.layers.L.mlp.experts.down_proj [E, hidden, I], transformers 5's), chosen per
 * layer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/internal.h"
#include "model/ep.h"
#include "model/quant.h"
#include "model/safetensors.h"

typedef struct loader {
    kdt_model *m;
    const kdt_st *st;
    const char *dir;
    const kdt_ckpt_format *fmt;
    int32_t layer_off;           /* model layer l is the checkpoint's model.layers.(l + layer_off) (MTP: N) */
} loader;

static const char *const FLOATS[] = {"F32", "BF16", "F16", NULL};

static void shape_str(int nd, const int64_t *d, char *out, size_t cap) {
    int n = snprintf(out, cap, "[");
    for (int i = 0; i < nd && n < (int)cap; i++) n += snprintf(out + n, cap - n, "%s%lld", i ? ", " : "", (long long)d[i]);
    if (n < (int)cap) snprintf(out + n, cap - n, "]");
}

static float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023;
    uint32_t bits;
    if (exp == 31) bits = sign | 0x7F800000u | man << 13;
    else if (exp) bits = sign | (exp + 112) << 23 | man << 13;
    else if (!man) bits = sign;
    else { /* subnormal: man * 2^-24, exact in f32 */
        float f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* numel elements of t from element `from`, as f32, into dst (the data may be unaligned). */
static void convert(const kdt_st_tensor *t, uint64_t from, uint64_t numel, float *dst) {
    const unsigned char *src = (const unsigned char *)t->data + from * kdt_dtype_size(t->dtype);
    if (t->dtype == KDT_F32) { memcpy(dst, src, numel * 4); return; }
    for (uint64_t i = 0; i < numel; i++) {
        uint16_t v;
        memcpy(&v, src + 2 * i, 2);
        if (t->dtype == KDT_F16) dst[i] = half_to_float(v);
        else {
            uint32_t bits = (uint32_t)v << 16;
            memcpy(&dst[i], &bits, 4);
        }
    }
}

/* The tensor `name` (the format's prefix added), which must have shape d[0 .. nd) and one of the
 * dtypes listed. */
static kdt_status find_as(const loader *ld, const char *name, const char *const *dtypes, int nd, const int64_t *d,
                          const kdt_st_tensor **out) {
    char want[128], full[320], kinds[64] = "";
    shape_str(nd, d, want, sizeof want);
    snprintf(full, sizeof full, "%s%s", ld->fmt->prefix, name);
    const kdt_st_tensor *t = kdt_st_find(ld->st, full);
    if (!t) return kdt_fail(KDT_ERR_NOT_FOUND, "%s: tensor '%s' is missing (expected shape %s)", ld->dir, full, want);
    int ok = 0;
    for (int i = 0; dtypes[i]; i++) {
        ok |= strcmp(t->dtype_name, dtypes[i]) == 0;
        snprintf(kinds + strlen(kinds), sizeof kinds - strlen(kinds), "%s%s", i ? (dtypes[i + 1] ? ", " : " or ") : "", dtypes[i]);
    }
    if (!ok) return kdt_fail(KDT_ERR_DTYPE, "%s: tensor '%s' has dtype %s, expected %s", t->file, full, t->dtype_name, kinds);
    int same = t->ndim == nd;
    for (int i = 0; same && i < nd; i++) same = t->dims[i] == (uint64_t)d[i];
    if (!same) {
        int64_t got[KDT_ST_MAX_NDIM];
        for (int i = 0; i < t->ndim; i++) got[i] = (int64_t)t->dims[i];
        char have[128];
        shape_str(t->ndim, got, have, sizeof have);
        return kdt_fail(KDT_ERR_SHAPE, "%s: tensor '%s' has shape %s, expected %s", t->file, full, have, want);
    }
    *out = t;
    return KDT_OK;
}

static kdt_status find(const loader *ld, const char *name, int nd, const int64_t *d, const kdt_st_tensor **out) {
    return find_as(ld, name, FLOATS, nd, d, out);
}

/* Loads `name` [d...] into a new f32 buffer owned by the model. */
static kdt_status load(const loader *ld, const char *name, int nd, const int64_t *d, const float **out) {
    const kdt_st_tensor *t;
    kdt_status s = find(ld, name, nd, d, &t);
    if (s != KDT_OK) return s;
    float *buf = kdt_model_buf(ld->m, (size_t)t->numel);
    if (!buf) return kdt_fail(KDT_ERR_NOMEM, "%s: out of memory loading tensor '%s'", ld->dir, name);
    convert(t, 0, t->numel, buf);
    *out = buf;
    return KDT_OK;
}

#define D1(a) 1, (const int64_t[]){a}
#define D2(a, b) 2, (const int64_t[]){a, b}

/* FP8 blocks: the F32 weight_scale_inv per block of `module`, whose weight w is F8_E4M3 [rows, cols]. */
static kdt_status fp8_scale(const loader *ld, const char *module, const kdt_st_tensor *w, int64_t rows, int64_t cols,
                            const kdt_st_tensor **sc) {
    const kdt_ckpt_format *f = ld->fmt;
    char n[320];
    if (f->quant != KDT_QUANT_FP8)
        return kdt_fail(KDT_ERR_DTYPE, "%s: tensor '%s%s.weight' is F8_E4M3 but config.json has no fp8 quantization_config",
                        w->file, f->prefix, module);
    snprintf(n, sizeof n, "%s.weight_scale_inv", module);
    return find_as(ld, n, (const char *const[]){"F32", NULL},
                   D2((rows + f->block_n - 1) / f->block_n, (cols + f->block_k - 1) / f->block_k), sc);
}

/* compressed-tensors INT4: weight_packed and weight_scale of `module`, checked against its weight_shape. */
static kdt_status int4_find(const loader *ld, const char *module, int64_t rows, int64_t cols, const kdt_st_tensor **pk,
                            const kdt_st_tensor **sc) {
    const int32_t g = ld->fmt->group;
    char n[320];
    const kdt_st_tensor *sh;
    kdt_status s;
    snprintf(n, sizeof n, "%s.weight_packed", module);
    if ((s = find_as(ld, n, (const char *const[]){"I32", NULL}, D2(rows, (cols + 7) / 8), pk)) != KDT_OK) {
        snprintf(n, sizeof n, "%s%s.weight", ld->fmt->prefix, module);
        if (s == KDT_ERR_NOT_FOUND && kdt_st_find(ld->st, n))
            return kdt_fail(s, "%s: tensor '%s%s.weight_packed' is missing: module '%s%s' is not in quantization_config's ignore "
                            "list, yet the checkpoint holds it unquantized", ld->dir, ld->fmt->prefix, module, ld->fmt->prefix, module);
        return s;
    }
    snprintf(n, sizeof n, "%s.weight_scale", module);
    if ((s = find_as(ld, n, (const char *const[]){"BF16", NULL}, D2(rows, (cols + g - 1) / g), sc))) return s;
    snprintf(n, sizeof n, "%s.weight_shape", module);
    if ((s = find_as(ld, n, (const char *const[]){"I64", "I32", NULL}, D1(2), &sh))) return s;
    int64_t dims[2];
    for (int i = 0; i < 2; i++) {
        if (sh->dtype == KDT_I64) memcpy(&dims[i], (const char *)sh->data + 8 * i, 8);
        else { int32_t v; memcpy(&v, (const char *)sh->data + 4 * i, 4); dims[i] = v; }
    }
    if (dims[0] != rows || dims[1] != cols)
        return kdt_fail(KDT_ERR_SHAPE, "%s: tensor '%s%s' holds [%lld, %lld], expected [%lld, %lld]", sh->file, ld->fmt->prefix, n,
                        (long long)dims[0], (long long)dims[1], (long long)rows, (long long)cols);
    return KDT_OK;
}

static const char *const LINEAR_DTYPES[] = {"F32", "BF16", "F16", "F8_E4M3", NULL};

/* The nn.Linear `module` [rows, cols] as f32 into dst: a float weight, FP8 blocks, or INT4 groups
 * unless the ignore list keeps the module in a float dtype. */
static kdt_status linear_into(const loader *ld, const char *module, int64_t rows, int64_t cols, float *dst) {
    char n[320], full[320];
    const kdt_st_tensor *t, *sc;
    kdt_status s;
    snprintf(full, sizeof full, "%s%s", ld->fmt->prefix, module);
    if (ld->fmt->quant == KDT_QUANT_INT4 && !kdt_ckpt_ignored(ld->fmt, full)) {
        if ((s = int4_find(ld, module, rows, cols, &t, &sc))) return s;
        kdt_dequant_int4(t->data, sc->data, rows, cols, ld->fmt->group, dst);
        return KDT_OK;
    }
    snprintf(n, sizeof n, "%s.weight", module);
    if ((s = find_as(ld, n, LINEAR_DTYPES, D2(rows, cols), &t))) return s;
    if (strcmp(t->dtype_name, "F8_E4M3") == 0) {
        if ((s = fp8_scale(ld, module, t, rows, cols, &sc))) return s;
        kdt_dequant_fp8(t->data, sc->data, rows, cols, ld->fmt->block_n, ld->fmt->block_k, dst);
        return KDT_OK;
    }
    convert(t, 0, t->numel, dst);
    return KDT_OK;
}

/* Whether the CUDA backend keeps `module` [rows, cols] quantized: a bf16 model, and a format and
 * shape that src/cuda/quant_gemm.h takes (FP8 blocks of 128 x 128 with cols % 16 == 0; INT4
 * groups of 32 with cols % 32 == 0). Then q holds the checkpoint's bytes. Anything else,
 * including a tensor that fails its checks, is left to linear_into, which reports it. */
static int quant_src(const loader *ld, const char *module, int64_t rows, int64_t cols, kdt_qsrc *q) {
    const kdt_ckpt_format *f = ld->fmt;
    char n[320];
    const kdt_st_tensor *t, *sc;
    *q = (kdt_qsrc){0};
    if (ld->m->backend != KDT_BACKEND_CUDA || ld->m->dtype != KDT_BF16) return 0;
    snprintf(n, sizeof n, "%s%s", f->prefix, module);
    if (f->quant == KDT_QUANT_INT4 && f->group == 32 && cols % 32 == 0 && !kdt_ckpt_ignored(f, n) &&
        int4_find(ld, module, rows, cols, &t, &sc) == KDT_OK)
        *q = (kdt_qsrc){KDT_WFMT_INT4, t->data, sc->data};
    snprintf(n, sizeof n, "%s.weight", module);
    if (f->quant == KDT_QUANT_FP8 && f->block_n == 128 && f->block_k == 128 && cols % 16 == 0 &&
        find_as(ld, n, LINEAR_DTYPES, D2(rows, cols), &t) == KDT_OK && strcmp(t->dtype_name, "F8_E4M3") == 0 &&
        fp8_scale(ld, module, t, rows, cols, &sc) == KDT_OK)
        *q = (kdt_qsrc){KDT_WFMT_FP8, t->data, sc->data};
    return q->fmt != KDT_WFMT_DENSE;
}

static kdt_status load_linear(const loader *ld, const char *module, int64_t rows, int64_t cols, const float **out) {
    float *buf = kdt_model_buf(ld->m, (size_t)(rows * cols));
    if (!buf) return kdt_fail(KDT_ERR_NOMEM, "%s: out of memory loading '%s'", ld->dir, module);
    *out = buf;
    return linear_into(ld, module, rows, cols, buf);
}

/* A linear the CUDA backend may keep quantized (q), else loaded as f32 (*out). */
static kdt_status load_lin(const loader *ld, const char *module, int64_t rows, int64_t cols, const float **out, kdt_qsrc *q) {
    *out = NULL;
    return quant_src(ld, module, rows, cols, q) ? KDT_OK : load_linear(ld, module, rows, cols, out);
}

/* Two linears of `cols` inputs that the CUDA backend stacks into one matrix: quantized both, in
 * the same format, or loaded as f32 both. */
static kdt_status load_pair(const loader *ld, const char *ma, int64_t ra, const float **a, kdt_qsrc *qa, const char *mb,
                            int64_t rb, const float **b, kdt_qsrc *qb, int64_t cols) {
    *a = *b = NULL;
    if (quant_src(ld, ma, ra, cols, qa) && quant_src(ld, mb, rb, cols, qb) && qa->fmt == qb->fmt) return KDT_OK;
    *qa = *qb = (kdt_qsrc){0};
    kdt_status s = load_linear(ld, ma, ra, cols, a);
    return s == KDT_OK ? load_linear(ld, mb, rb, cols, b) : s;
}

#define D3(a, b, c) 3, (const int64_t[]){a, b, c}

static kdt_status load_mlp(const loader *ld, const char *prefix, int32_t hid, int32_t inter, kdt_mlp_w *w) {
    char g[256], u[256], d[256];
    w->inter = inter;
    snprintf(g, sizeof g, "%s.gate_proj", prefix);
    snprintf(u, sizeof u, "%s.up_proj", prefix);
    snprintf(d, sizeof d, "%s.down_proj", prefix);
    kdt_status s = load_pair(ld, g, inter, &w->gate, &w->gate_q, u, inter, &w->up, &w->up_q, hid);
    return s == KDT_OK ? load_lin(ld, d, hid, inter, &w->down, &w->down_q) : s;
}

/* The three linears of an expert, in the order the loaders keep them. */
static const char *const EXPERT_PROJ[3] = {"gate_proj", "up_proj", "down_proj"};

/* This rank's hub-layout experts of layer l kept quantized (w->exp_q) when all 3E linears can be, in
 * one format. */
static int experts_quant(const loader *ld, int32_t l, kdt_layer_w *w) {
    const kdt_model_config *c = &ld->m->cfg;
    const int64_t E = ld->m->e_n, e0 = ld->m->e_lo, I = c->moe_intermediate_size, hid = c->hidden_size;
    kdt_qsrc *q = (kdt_qsrc *)kdt_model_buf(ld->m, (size_t)(E * 3) * sizeof *q / sizeof(float) + 1);
    if (!q) return 0;
    char n[256];
    for (int64_t i = 0; i < E * 3; i++) {
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%lld.%s", l + ld->layer_off, (long long)(e0 + i / 3), EXPERT_PROJ[i % 3]);
        if (!quant_src(ld, n, i % 3 < 2 ? I : hid, i % 3 < 2 ? hid : I, &q[i]) || q[i].fmt != q[0].fmt) return 0;
    }
    w->exp_q = q;
    return 1;
}

/* This rank's routed experts [e_lo, e_lo + E) of layer l into [E, I, hidden] gate and up and
 * [E, hidden, I] down; the other experts' bytes are not read. */
static kdt_status load_experts(const loader *ld, int32_t l, kdt_layer_w *w) {
    const kdt_model_config *c = &ld->m->cfg;
    const int64_t E = ld->m->e_n, e0 = ld->m->e_lo, I = c->moe_intermediate_size, hid = c->hidden_size;
    if (experts_quant(ld, l, w)) return KDT_OK;
    float *gate = kdt_model_buf(ld->m, (size_t)(E * I * hid)), *up = kdt_model_buf(ld->m, (size_t)(E * I * hid));
    float *down = kdt_model_buf(ld->m, (size_t)(E * hid * I));
    if (!gate || !up || !down) return kdt_fail(KDT_ERR_NOMEM, "%s: out of memory for the experts of layer %d", ld->dir, l);
    w->exp_gate = gate;
    w->exp_up = up;
    w->exp_down = down;
    char n[256];
    kdt_status s;
    const kdt_st_tensor *t;
    snprintf(n, sizeof n, "model.layers.%d.mlp.experts.gate_up_proj", l + ld->layer_off);
    char full[320];
    snprintf(full, sizeof full, "%s%s", ld->fmt->prefix, n);
    if (kdt_st_find(ld->st, full)) {
        if ((s = find(ld, n, D3(c->n_routed_experts, 2 * I, hid), &t))) return s;
        for (int64_t e = 0; e < E; e++) {
            convert(t, (uint64_t)((e0 + e) * 2 * I * hid), (uint64_t)(I * hid), gate + e * I * hid);
            convert(t, (uint64_t)(((e0 + e) * 2 + 1) * I * hid), (uint64_t)(I * hid), up + e * I * hid);
        }
        snprintf(n, sizeof n, "model.layers.%d.mlp.experts.down_proj", l + ld->layer_off);
        if ((s = find(ld, n, D3(c->n_routed_experts, hid, I), &t))) return s;
        convert(t, (uint64_t)(e0 * hid * I), (uint64_t)(E * hid * I), down);
        return KDT_OK;
    }
    for (int64_t e = 0; e < E; e++)
        for (int k = 0; k < 3; k++) {
            snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%lld.%s", l + ld->layer_off, (long long)(e0 + e), EXPERT_PROJ[k]);
            float *dst = (k == 0 ? gate : k == 1 ? up : down) + e * I * hid;
            if ((s = k < 2 ? linear_into(ld, n, I, hid, dst) : linear_into(ld, n, hid, I, dst))) {
                if (s == KDT_ERR_NOT_FOUND && e == 0 && k == 0) {
                    char msg[600];
                    snprintf(msg, sizeof msg, "%s", kdt_last_error());
                    return kdt_fail(s, "%s: layer %d: experts missing: neither %smodel.layers.%d.mlp.experts.gate_up_proj "
                                    "(fused) nor one tensor per expert is there (%s)", ld->dir, l, ld->fmt->prefix, l, msg);
                }
                return s;
            }
        }
    return KDT_OK;
}

static kdt_status load_layer(const loader *ld, int32_t l) {
    const kdt_model_config *c = &ld->m->cfg;
    kdt_layer_w *w = &ld->m->layers[l];
    const int32_t hid = c->hidden_size, H = c->num_attention_heads, qk = c->qk_nope_head_dim + c->qk_rope_head_dim;
    char n[256], p[96];
    kdt_status s;
    snprintf(p, sizeof p, "model.layers.%d", l + ld->layer_off);
    w->is_moe = kdt_layer_is_moe(c, l);
    if (!kdt_ep_driver(ld->m)) return w->is_moe ? load_experts(ld, l, w) : KDT_OK; /* a rank > 0: its experts alone */
#define NAME(fmt) (snprintf(n, sizeof n, "%s." fmt, p), n)
    if ((s = load(ld, NAME("input_layernorm.weight"), D1(hid), &w->attn_norm)) ||
        (s = load(ld, NAME("post_attention_layernorm.weight"), D1(hid), &w->ffn_norm)))
        return s;
    char kv_a[256];
    snprintf(kv_a, sizeof kv_a, "%s.self_attn.kv_a_proj_with_mqa", p);
    const int64_t kv_rows = c->kv_lora_rank + c->qk_rope_head_dim;
    if (c->q_lora_rank) {
        if ((s = load_pair(ld, NAME("self_attn.q_a_proj"), c->q_lora_rank, &w->q_a, &w->q_a_q, kv_a, kv_rows, &w->kv_a, &w->kv_a_q,
                           hid)) ||
            (s = load(ld, NAME("self_attn.q_a_layernorm.weight"), D1(c->q_lora_rank), &w->q_a_norm)) ||
            (s = load_lin(ld, NAME("self_attn.q_b_proj"), (int64_t)H * qk, c->q_lora_rank, &w->q_b, &w->q_b_q)))
            return s;
    } else if ((s = load_pair(ld, NAME("self_attn.q_proj"), (int64_t)H * qk, &w->q_proj, &w->q_proj_q, kv_a, kv_rows, &w->kv_a,
                              &w->kv_a_q, hid))) {
        return s;
    }
    if ((s = load(ld, NAME("self_attn.kv_a_layernorm.weight"), D1(c->kv_lora_rank), &w->kv_a_norm)) ||
        (s = load_linear(ld, NAME("self_attn.kv_b_proj"), (int64_t)H * (c->qk_nope_head_dim + c->v_head_dim), c->kv_lora_rank,
                         &w->kv_b)) ||
        (s = load_lin(ld, NAME("self_attn.o_proj"), hid, (int64_t)H * c->v_head_dim, &w->o, &w->o_q)))
        return s;
    if (!w->is_moe) return load_mlp(ld, NAME("mlp"), hid, c->intermediate_size, &w->dense);
    if ((s = load(ld, NAME("mlp.gate.weight"), D2(c->n_routed_experts, hid), &w->router)) ||
        (c->topk_method == KDT_TOPK_NOAUX_TC &&
         (s = load(ld, NAME("mlp.gate.e_score_correction_bias"), D1(c->n_routed_experts), &w->router_bias))) ||
        (s = load_experts(ld, l, w)))
        return s;
    if (c->n_shared_experts == 0) return KDT_OK;
    return load_mlp(ld, NAME("mlp.shared_experts"), hid, c->moe_intermediate_size * c->n_shared_experts, &w->shared);
#undef NAME
}

kdt_status kdt_model_load(const char *dir, kdt_backend backend, kdt_model **out) {
    return kdt_model_load_as(dir, backend, backend == KDT_BACKEND_CUDA ? KDT_BF16 : KDT_F32, out);
}

/* CUDA: each piece goes to the device as soon as it is loaded, and its host f32 copies (the
 * buffers made since n_allocs was `from`) are freed, so the host holds at most one layer. */
static kdt_status offload(kdt_model *m, int32_t layer, size_t from) {
    if (m->backend != KDT_BACKEND_CUDA) return KDT_OK;
    kdt_status s = layer < 0 ? kdt_model_upload_top(m) : kdt_model_upload_layer(m, layer);
    kdt_model_release_bufs(m, from);
    return s;
}

/* Reads dir/config.json (its path into path [cap]): the model's config and the checkpoint's format,
 * and with nextn non-NULL its num_nextn_predict_layers (left as it was when absent). */
static kdt_status read_config(const char *dir, char *path, size_t cap, kdt_model_config *cfg, kdt_ckpt_format *fmt, int32_t *nextn) {
    if ((size_t)snprintf(path, cap, "%s/config.json", dir) >= cap) return kdt_fail(KDT_ERR_INVALID_ARG, "%s: path too long", dir);
    char *text;
    size_t len;
    kdt_status s = kdt_read_text(path, &text, &len);
    if (s != KDT_OK) return s;
    s = kdt_model_config_parse(text, len, path, cfg);
    if (s == KDT_OK) { /* parsed once already: valid JSON */
        cJSON *root = cJSON_ParseWithLength(text, len);
        s = root ? kdt_ckpt_format_parse(root, path, fmt) : kdt_fail(KDT_ERR_NOMEM, "%s: out of memory", path);
        const cJSON *tc = nextn && root ? cJSON_GetObjectItemCaseSensitive(root, "text_config") : NULL;
        const cJSON *v = nextn ? cJSON_GetObjectItemCaseSensitive(cJSON_IsObject(tc) ? tc : root, "num_nextn_predict_layers") : NULL;
        if (cJSON_IsNumber(v)) *nextn = (int32_t)v->valuedouble;
        cJSON_Delete(root);
    }
    free(text);
    return s;
}

kdt_status kdt_model_load_as(const char *dir, kdt_backend backend, kdt_dtype dtype, kdt_model **out) {
    return kdt_model_load_part(dir, backend, dtype, NULL, out);
}

/* comm: rank r of N reads its experts, rank 0 everything else too (ep.c); NULL: the whole model. */
kdt_status kdt_model_load_part(const char *dir, kdt_backend backend, kdt_dtype dtype, kdt_comm *comm, kdt_model **out) {
    if (!out) return kdt_fail(KDT_ERR_INVALID_ARG, "model_load: out is NULL");
    *out = NULL;
    if (!dir) return kdt_fail(KDT_ERR_INVALID_ARG, "model_load: dir is NULL");
    char path[4096];
    kdt_model_config cfg;
    kdt_ckpt_format fmt = {.prefix = ""};
    kdt_status s = read_config(dir, path, sizeof path, &cfg, &fmt, NULL);
    if (s != KDT_OK) return s;
    kdt_model *m;
    if ((s = kdt_model_alloc(&m, &cfg, backend, dtype)) != KDT_OK) { kdt_ckpt_format_free(&fmt); return s; }
    kdt_ep_assign(m, comm);
    kdt_st *st;
    if ((s = kdt_st_open_dir(dir, &st)) != KDT_OK) { kdt_ckpt_format_free(&fmt); kdt_model_free(m); return s; }
    const loader ld = {.m = m, .st = st, .dir = dir, .fmt = &fmt};
    const int64_t V = cfg.vocab_size, hid = cfg.hidden_size;
    if (kdt_ep_driver(m)) { /* the embedding, final norm and LM head: rank 0's alone */
        s = load(&ld, "model.embed_tokens.weight", D2(V, hid), &m->embed);
        if (s == KDT_OK) s = load(&ld, "model.norm.weight", D1(hid), &m->final_norm);
        if (s == KDT_OK && cfg.tie_word_embeddings) m->lm_head = m->embed;
        else if (s == KDT_OK) s = load_linear(&ld, "lm_head", V, hid, &m->lm_head);
    }
    if (s == KDT_OK) s = offload(m, -1, 0);
    for (int32_t l = 0; l < cfg.num_hidden_layers && s == KDT_OK; l++) {
        const size_t from = m->n_allocs;
        s = load_layer(&ld, l);
        if (s == KDT_OK) s = offload(m, l, from);
    }
    if (s == KDT_OK) s = kdt_model_finish(m);
    kdt_st_close(st);
    kdt_ckpt_format_free(&fmt);
    if (s != KDT_OK) { kdt_model_free(m); return s; }
    *out = m;
    return KDT_OK;
}

/* The MTP layer's own pieces, and its embedding and head with the model's as fallbacks. */
static kdt_status load_mtp_top(const loader *ld, int32_t N) {
    kdt_model *m = ld->m;
    const int64_t V = m->cfg.vocab_size, hid = m->cfg.hidden_size;
    char n[128], full[320];
    kdt_status s;
#define MTP(fmt) (snprintf(n, sizeof n, "model.layers.%d." fmt, N), n)
#define HAS(name) (snprintf(full, sizeof full, "%s%s", ld->fmt->prefix, name), kdt_st_find(ld->st, full) != NULL)
    if ((s = load(ld, MTP("enorm.weight"), D1(hid), &m->mtp_enorm)) || (s = load(ld, MTP("hnorm.weight"), D1(hid), &m->mtp_hnorm)) ||
        (s = load(ld, MTP("eh_proj.weight"), D2(hid, 2 * hid), &m->mtp_eh)) ||
        (s = load(ld, MTP("shared_head.norm.weight"), D1(hid), &m->final_norm)))
        return s;
    if ((s = load(ld, HAS(MTP("embed_tokens.weight")) ? n : "model.embed_tokens.weight", D2(V, hid), &m->embed))) return s;
    if (HAS(MTP("shared_head.head.weight"))) return load_linear(ld, MTP("shared_head.head"), V, hid, &m->lm_head);
    if (m->cfg.tie_word_embeddings) {
        m->lm_head = m->embed;
        return KDT_OK;
    }
    return load_linear(ld, "lm_head", V, hid, &m->lm_head);
#undef HAS
#undef MTP
}

kdt_status kdt_model_load_mtp(const char *dir, kdt_backend backend, kdt_model **out) {
    if (!out) return kdt_fail(KDT_ERR_INVALID_ARG, "model_load_mtp: out is NULL");
    *out = NULL;
    if (!dir) return kdt_fail(KDT_ERR_INVALID_ARG, "model_load_mtp: dir is NULL");
    char path[4096];
    kdt_model_config cfg;
    kdt_ckpt_format fmt = {.prefix = ""};
    int32_t nextn = 0;
    kdt_status s = read_config(dir, path, sizeof path, &cfg, &fmt, &nextn);
    if (s == KDT_OK && nextn < 1)
        s = kdt_fail(KDT_ERR_NOT_FOUND, "%s: field 'num_nextn_predict_layers' is missing or 0: the checkpoint has no MTP layer", path);
    if (s != KDT_OK) { kdt_ckpt_format_free(&fmt); return s; }
    /* One layer, MoE or dense as layer N is in the full model. */
    const int32_t N = cfg.num_hidden_layers, moe = kdt_layer_is_moe(&cfg, N);
    cfg.num_hidden_layers = 1;
    cfg.first_k_dense_replace = moe ? 0 : 1;
    cfg.moe_layer_freq = 1;
    kdt_model *m;
    const kdt_dtype dt = backend == KDT_BACKEND_CUDA ? KDT_BF16 : KDT_F32; /* as kdt_model_load */
    if ((s = kdt_model_alloc(&m, &cfg, backend, dt)) != KDT_OK) { kdt_ckpt_format_free(&fmt); return s; }
    kdt_st *st = NULL;
    s = kdt_st_open_dir(dir, &st);
    const loader ld = {.m = m, .st = st, .dir = dir, .fmt = &fmt, .layer_off = N};
    if (s == KDT_OK) s = load_mtp_top(&ld, N);
    if (s == KDT_OK) s = load_layer(&ld, 0);
    if (s == KDT_OK && backend == KDT_BACKEND_CUDA) s = kdt_model_upload_mtp(m);
    if (s == KDT_OK) s = offload(m, -1, m->n_allocs);
    if (s == KDT_OK) s = offload(m, 0, 0); /* every host copy goes */
    if (s == KDT_OK) s = kdt_model_finish(m);
    kdt_st_close(st);
    kdt_ckpt_format_free(&fmt);
    if (s != KDT_OK) { kdt_model_free(m); return s; }
    *out = m;
    return KDT_OK;
}
