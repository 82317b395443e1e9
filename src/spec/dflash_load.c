/* The DFlash draft checkpoint (z-lab's format): config.json and model.safetensors of a
 * DFlashDraftModel, read strictly into host f32 (docs/spec.md, "DFlash"). Names: fc.weight
 * [hidden, n_target * hidden], hidden_norm.weight, norm.weight [hidden], and per layer i
 * layers.i.{input_layernorm, post_attention_layernorm}.weight [hidden],
 * layers.i.self_attn.{q_proj [H * hd, hidden], k_proj, v_proj [KV * hd, hidden], o_proj [hidden, H * hd],
 * q_norm, k_norm [hd]}.weight, layers.i.mlp.{gate_proj, up_proj [I, hidden], down_proj [hidden, I]}.weight. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "model/safetensors.h"
#include "spec/dflash.h"

/* block_size, mask_token_id and target_layer_ids live in dflash_config or at the top level. */
static const cJSON *item(const cJSON *root, const char *key) {
    const cJSON *dc = cJSON_GetObjectItemCaseSensitive(root, "dflash_config");
    const cJSON *v = cJSON_IsObject(dc) ? cJSON_GetObjectItemCaseSensitive(dc, key) : NULL;
    return v ? v : cJSON_GetObjectItemCaseSensitive(root, key);
}

static kdt_status get_int(const cJSON *root, const char *key, int required, int64_t def, int64_t lo, int64_t hi, int32_t *out) {
    const cJSON *v = item(root, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return kdt_fail(KDT_ERR_NOT_FOUND, "dflash config: %s is missing", key);
        *out = (int32_t)def;
        return KDT_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
        return kdt_fail(KDT_ERR_INVALID_ARG, "dflash config: %s must be an integer in %lld .. %lld", key, (long long)lo, (long long)hi);
    *out = (int32_t)v->valuedouble;
    return KDT_OK;
}

static kdt_status get_num(const cJSON *o, const char *key, double def, double *out) {
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    if (!v || cJSON_IsNull(v)) { *out = def; return KDT_OK; }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return kdt_fail(KDT_ERR_INVALID_ARG, "dflash config: %s must be a number", key);
    *out = v->valuedouble;
    return KDT_OK;
}

/* Features this forward does not compute are refused rather than ignored. */
static kdt_status check_unsupported(const cJSON *root) {
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "attention_bias")) && cJSON_IsTrue(v))
        return kdt_fail(KDT_ERR_UNSUPPORTED, "dflash config: attention_bias = true is not supported");
    if ((v = item(root, "is_causal")) && cJSON_IsTrue(v))
        return kdt_fail(KDT_ERR_UNSUPPORTED, "dflash config: is_causal = true is not supported (the block attends both ways)");
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "hidden_act")) && !(cJSON_IsString(v) && strcmp(v->valuestring, "silu") == 0))
        return kdt_fail(KDT_ERR_UNSUPPORTED, "dflash config: hidden_act must be \"silu\"");
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    for (const cJSON *e = cJSON_IsArray(lt) ? lt->child : NULL; e; e = e->next)
        if (!cJSON_IsString(e) || strcmp(e->valuestring, "full_attention") != 0)
            return kdt_fail(KDT_ERR_UNSUPPORTED, "dflash config: layer_types: only full_attention layers are supported");
    const char *const scaled[] = {"rope_scaling", "rope_parameters"};
    for (int i = 0; i < 2; i++) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, scaled[i]), *t;
        if (!r || cJSON_IsNull(r)) continue;
        if (!cJSON_IsObject(r)) return kdt_fail(KDT_ERR_INVALID_ARG, "dflash config: %s must be an object", scaled[i]);
        if (!(t = cJSON_GetObjectItemCaseSensitive(r, "rope_type"))) t = cJSON_GetObjectItemCaseSensitive(r, "type");
        if (t && !(cJSON_IsString(t) && strcmp(t->valuestring, "default") == 0))
            return kdt_fail(KDT_ERR_UNSUPPORTED, "dflash config: %s: only the default rope is supported", scaled[i]);
    }
    if ((v = item(root, "final_logit_softcapping")) && !cJSON_IsNull(v) && !(cJSON_IsNumber(v) && v->valuedouble == 0))
        return kdt_fail(KDT_ERR_UNSUPPORTED, "dflash config: final_logit_softcapping is not supported");
    return KDT_OK;
}

