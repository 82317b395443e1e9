/* Checkpoint formats (docs/interfaces.md section 4): the language model's name prefix, the quantization config
 * (FP8 blocks, compressed-tensors pack-quantized INT4 with its ignore list) and the exact
 * dequantizers of the CPU backend. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pcre2.h>

#include "common/internal.h"
#include "model/quant.h"

void kdt_ckpt_format_free(kdt_ckpt_format *f) {
    for (size_t i = 0; i < f->n_ignore; i++) {
        free(f->ignore[i]);
        pcre2_code_free((pcre2_code *)f->ignore_re[i]);
    }
    free(f->ignore);
    free(f->ignore_re);
    memset(f, 0, sizeof *f);
}

static const cJSON *item(const cJSON *o, const char *key) { return cJSON_GetObjectItemCaseSensitive(o, key); }

/* A string field that must equal `want`. */
static kdt_status want_str(const cJSON *o, const char *what, const char *key, const char *want) {
    const cJSON *v = item(o, key);
    if (cJSON_IsString(v) && strcmp(v->valuestring, want) == 0) return KDT_OK;
    return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: field '%s' is %s%s%s, only \"%s\" is supported", what, key,
                    cJSON_IsString(v) ? "\"" : "", !v ? "missing" : cJSON_IsString(v) ? v->valuestring : "not a string",
                    cJSON_IsString(v) ? "\"" : "", want);
}

static kdt_status want_int(const cJSON *o, const char *what, const char *key, int lo, int hi, int32_t *out) {
    const cJSON *v = item(o, key);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field '%s' %s, expected an integer in %d .. %d", what, key,
                        v ? "is out of range or not an integer" : "is missing", lo, hi);
    *out = (int32_t)v->valuedouble;
    return KDT_OK;
}

static kdt_status parse_fp8(const cJSON *q, const char *w, kdt_ckpt_format *f) {
    kdt_status s;
    if ((s = want_str(q, w, "fmt", "e4m3"))) return s;
    const cJSON *b = item(q, "weight_block_size");
    if (!cJSON_IsArray(b) || cJSON_GetArraySize(b) != 2)
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field 'weight_block_size' must be [rows, cols]", w);
    const cJSON *arr = b;
    b = arr->child;
    for (int i = 0; i < 2; i++, b = b->next)
        if (!cJSON_IsNumber(b) || b->valuedouble != floor(b->valuedouble) || b->valuedouble < 1 || b->valuedouble > 65536)
            return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field 'weight_block_size' must hold two integers in 1 .. 65536", w);
    f->block_n = (int32_t)arr->child->valuedouble;
    f->block_k = (int32_t)arr->child->next->valuedouble;
    f->quant = KDT_QUANT_FP8;
    return KDT_OK;
}

/* The ignore list: exact names, or "re:" patterns compiled with PCRE2. */
static kdt_status parse_ignore(const cJSON *q, const char *w, kdt_ckpt_format *f) {
    const cJSON *ig = item(q, "ignore");
    if (!ig || cJSON_IsNull(ig)) return KDT_OK;
    if (!cJSON_IsArray(ig)) return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field 'ignore' must be a list of strings", w);
    const size_t n = (size_t)cJSON_GetArraySize(ig);
    f->ignore = calloc(n + 1, sizeof *f->ignore);
    f->ignore_re = calloc(n + 1, sizeof *f->ignore_re);
    if (!f->ignore || !f->ignore_re) return kdt_fail(KDT_ERR_NOMEM, "%s: out of memory", w);
    const cJSON *e;
    cJSON_ArrayForEach(e, ig) {
        if (!cJSON_IsString(e)) return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field 'ignore': entry %zu is not a string", w, f->n_ignore);
        const size_t i = f->n_ignore++;
        if (!(f->ignore[i] = strdup(e->valuestring))) return kdt_fail(KDT_ERR_NOMEM, "%s: out of memory", w);
        if (strncmp(e->valuestring, "re:", 3) != 0) continue;
        int err;
        PCRE2_SIZE at;
        f->ignore_re[i] = pcre2_compile((PCRE2_SPTR)e->valuestring + 3, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &err, &at, NULL);
        if (!f->ignore_re[i]) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(err, msg, sizeof msg);
            return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field 'ignore': pattern \"%s\" does not compile at offset %zu: %s", w,
                            e->valuestring, (size_t)at, (const char *)msg);
        }
    }
    return KDT_OK;
}

