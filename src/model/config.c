/* config.json of a DeepseekV3ForCausalLM: the hub's form (rope_scaling, rope_theta at the top)
 * and transformers 5's (rope_parameters), resolved as transformers 5 resolves them. A field that
 * is absent takes transformers' default; a field of the wrong type or out of range fails with a
 * message naming it. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/internal.h"
#include "model/internal.h"

#define DIM_MAX (1 << 20)

/* -1: absent; 0: null; 1: present and not null. */
static int presence(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return !v ? -1 : cJSON_IsNull(v) ? 0 : 1;
}

#define NOT_NULL INT32_MIN

/* An integer field in [lo, hi]. required: absent fails; absent takes def; null takes null_val
 * (NOT_NULL: null is an error). */
static kdt_status get_int(const cJSON *o, const char *what, const char *key, int required, int64_t lo, int64_t hi,
                          int32_t def, int32_t null_val, int32_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || (cJSON_IsNull(v) && null_val != NOT_NULL)) {
        if (required && !v) return kdt_fail(KDT_ERR_NOT_FOUND, "%s: field '%s' is missing", what, key);
        *out = v ? null_val : def;
        return KDT_OK;
    }
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(d == floor(d) && d >= (double)lo && d <= (double)hi))
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field '%s' must be an integer in %lld .. %lld%s", what, key,
                        (long long)lo, (long long)hi, null_val != NOT_NULL ? " or null" : "");
    *out = (int32_t)d;
    return KDT_OK;
}

/* A finite number field; absent or null takes def (null only where nullable). */
static kdt_status get_num(const cJSON *o, const char *what, const char *key, int nullable, double def, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || (nullable && cJSON_IsNull(v))) { *out = def; return KDT_OK; }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field '%s' must be a number%s", what, key, nullable ? " or null" : "");
    *out = v->valuedouble;
    return KDT_OK;
}

static kdt_status get_bool(const cJSON *o, const char *what, const char *key, int def, int32_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) { *out = def; return KDT_OK; }
    if (!cJSON_IsBool(v)) return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field '%s' must be true or false", what, key);
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return KDT_OK;
}

/* A string field that, when present, must equal one of the accepted values. */
static kdt_status check_str(const cJSON *o, const char *what, const char *key, const char *a, const char *b) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return KDT_OK;
    if (cJSON_IsString(v) && (strcmp(v->valuestring, a) == 0 || (b && strcmp(v->valuestring, b) == 0))) return KDT_OK;
    return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: field '%s' is %s%s%s, only \"%s\"%s%s%s is supported", what, key,
                    cJSON_IsString(v) ? "\"" : "", cJSON_IsString(v) ? v->valuestring : "not a string",
                    cJSON_IsString(v) ? "\"" : "", a, b ? " or \"" : "", b ? b : "", b ? "\"" : "");
}