static kdt_status parse_config(const cJSON *root, dfl_config *c) {
    kdt_status s;
    if ((s = check_unsupported(root))) return s;
    if ((s = get_int(root, "hidden_size", 1, 0, 1, 1 << 16, &c->hid)) || (s = get_int(root, "num_hidden_layers", 1, 0, 1, 256, &c->L)) ||
        (s = get_int(root, "num_attention_heads", 1, 0, 1, 1024, &c->H)) ||
        (s = get_int(root, "num_key_value_heads", 0, c->H, 1, c->H, &c->KV)) ||
        (s = get_int(root, "head_dim", 0, c->hid / c->H, 2, 1024, &c->hd)) ||
        (s = get_int(root, "intermediate_size", 1, 0, 1, 1 << 20, &c->I)) ||
        (s = get_int(root, "vocab_size", 1, 0, 1, INT32_MAX, &c->V)) ||
        (s = get_int(root, "block_size", 0, 16, 2, 65, &c->bs)) ||
        (s = get_int(root, "mask_token_id", 1, 0, 0, (int64_t)c->V - 1, &c->mask)))
        return s;
    if (c->H % c->KV) return kdt_fail(KDT_ERR_INVALID_ARG, "dflash config: num_attention_heads %d is not a multiple of num_key_value_heads %d", c->H, c->KV);
    if (c->hd % 2) return kdt_fail(KDT_ERR_INVALID_ARG, "dflash config: head_dim %d must be even (rope)", c->hd);
    const cJSON *tl = item(root, "target_layer_ids");
    c->nT = cJSON_IsArray(tl) ? cJSON_GetArraySize(tl) : 0;
    if (c->nT < 1 || c->nT > KDT_MODEL_MAX_HIDDEN_LAYERS)
        return kdt_fail(KDT_ERR_INVALID_ARG, "dflash config: dflash_config.target_layer_ids must list 1 .. %d layers", KDT_MODEL_MAX_HIDDEN_LAYERS);
    int32_t i = 0;
    for (const cJSON *e = tl->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 || e->valuedouble > 1e6)
            return kdt_fail(KDT_ERR_INVALID_ARG, "dflash config: target_layer_ids[%d] must be a layer index", i);
        c->target_layers[i] = (int32_t)e->valuedouble;
    }
    double eps, theta, scale, mult;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    if ((s = get_num(root, "rms_norm_eps", 1e-6, &eps)) || (s = get_num(root, "rope_theta", 10000.0, &theta)) ||
        (s = get_num(cJSON_IsObject(rp) ? rp : NULL, "rope_theta", theta, &theta)))
        return s;
    const cJSON *dc = cJSON_GetObjectItemCaseSensitive(root, "dflash_config");
    if ((s = get_num(root, "input_embedding_scale", 1.0, &scale)) || (s = get_num(cJSON_IsObject(dc) ? dc : NULL, "input_embedding_scale", scale, &scale)) ||
        (s = get_num(root, "output_multiplier", 1.0, &mult)) || (s = get_num(cJSON_IsObject(dc) ? dc : NULL, "output_multiplier", mult, &mult)))
        return s;
    if (eps <= 0 || theta <= 0) return kdt_fail(KDT_ERR_INVALID_ARG, "dflash config: rms_norm_eps and rope_theta must be positive");
    c->eps = (float)eps;
    c->theta = theta;
    c->emb_scale = (float)scale;
    c->out_mult = (float)mult;
    return KDT_OK;
}