/* compressed-tensors: one config group of 4-bit symmetric int weights in groups along the input. */
static kdt_status parse_ct(const cJSON *q, const char *w, kdt_ckpt_format *f) {
    kdt_status s;
    if ((s = want_str(q, w, "format", "pack-quantized"))) return s;
    const cJSON *groups = item(q, "config_groups");
    if (!cJSON_IsObject(groups) || cJSON_GetArraySize(groups) != 1)
        return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: field 'config_groups' must hold exactly one group", w);
    const cJSON *g = groups->child;
    char sub[768];
    snprintf(sub, sizeof sub, "%.512s: config_groups.%.64s", w, g->string);
    const cJSON *tg = item(g, "targets");
    if (!cJSON_IsArray(tg) || cJSON_GetArraySize(tg) != 1 || !cJSON_IsString(tg->child) || strcmp(tg->child->valuestring, "Linear"))
        return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: field 'targets' must be [\"Linear\"]", sub);
    const cJSON *gf = item(g, "format");
    if (gf && !cJSON_IsNull(gf) && (s = want_str(g, sub, "format", "pack-quantized"))) return s;
    const cJSON *ia = item(g, "input_activations");
    if (ia && !cJSON_IsNull(ia))
        return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: field 'input_activations': only weight-only quantization is supported", sub);
    const cJSON *wt = item(g, "weights");
    if (!cJSON_IsObject(wt)) return kdt_fail(KDT_ERR_INVALID_ARG, "%s: field 'weights' missing or not an object", sub);
    snprintf(sub + strlen(sub), sizeof sub - strlen(sub), ".weights");
    int32_t bits;
    const cJSON *sym = item(wt, "symmetric"), *dyn = item(wt, "dynamic");
    if ((s = want_int(wt, sub, "num_bits", 1, 64, &bits))) return s;
    if (bits != 4) return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: field 'num_bits' = %d, only 4 is supported", sub, bits);
    if ((s = want_str(wt, sub, "type", "int")) || (s = want_str(wt, sub, "strategy", "group"))) return s;
    if (!cJSON_IsTrue(sym)) return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: field 'symmetric' must be true", sub);
    if (dyn && !cJSON_IsFalse(dyn)) return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: field 'dynamic' must be false", sub);
    const cJSON *ao = item(wt, "actorder");
    if (ao && !cJSON_IsNull(ao)) return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: field 'actorder' must be null", sub);
    if ((s = want_int(wt, sub, "group_size", 1, 1 << 20, &f->group))) return s;
    f->quant = KDT_QUANT_INT4;
    return parse_ignore(q, w, f);
}

kdt_status kdt_ckpt_format_parse(const cJSON *root, const char *what, kdt_ckpt_format *out) {
    memset(out, 0, sizeof *out);
    const cJSON *text = item(root, "text_config");
    out->prefix = cJSON_IsObject(text) ? "language_model." : "";
    const char *key = "text_config.quantization_config";
    const cJSON *q = cJSON_IsObject(text) ? item(text, "quantization_config") : NULL;
    if (!q || cJSON_IsNull(q)) { q = item(root, "quantization_config"); key = "quantization_config"; }
    if (!q || cJSON_IsNull(q)) return KDT_OK;
    char w[512];
    snprintf(w, sizeof w, "%s: %s", what, key);
    if (!cJSON_IsObject(q)) return kdt_fail(KDT_ERR_INVALID_ARG, "%s: not an object", w);
    const cJSON *m = item(q, "quant_method");
    kdt_status s;
    if (cJSON_IsString(m) && strcmp(m->valuestring, "fp8") == 0) s = parse_fp8(q, w, out);
    else if (cJSON_IsString(m) && strcmp(m->valuestring, "compressed-tensors") == 0) s = parse_ct(q, w, out);
    else
        s = kdt_fail(KDT_ERR_UNSUPPORTED, "%s: field 'quant_method' is %s%s%s: only \"fp8\" and \"compressed-tensors\" are supported",
                     w, cJSON_IsString(m) ? "\"" : "", !m ? "missing" : cJSON_IsString(m) ? m->valuestring : "not a string",
                     cJSON_IsString(m) ? "\"" : "");
    if (s != KDT_OK) kdt_ckpt_format_free(out);
    return s;
}

int kdt_ckpt_ignored(const kdt_ckpt_format *f, const char *name) {
    for (size_t i = 0; i < f->n_ignore; i++) {
        if (!f->ignore_re[i]) {
            if (strcmp(f->ignore[i], name) == 0) return 1;
            continue;
        }
        pcre2_match_data *md = pcre2_match_data_create_from_pattern((pcre2_code *)f->ignore_re[i], NULL);
        if (!md) return 0;
        int rc = pcre2_match((pcre2_code *)f->ignore_re[i], (PCRE2_SPTR)name, strlen(name), 0, PCRE2_ANCHORED, md, NULL);
        pcre2_match_data_free(md);
        if (rc >= 0) return 1;
    }
    return 0;
}

float kdt_fp8_e4m3_to_f32(uint8_t v) {
    const int sign = v >> 7, exp = (v >> 3) & 15, man = v & 7;
    float x;
    if (exp == 15 && man == 7) x = NAN;
    else if (exp == 0) x = ldexpf((float)man, -9);      /* subnormal: man / 8 * 2^-6 */
    else x = ldexpf((float)(8 + man), exp - 10);        /* (1 + man / 8) * 2^(exp - 7) */
    return sign ? -x : x;
}

void kdt_dequant_fp8(const void *w, const void *scale, int64_t rows, int64_t cols, int32_t bn, int32_t bk, float *out) {
    float lut[256];
    for (int i = 0; i < 256; i++) lut[i] = kdt_fp8_e4m3_to_f32((uint8_t)i);
    const uint8_t *q = w;
    const unsigned char *sc = scale;
    const int64_t scols = (cols + bk - 1) / bk;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            float s;
            memcpy(&s, sc + 4 * ((r / bn) * scols + c / bk), 4);
            out[r * cols + c] = lut[q[r * cols + c]] * s;
        }
}

void kdt_dequant_int4(const void *packed, const void *scale, int64_t rows, int64_t cols, int32_t g, float *out) {
    const unsigned char *p = packed, *sc = scale;
    const int64_t words = (cols + 7) / 8, scols = (cols + g - 1) / g;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            const unsigned char byte = p[4 * (r * words + c / 8) + (c % 8) / 2]; /* little-endian word */
            const int nib = c % 2 ? byte >> 4 : byte & 15;
            const unsigned char *sp = sc + 2 * (r * scols + c / g);
            const uint32_t bits = (uint32_t)(sp[0] | sp[1] << 8) << 16;
            float s;
            memcpy(&s, &bits, 4);
            out[r * cols + c] = (float)(nib - 8) * s;
        }
}