static double yarn_get_mscale(double scale, double mscale) {
    return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

/* rope_scaling (hub) or rope_parameters (transformers 5); rope_scaling wins when both are set,
 * as in transformers. Fields inside the dict win over rope_theta at the top level, except
 * original_max_position_embeddings, where a top-level field wins (transformers' Phi-3 rule). */
static kdt_status parse_rope(const cJSON *root, const char *what, kdt_model_config *c) {
    const char *dict_name = "rope_scaling";
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, dict_name);
    if (!r || cJSON_IsNull(r)) {
        dict_name = "rope_parameters";
        r = cJSON_GetObjectItemCaseSensitive(root, dict_name);
    }
    if (r && cJSON_IsNull(r)) r = NULL;
    if (r && !cJSON_IsObject(r)) return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field '%s' must be an object or null", what, dict_name);
    char sub[160];
    snprintf(sub, sizeof sub, "%s: %s", what, dict_name);
    kdt_status s;
    double theta_top;
    if ((s = get_num(root, what, "rope_theta", 0, 10000.0, &theta_top)) != KDT_OK) return s;
    c->rope_theta = theta_top;
    c->rope_yarn = 0;
    c->rope_attention_factor = 1.0;
    c->softmax_scale = 1.0 / sqrt((double)(c->qk_nope_head_dim + c->qk_rope_head_dim));
    if (!r) return c->rope_theta > 0 ? KDT_OK : kdt_fail(KDT_ERR_INVALID_ARG, "%s: field 'rope_theta' must be > 0", what);

    if ((s = get_num(r, sub, "rope_theta", 0, theta_top, &c->rope_theta)) != KDT_OK) return s;
    if (!(c->rope_theta > 0)) return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field 'rope_theta' must be > 0", sub);
    const char *type_key = presence(r, "rope_type") >= 0 ? "rope_type" : "type";
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(r, type_key);
    const char *t = !type ? "default" : cJSON_IsString(type) ? type->valuestring : NULL;
    if (!t) return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field '%s' must be a string", sub, type_key);
    double prf;
    if ((s = get_num(r, sub, "partial_rotary_factor", 1, 1.0, &prf)) != KDT_OK) return s;
    if (prf != 1.0) return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: field 'partial_rotary_factor' = %g: only 1 is supported", sub, prf);
    if (strcmp(t, "default") == 0) return KDT_OK;
    if (strcmp(t, "yarn") != 0)
        return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: field '%s' is \"%s\": only \"default\" and \"yarn\" are supported", sub,
                        type_key, t);

    c->rope_yarn = 1;
    int32_t omax = c->max_position_embeddings;
    if (presence(root, "original_max_position_embeddings") >= 0) {
        if ((s = get_int(root, what, "original_max_position_embeddings", 1, 1, DIM_MAX * 64, 0, NOT_NULL, &omax)) != KDT_OK) return s;
    } else if ((s = get_int(r, sub, "original_max_position_embeddings", 0, 1, DIM_MAX * 64, omax, NOT_NULL, &omax)) != KDT_OK) {
        return s;
    }
    c->yarn_original_max_position_embeddings = omax;
    if (presence(r, "factor") < 0) return kdt_fail(KDT_ERR_NOT_FOUND, "%s: field 'factor' is missing", sub);
    if ((s = get_num(r, sub, "factor", 1, (double)c->max_position_embeddings / omax, &c->yarn_factor)) != KDT_OK) return s;
    if (!(c->yarn_factor > 0)) return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field 'factor' must be > 0", sub);
    /* beta_fast / beta_slow: `or 32` / `or 1` in transformers, so 0 and null take the default. */
    if ((s = get_num(r, sub, "beta_fast", 1, 0, &c->yarn_beta_fast)) != KDT_OK) return s;
    if ((s = get_num(r, sub, "beta_slow", 1, 0, &c->yarn_beta_slow)) != KDT_OK) return s;
    if (c->yarn_beta_fast == 0) c->yarn_beta_fast = 32;
    if (c->yarn_beta_slow == 0) c->yarn_beta_slow = 1;
    if (!(c->yarn_beta_fast > 0 && c->yarn_beta_slow > 0))
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: fields 'beta_fast' and 'beta_slow' must be > 0", sub);
    if ((s = get_num(r, sub, "mscale", 1, 0, &c->yarn_mscale)) != KDT_OK) return s;
    if ((s = get_num(r, sub, "mscale_all_dim", 1, 0, &c->yarn_mscale_all_dim)) != KDT_OK) return s;
    if ((s = get_bool(r, sub, "truncate", 1, &c->yarn_truncate)) != KDT_OK) return s;
    double af = NAN;
    if ((s = get_num(r, sub, "attention_factor", 1, NAN, &af)) != KDT_OK) return s;
    /* cos/sin factor: given, or mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both
     * are set (non-zero), or mscale(factor). */
    if (!isnan(af)) c->rope_attention_factor = af;
    else if (c->yarn_mscale != 0 && c->yarn_mscale_all_dim != 0)
        c->rope_attention_factor = yarn_get_mscale(c->yarn_factor, c->yarn_mscale) /
                                   yarn_get_mscale(c->yarn_factor, c->yarn_mscale_all_dim);
    else c->rope_attention_factor = yarn_get_mscale(c->yarn_factor, 1.0);
    /* Softmax scale: times mscale(factor, mscale_all_dim)^2 when mscale_all_dim is non-zero. */
    if (c->yarn_mscale_all_dim != 0) {
        double m = yarn_get_mscale(c->yarn_factor, c->yarn_mscale_all_dim);
        c->softmax_scale *= m * m;
    }
    return KDT_OK;
}