static float bf16_to_f32(uint16_t v) {
    const uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A tensor of exactly shape d (nd dims), F32 or BF16, copied to host f32 (kept in m->allocs). */
static kdt_status tensor(dfl_model *m, const kdt_st *st, const char *name, int nd, const int64_t *d, float **out) {
    const kdt_st_tensor *t = kdt_st_find(st, name);
    if (!t) return kdt_fail(KDT_ERR_NOT_FOUND, "dflash checkpoint: tensor %s is missing", name);
    int same = t->ndim == nd;
    for (int i = 0; same && i < nd; i++) same = t->dims[i] == (uint64_t)d[i];
    if (!same)
        return kdt_fail(KDT_ERR_SHAPE, "dflash checkpoint: tensor %s has the wrong shape (want [%lld%s%lld])", name, (long long)d[0],
                        nd > 1 ? ", " : "", nd > 1 ? (long long)d[1] : 0LL);
    if (t->dtype != KDT_F32 && t->dtype != KDT_BF16)
        return kdt_fail(KDT_ERR_DTYPE, "dflash checkpoint: tensor %s is %s (F32 or BF16 wanted)", name, t->dtype_name);
    float *w = malloc((size_t)t->numel * sizeof *w);
    if (!w) return kdt_fail(KDT_ERR_NOMEM, "dflash checkpoint: out of memory for %s", name);
    m->allocs[m->n_allocs++] = w;
    const unsigned char *p = t->data;
    for (uint64_t i = 0; i < t->numel; i++) {
        if (t->dtype == KDT_F32) memcpy(w + i, p + 4 * i, 4);
        else {
            uint16_t v;
            memcpy(&v, p + 2 * i, 2);
            w[i] = bf16_to_f32(v);
        }
    }
    *out = w;
    return KDT_OK;
}

#define D1(a) 1, (const int64_t[]){a}
#define D2(a, b) 2, (const int64_t[]){a, b}

static kdt_status load_weights(dfl_model *m, const kdt_st *st) {
    const dfl_config *c = &m->c;
    const int64_t hid = c->hid, qd = (int64_t)c->H * c->hd, kvd = (int64_t)c->KV * c->hd;
    kdt_status s;
    if ((s = tensor(m, st, "fc.weight", D2(hid, c->nT * hid), &m->fc)) || (s = tensor(m, st, "hidden_norm.weight", D1(hid), &m->hidden_norm)) ||
        (s = tensor(m, st, "norm.weight", D1(hid), &m->norm)))
        return s;
    for (int32_t l = 0; l < c->L; l++) {
        dfl_layer *w = &m->layers[l];
        char n[11][96];
        const char *const parts[11] = {"input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                                       "self_attn.v_proj", "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm",
                                       "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
        for (int i = 0; i < 11; i++) snprintf(n[i], sizeof n[i], "layers.%d.%s.weight", l, parts[i]);
        if ((s = tensor(m, st, n[0], D1(hid), &w->in_norm)) || (s = tensor(m, st, n[1], D1(hid), &w->post_norm)) ||
            (s = tensor(m, st, n[2], D2(qd, hid), &w->q)) || (s = tensor(m, st, n[3], D2(kvd, hid), &w->k)) ||
            (s = tensor(m, st, n[4], D2(kvd, hid), &w->v)) || (s = tensor(m, st, n[5], D2(hid, qd), &w->o)) ||
            (s = tensor(m, st, n[6], D1(c->hd), &w->q_norm)) || (s = tensor(m, st, n[7], D1(c->hd), &w->k_norm)) ||
            (s = tensor(m, st, n[8], D2(c->I, hid), &w->gate)) || (s = tensor(m, st, n[9], D2(c->I, hid), &w->up)) ||
            (s = tensor(m, st, n[10], D2(hid, c->I), &w->down)))
            return s;
    }
    return KDT_OK;
}

void dfl_model_free(dfl_model *m) {
    if (!m) return;
    for (size_t i = 0; i < m->n_allocs; i++) free(m->allocs[i]);
    free(m->allocs);
    free(m->layers);
    free(m->inv_freq);
    free(m);
}

kdt_status dfl_model_load(const char *dir, dfl_model **out) {
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *txt = NULL;
    size_t len = 0;
    kdt_status s = kdt_read_text(path, &txt, &len);
    if (s != KDT_OK) return s;
    cJSON *root = cJSON_ParseWithLength(txt, len);
    free(txt);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return kdt_fail(KDT_ERR_INVALID_ARG, "dflash config: %s is not a JSON object", path);
    }
    dfl_model *m = calloc(1, sizeof *m);
    if (!m) { cJSON_Delete(root); return kdt_fail(KDT_ERR_NOMEM, "dflash: out of memory"); }
    s = parse_config(root, &m->c);
    cJSON_Delete(root);
    if (s == KDT_OK) {
        m->layers = calloc((size_t)m->c.L, sizeof *m->layers);
        m->allocs = calloc(DFL_MAX_ALLOCS, sizeof *m->allocs);
        m->inv_freq = malloc((size_t)(m->c.hd / 2) * sizeof *m->inv_freq);
        if (!m->layers || !m->allocs || !m->inv_freq) s = kdt_fail(KDT_ERR_NOMEM, "dflash: out of memory");
    }
    for (int32_t i = 0; s == KDT_OK && i < m->c.hd / 2; i++) m->inv_freq[i] = (float)pow(m->c.theta, -2.0 * i / m->c.hd);
    kdt_st *st = NULL;
    if (s == KDT_OK) s = kdt_st_open_dir(dir, &st);
    if (s == KDT_OK) s = load_weights(m, st);
    kdt_st_close(st);
    if (s != KDT_OK) { dfl_model_free(m); return s; }
    *out = m;
    return KDT_OK;
}