kdt_status kdt_config_finish(kdt_model_config *c, const char *what) {
    if (c->qk_rope_head_dim % 2)
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field 'qk_rope_head_dim' = %d must be even", what, c->qk_rope_head_dim);
    if (c->first_k_dense_replace > c->num_hidden_layers)
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field 'first_k_dense_replace' = %d is above num_hidden_layers = %d", what,
                        c->first_k_dense_replace, c->num_hidden_layers);
    if (c->n_routed_experts > 0) {
        if (c->n_routed_experts % c->n_group)
            return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field 'n_group' = %d does not divide n_routed_experts = %d", what,
                            c->n_group, c->n_routed_experts);
        if (c->topk_group > c->n_group)
            return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field 'topk_group' = %d is above n_group = %d", what, c->topk_group,
                            c->n_group);
        int64_t choosable = (int64_t)c->topk_group * (c->n_routed_experts / c->n_group);
        if (c->num_experts_per_tok > choosable)
            return kdt_fail(KDT_ERR_INVALID_ARG,
                            "%s: field 'num_experts_per_tok' = %d is above the %lld experts of topk_group groups", what,
                            c->num_experts_per_tok, (long long)choosable);
    }
    if (!(c->rms_norm_eps > 0)) return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field 'rms_norm_eps' must be > 0", what);
    if (!isfinite(c->routed_scaling_factor))
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field 'routed_scaling_factor' must be finite", what);
    if (!(c->softmax_scale > 0 && isfinite(c->softmax_scale) && isfinite(c->rope_attention_factor)))
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: rope scaling gives a softmax scale %g and cos/sin factor %g", what,
                        c->softmax_scale, c->rope_attention_factor);
    return KDT_OK;
}

/* Architectures of a language model config; a nesting config (text_config) is one of nest_archs. */
static const char *const text_archs[] = {"DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "Glm4MoeLiteForCausalLM", NULL};
static const char *const nest_archs[] = {"KimiK25ForConditionalGeneration", "KimiVLForConditionalGeneration", NULL};

/* 'architectures', when given, lists one of `known`. */
static kdt_status check_arch(const cJSON *o, const char *w, const char *const *known, const char *names) {
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(o, "architectures");
    if (!arch || cJSON_IsNull(arch)) return KDT_OK;
    const cJSON *a;
    if (cJSON_IsArray(arch))
        cJSON_ArrayForEach(a, arch)
            for (int i = 0; known[i]; i++)
                if (cJSON_IsString(a) && strcmp(a->valuestring, known[i]) == 0) return KDT_OK;
    return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: field 'architectures' lists none of %s", w, names);
}

/* scoring_func and topk_method: sigmoid with noaux_tc, or softmax with greedy or group_limited_greedy. */
static kdt_status parse_router(const cJSON *root, const char *w, kdt_model_config *c) {
    const cJSON *sf = cJSON_GetObjectItemCaseSensitive(root, "scoring_func");
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(root, "topk_method");
    const char *score = cJSON_IsString(sf) ? sf->valuestring : "sigmoid";
    const char *method = cJSON_IsString(tm) ? tm->valuestring : strcmp(score, "softmax") == 0 ? "greedy" : "noaux_tc";
    if ((sf && !cJSON_IsNull(sf) && !cJSON_IsString(sf)) || (tm && !cJSON_IsNull(tm) && !cJSON_IsString(tm)))
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: fields 'scoring_func' and 'topk_method' must be strings", w);
    c->router_softmax = strcmp(score, "softmax") == 0;
    if (!c->router_softmax && strcmp(score, "sigmoid") != 0)
        return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: field 'scoring_func' is \"%s\": only \"sigmoid\" and \"softmax\" are supported", w, score);
    if (!c->router_softmax && strcmp(method, "noaux_tc") == 0) c->topk_method = KDT_TOPK_NOAUX_TC;
    else if (c->router_softmax && strcmp(method, "greedy") == 0) c->topk_method = KDT_TOPK_GREEDY;
    else if (c->router_softmax && strcmp(method, "group_limited_greedy") == 0) c->topk_method = KDT_TOPK_GROUP_LIMITED;
    else
        return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: field 'scoring_func' is \"%s\" and field 'topk_method' \"%s\": supported are "
                        "sigmoid with noaux_tc, softmax with greedy or group_limited_greedy", w, score, method);
    return KDT_OK;
}

/* GLM's mlp_layer_types (["dense", ..., "sparse", ...]): leading dense layers, then MoE ones; it
 * gives first_k_dense_replace and must agree with it when both are set. */
static kdt_status parse_layer_types(const cJSON *root, const char *w, kdt_model_config *c) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "mlp_layer_types");
    if (!t || cJSON_IsNull(t)) return KDT_OK;
    if (!cJSON_IsArray(t) || cJSON_GetArraySize(t) != c->num_hidden_layers)
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field 'mlp_layer_types' must list num_hidden_layers = %d strings", w,
                        c->num_hidden_layers);
    int32_t dense = 0, i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, t) {
        const int is_dense = cJSON_IsString(e) && strcmp(e->valuestring, "dense") == 0;
        if (!is_dense && !(cJSON_IsString(e) && strcmp(e->valuestring, "sparse") == 0))
            return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field 'mlp_layer_types': entry %d is not \"dense\" or \"sparse\"", w, i);
        if (is_dense && dense != i)
            return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: field 'mlp_layer_types': a dense layer (%d) after a sparse one", w, i);
        dense += is_dense;
        i++;
    }
    if (presence(root, "first_k_dense_replace") == 1 && dense != c->first_k_dense_replace)
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field 'mlp_layer_types' has %d dense layers, first_k_dense_replace says %d", w,
                        dense, c->first_k_dense_replace);
    if (c->moe_layer_freq != 1)
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: fields 'mlp_layer_types' and 'moe_layer_freq' != 1 together", w);
    c->first_k_dense_replace = dense;
    return KDT_OK;
}

static kdt_status parse(const cJSON *root, const char *w, kdt_model_config *c) {
    kdt_status s;
    if ((s = check_arch(root, w, text_archs, "DeepseekV3ForCausalLM, DeepseekV2ForCausalLM or Glm4MoeLiteForCausalLM")))
        return s;
    /* Required dims, then transformers 5's defaults for the rest. */
    if ((s = get_int(root, w, "vocab_size", 1, 1, 1 << 24, 0, NOT_NULL, &c->vocab_size)) ||
        (s = get_int(root, w, "hidden_size", 1, 1, DIM_MAX, 0, NOT_NULL, &c->hidden_size)) ||
        (s = get_int(root, w, "num_hidden_layers", 1, 1, 4096, 0, NOT_NULL, &c->num_hidden_layers)) ||
        (s = get_int(root, w, "num_attention_heads", 1, 1, 1024, 0, NOT_NULL, &c->num_attention_heads)) ||
        (s = get_int(root, w, "q_lora_rank", 1, 1, DIM_MAX, 0, 0, &c->q_lora_rank)) ||
        (s = get_int(root, w, "kv_lora_rank", 1, 1, DIM_MAX, 0, NOT_NULL, &c->kv_lora_rank)) ||
        (s = get_int(root, w, "qk_nope_head_dim", 1, 0, DIM_MAX, 0, NOT_NULL, &c->qk_nope_head_dim)) ||
        (s = get_int(root, w, "qk_rope_head_dim", 1, 2, 4096, 0, NOT_NULL, &c->qk_rope_head_dim)) ||
        (s = get_int(root, w, "v_head_dim", 1, 1, DIM_MAX, 0, NOT_NULL, &c->v_head_dim)) ||
        (s = get_int(root, w, "intermediate_size", 0, 1, DIM_MAX, 18432, NOT_NULL, &c->intermediate_size)) ||
        (s = get_int(root, w, "moe_intermediate_size", 0, 1, DIM_MAX, 2048, NOT_NULL, &c->moe_intermediate_size)) ||
        (s = get_int(root, w, "n_routed_experts", 0, 1, 65536, 256, 0, &c->n_routed_experts)) ||
        (s = get_int(root, w, "n_shared_experts", 0, 0, 1024, 1, 0, &c->n_shared_experts)) ||
        (s = get_int(root, w, "num_experts_per_tok", 0, 1, 65536, 8, NOT_NULL, &c->num_experts_per_tok)) ||
        (s = get_int(root, w, "n_group", 0, 1, 65536, 8, NOT_NULL, &c->n_group)) ||
        (s = get_int(root, w, "topk_group", 0, 1, 65536, 4, NOT_NULL, &c->topk_group)) ||
        (s = get_int(root, w, "first_k_dense_replace", 0, 0, 4096, 3, NOT_NULL, &c->first_k_dense_replace)) ||
        (s = get_int(root, w, "moe_layer_freq", 0, 1, 4096, 1, NOT_NULL, &c->moe_layer_freq)) ||
        (s = get_int(root, w, "max_position_embeddings", 0, 1, 1 << 30, 4096, NOT_NULL, &c->max_position_embeddings)) ||
        (s = get_bool(root, w, "norm_topk_prob", 1, &c->norm_topk_prob)) ||
        (s = get_bool(root, w, "tie_word_embeddings", 0, &c->tie_word_embeddings)) ||
        (s = get_bool(root, w, "rope_interleave", 1, &c->rope_interleave)))
        return s;
    int32_t kv_heads;
    if ((s = get_int(root, w, "num_key_value_heads", 0, 1, 1024, c->num_attention_heads, c->num_attention_heads, &kv_heads)))
        return s;
    if (kv_heads != c->num_attention_heads)
        return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: field 'num_key_value_heads' = %d differs from num_attention_heads = %d", w,
                        kv_heads, c->num_attention_heads);
    double eps, rsf;
    if ((s = get_num(root, w, "rms_norm_eps", 0, 1e-6, &eps)) || (s = get_num(root, w, "routed_scaling_factor", 0, 2.5, &rsf)))
        return s;
    c->rms_norm_eps = (float)eps;
    c->routed_scaling_factor = (float)rsf;
    if ((s = check_str(root, w, "hidden_act", "silu", NULL)) || (s = parse_router(root, w, c)) || (s = parse_layer_types(root, w, c)))
        return s;
    int32_t bias;
    if ((s = get_bool(root, w, "attention_bias", 0, &bias))) return s;
    if (bias) return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: field 'attention_bias' is true: only false is supported", w);
    if ((s = parse_rope(root, w, c))) return s;
    return kdt_config_finish(c, w);
}

/* A multimodal config (K2.5, K2.6, Kimi-VL) nests the language model's in text_config. */
static kdt_status parse_outer(const cJSON *root, const char *w, kdt_model_config *c) {
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (!text || cJSON_IsNull(text)) return parse(root, w, c);
    if (!cJSON_IsObject(text)) return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field 'text_config' must be an object", w);
    kdt_status s = check_arch(root, w, nest_archs, "KimiK25ForConditionalGeneration or KimiVLForConditionalGeneration");
    if (s != KDT_OK) return s;
    char sub[512];
    snprintf(sub, sizeof sub, "%s: text_config", w);
    return parse(text, sub, c);
}

kdt_status kdt_model_config_parse(const char *json, size_t len, const char *what, kdt_model_config *out) {
    memset(out, 0, sizeof *out);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        size_t at = end && end >= json && end <= json + len ? (size_t)(end - json) : 0;
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: not valid JSON (error near byte %zu)", what, at);
    }
    for (const char *p = end; p < json + len; p++)
        if (!strchr(" \t\r\n", *p) || !*p) {
            cJSON_Delete(root);
            return kdt_fail(KDT_ERR_INVALID_ARG, "%s: not valid JSON (bytes after the top-level value, at byte %zu)", what,
                            (size_t)(p - json));
        }
    kdt_status s = cJSON_IsObject(root) ? parse_outer(root, what, out)
                                        : kdt_fail(KDT_ERR_INVALID_ARG, "%s: the top level is not a JSON object", what);
    cJSON_Delete(root);
    return s;
}
