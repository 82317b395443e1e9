/* Quantized checkpoints (docs/interfaces.md section 4), made by python/make_quant_fixtures.py with torch and
 * compressed-tensors: the dequantizers bit for bit against the bundle tests/fixtures/quant/
 * unpack.kdtr (nibble order, the offset of 8, group-scale broadcast and a partial group; FP8
 * codes, block scales and partial blocks); the ignore list's matching as compressed-tensors'
 * (exact names, "re:" patterns matched from the start); each quantized fixture's CPU logits
 * equal to its dequantized twin's exactly (f32 dequantization is exact; test_model checks both
 * against transformers); and broken quantized checkpoints refused naming the tensor or field. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ckpt_edit.h"
#include "harness.h"
#include "kdt/model.h"
#include "model/quant.h"

static const char *root(void) {
    const char *d = getenv("KDT_MODEL_FIXTURES");
    return d && *d ? d : "tests/fixtures/model";
}

static const void *get(const kdt_kdtr *k, const char *name, uint64_t *numel) {
    kdt_tensor_view v;
    if (kdt_kdtr_find(k, name, &v) != KDT_OK) return NULL;
    if (numel) *numel = v.numel;
    return v.data;
}

/* Bitwise float equality that also takes NaN == NaN; returns the first differing index or -1. */
static int64_t first_diff(const float *a, const float *b, uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4) != 0 && !(isnan(a[i]) && isnan(b[i]))) return (int64_t)i;
    return -1;
}

static void check_unpack(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/../quant/unpack.kdtr", root());
    kdt_kdtr *k = NULL;
    if (kdt_kdtr_open_file(path, &k) != KDT_OK) { kt_fail("unpack: %s", kdt_last_error()); return; }
    uint64_t nv, nd, nc, ns;
    const int8_t *vals = get(k, "int4.values", &nv);
    const float *deq = get(k, "int4.dequant", &nd), *codes = get(k, "fp8.codes", &nc);
    const void *packed = get(k, "int4.packed", NULL), *scale = get(k, "int4.scale", &ns);
    const void *fw = get(k, "fp8.weight", NULL), *fs = get(k, "fp8.scale_inv", NULL);
    const float *fdeq = get(k, "fp8.dequant", NULL);
    kdt_tensor_view fv;
    if (!vals || !deq || !codes || !packed || !scale || !fw || !fs || !fdeq || kdt_kdtr_find(k, "fp8.dequant", &fv) ||
        nv != 5 * 72 || ns != 5 * 3 || nc != 256) {
        kt_fail("unpack: bundle lacks a tensor or has other shapes (re-run python/make_quant_fixtures.py)");
        kdt_kdtr_close(k);
        return;
    }
    /* With unit scales the dequantized values are the packed integers themselves: nibble order and offset. */
    uint16_t ones[15];
    for (int i = 0; i < 15; i++) ones[i] = 0x3F80;
    float got[5 * 72], want[5 * 72];
    kdt_dequant_int4(packed, ones, 5, 72, 32, got);
    for (int i = 0; i < 5 * 72; i++) want[i] = vals[i];
    int64_t d = first_diff(got, want, 5 * 72);
    kt_check(d < 0, "int4 unpack: the values of compressed-tensors' pack_to_int32 (low nibble first, offset 8) %s",
             d < 0 ? "come back exactly" : "differ");
    kdt_dequant_int4(packed, scale, 5, 72, 32, got);
    d = first_diff(got, deq, 5 * 72);
    kt_check(d < 0, "int4 dequant: bf16 group scales of 32 (a partial group of 8 included) bit-exact%s", d < 0 ? "" : " (differs)");
    int bad = 0;
    for (int i = 0; i < 256; i++) bad += first_diff((float[]){kdt_fp8_e4m3_to_f32((uint8_t)i)}, &codes[i], 1) >= 0;
    kt_check(!bad, "fp8 e4m3: all 256 codes as torch.float8_e4m3fn decodes them (%d differ)", bad);
    const int64_t R = (int64_t)fv.dims[0], C = (int64_t)fv.dims[1];
    float *fg = malloc((size_t)(R * C) * sizeof(float));
    kdt_dequant_fp8(fw, fs, R, C, 128, 128, fg);
    d = first_diff(fg, fdeq, (uint64_t)(R * C));
    kt_check(d < 0, "fp8 dequant [%lld, %lld]: 128x128 block scales with partial edge blocks bit-exact%s", (long long)R,
             (long long)C, d < 0 ? "" : " (differs)");
    free(fg);
    kdt_kdtr_close(k);
}

static void check_ignore(void) {
    const char *json = "{\"text_config\": {\"quantization_config\": {\"quant_method\": \"compressed-tensors\","
                       "\"format\": \"pack-quantized\", \"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"],"
                       "\"weights\": {\"num_bits\": 4, \"type\": \"int\", \"symmetric\": true, \"strategy\": \"group\","
                       "\"group_size\": 32, \"dynamic\": false}}}, \"ignore\": [\"lm_head\", \"re:.*self_attn.*\","
                       "\"re:.*mlp\\\\.(gate|up|gate_up|down)_proj.*\", \"re:vision\"]}}}";
    cJSON *r = cJSON_Parse(json);
    kdt_ckpt_format f;
    kdt_status s = kdt_ckpt_format_parse(r, "cfg", &f);
    cJSON_Delete(r);
    if (s != KDT_OK) { kt_fail("ignore list: %s", kdt_last_error()); return; }
    static const struct { const char *name; int ignored; } cases[] = {
        {"lm_head", 1}, {"language_model.lm_head", 0}, {"language_model.model.layers.0.self_attn.kv_b_proj", 1},
        {"language_model.model.layers.0.mlp.down_proj", 1}, {"language_model.model.layers.1.mlp.experts.7.down_proj", 0},
        {"language_model.model.layers.1.mlp.shared_experts.up_proj", 0}, {"vision_tower.x", 1}, {"x.vision", 0},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) bad += kdt_ckpt_ignored(&f, cases[i].name) != cases[i].ignored;
    kt_check(!bad && !strcmp(f.prefix, "language_model.") && f.group == 32,
             "ignore list as compressed-tensors matches it (exact names; re: from the start, as re.match): %d of 8 differ", bad);
    kdt_ckpt_format_free(&f);
}

/* One forward over prompt + continuation; logits [n, V] (malloc'd). */
static float *all_logits(const char *dir, const int32_t *tok, int32_t n, int32_t *V) {
    kdt_model *m = NULL;
    kdt_cache *c = NULL;
    float *out = NULL;
    if (kdt_model_load(dir, KDT_BACKEND_CPU, &m) == KDT_OK && kdt_cache_create(m, 1, n, 0, &c) == KDT_OK) {
        *V = kdt_model_get_config(m)->vocab_size;
        out = malloc((size_t)n * *V * sizeof(float));
        int32_t req = 0;
        kdt_batch b = {.B = 1, .req = &req, .n_rows = &n, .tokens = tok, .logits_rows = KDT_LOGITS_ALL};
        if (kdt_model_forward(m, c, &b, out, NULL, NULL) != KDT_OK) { free(out); out = NULL; }
    }
    if (!out) kt_fail("%s: %s", dir, kdt_last_error());
    kdt_cache_free(c);
    kdt_model_free(m);
    return out;
}

static void check_twin(const char *name) {
    char dir[1024], twin[1100], path[1100];
    snprintf(dir, sizeof dir, "%s/%s", root(), name);
    snprintf(twin, sizeof twin, "%s/twin", dir);
    snprintf(path, sizeof path, "%s/expected.kdtr", dir);
    kdt_kdtr *k = NULL;
    uint64_t np, nc;
    const int32_t *p = NULL, *cont = NULL;
    if (kdt_kdtr_open_file(path, &k) == KDT_OK) { p = get(k, "prompt", &np); cont = get(k, "continuation", &nc); }
    if (!p || !cont) { kt_fail("%s: expected.kdtr: %s", name, kdt_last_error()); kdt_kdtr_close(k); return; }
    const int32_t n = (int32_t)(np + nc);
    int32_t *tok = malloc((size_t)n * sizeof *tok), V = 0, V2 = 0;
    memcpy(tok, p, np * 4);
    memcpy(tok + np, cont, nc * 4);
    float *a = all_logits(dir, tok, n, &V), *b = all_logits(twin, tok, n, &V2);
    if (a && b)
        kt_check(V == V2 && first_diff(a, b, (uint64_t)n * V) < 0,
                 "%s: CPU logits of %d rows equal the dequantized twin's bit for bit", name, n);
    free(a); free(b); free(tok);
    kdt_kdtr_close(k);
}

/* ---- broken checkpoints: a copy of a fixture with one edit, which must fail naming `needle` ---- */

/* Sets field `key` of tensor `tensor` in a safetensors header to the JSON `value`; with key NULL,
 * renames the tensor to `value`. The data region stays. */
static int edit_tensor(const char *path, const char *tensor, const char *key, const char *value) {
    char *b = NULL;
    size_t len;
    uint64_t n;
    cJSON *h = kt_st_header(path, &b, &len, &n), *t = h ? cJSON_DetachItemFromObjectCaseSensitive(h, tensor) : NULL;
    if (!t) { cJSON_Delete(h); free(b); return 0; }
    if (key) cJSON_ReplaceItemInObject(t, key, cJSON_Parse(value));
    cJSON_AddItemToObject(h, key ? tensor : value, t);
    int ok = kt_st_rewrite(path, h, b, len, n);
    cJSON_Delete(h);
    free(b);
    return ok;
}

/* Overwrites 8 bytes at byte `at` of tensor `tensor`'s data. */
static int poke_tensor(const char *path, const char *tensor, size_t at, int64_t value) {
    char *b = NULL;
    size_t len;
    uint64_t n;
    cJSON *h = kt_st_header(path, &b, &len, &n);
    if (!h) return 0;
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(h, tensor), "data_offsets");
    const size_t off = cJSON_IsArray(o) ? (size_t)cJSON_GetArrayItem(o, 0)->valuedouble : len;
    int ok = 8 + n + off + at + 8 <= len;
    if (ok) memcpy(b + 8 + n + off + at, &value, 8);
    ok = ok && kt_spit(path, b, len);
    cJSON_Delete(h);
    free(b);
    return ok;
}

static char tmp[256];

static int fresh(const char *name) {
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s/%s' '%s'", tmp, root(), name, tmp);
    return system(cmd) == 0;
}

static void expect_fail(int edited, const char *what, const char *needle) {
    kdt_model *m = NULL;
    kdt_status s = edited ? kdt_model_load(tmp, KDT_BACKEND_CPU, &m) : KDT_ERR_IO;
    const char *msg = edited ? kdt_last_error() : "(the edit failed)";
    kt_check(s != KDT_OK && !m && strstr(msg, needle), "broken quantized checkpoint (%s) is refused naming '%s': %s", what,
             needle, s == KDT_OK ? "(loaded!)" : msg);
    kdt_model_free(m);
}

#define FP8_ST "/model.safetensors"
#define QA "model.layers.0.self_attn.q_a_proj"
#define DOWN "model.layers.0.mlp.down_proj" /* [32, 160]: two column blocks */
#define INT4_ST "/model-00001-of-00002.safetensors"
#define EXP "language_model.model.layers.1.mlp.experts.2.up_proj"

static void check_broken(void) {
    char st[400];
    snprintf(tmp, sizeof tmp, "/tmp/kdt_test_quant_%d", (int)getpid());
    snprintf(st, sizeof st, "%s" FP8_ST, tmp);
    expect_fail(fresh("fp8") && edit_tensor(st, QA ".weight_scale_inv", NULL, "unused.weight_scale_inv"), "fp8: scale missing",
                QA ".weight_scale_inv");
    expect_fail(fresh("fp8") && edit_tensor(st, DOWN ".weight_scale_inv", "shape", "[2, 1]"), "fp8: scale shape [2, 1] for [1, 2]",
                DOWN ".weight_scale_inv' has shape [2, 1], expected [1, 2]");
    expect_fail(fresh("fp8") && edit_tensor(st, QA ".weight_scale_inv", "dtype", "\"I32\""), "fp8: scale dtype", "expected F32");
    expect_fail(fresh("fp8") && kt_edit_config(tmp, "quantization_config.fmt", "\"e5m2\""), "fp8: fmt", "'fmt'");
    expect_fail(fresh("fp8") && kt_edit_config(tmp, "quantization_config.quant_method", "\"awq\""), "unknown method", "'quant_method'");
    expect_fail(fresh("fp8") && kt_edit_config(tmp, "quantization_config", NULL), "F8 weights, no quantization_config",
                QA ".weight' is F8_E4M3");
    snprintf(st, sizeof st, "%s" INT4_ST, tmp);
    expect_fail(fresh("int4_k26") && edit_tensor(st, EXP ".weight_packed", "dtype", "\"F32\""), "int4: packed dtype",
                EXP ".weight_packed' has dtype F32");
    expect_fail(fresh("int4_k26") && edit_tensor(st, EXP ".weight_scale", "dtype", "\"F16\""), "int4: scale dtype",
                EXP ".weight_scale' has dtype F16");
    expect_fail(fresh("int4_k26") && edit_tensor(st, EXP ".weight_shape", "dtype", "\"F64\""), "int4: shape dtype", EXP ".weight_shape");
    expect_fail(fresh("int4_k26") && poke_tensor(st, EXP ".weight_shape", 8, 33), "int4: weight_shape [32, 33] for [32, 64]",
                EXP ".weight_shape' holds [32, 33], expected [32, 64]");
    expect_fail(fresh("int4_k26") && kt_edit_config(tmp, "text_config.quantization_config.ignore", "[\"re:.*lm_head.*\"]"),
                "int4: attention not ignored, stored bf16", "self_attn.q_a_proj.weight_packed' is missing");
    expect_fail(fresh("int4_k26") && kt_edit_config(tmp, "text_config.quantization_config.ignore", "[\"re:(\"]"), "int4: bad pattern",
                "does not compile");
    expect_fail(fresh("int4_k26") && kt_edit_config(tmp, "text_config.quantization_config.format", "\"marlin-24\""), "int4: format",
                "'format'");
    expect_fail(fresh("int4_k26") && kt_edit_config(tmp, "text_config.quantization_config.config_groups.group_0.weights.num_bits", "8"),
                "int4: 8 bits", "'num_bits'");
    expect_fail(fresh("int4_k26") && kt_edit_config(tmp, "architectures", "[\"LlavaForConditionalGeneration\"]"), "nested: architecture",
                "'architectures'");
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) kt_fail("could not remove %s", tmp);
}

/* The families' config fields (docs/interfaces.md section 4). */
static void check_family_configs(void) {
    static const struct { const char *what, *json, *needle; } cases[] = {
        {"DeepSeek-V2 greedy softmax", "\"architectures\": [\"DeepseekV2ForCausalLM\"], \"scoring_func\": \"softmax\", "
         "\"topk_method\": \"greedy\"", NULL},
        {"DeepSeek-V2 group_limited_greedy", "\"scoring_func\": \"softmax\", \"topk_method\": \"group_limited_greedy\"", NULL},
        {"sigmoid with greedy", "\"scoring_func\": \"sigmoid\", \"topk_method\": \"greedy\"", "field 'scoring_func'"},
        {"GLM mlp_layer_types", "\"architectures\": [\"Glm4MoeLiteForCausalLM\"], \"mlp_layer_types\": [\"dense\", \"sparse\"]", NULL},
        {"mlp_layer_types of another length", "\"mlp_layer_types\": [\"dense\"]", "field 'mlp_layer_types'"},
        {"dense after sparse", "\"mlp_layer_types\": [\"sparse\", \"dense\"]", "a dense layer (1) after a sparse one"},
        {"mlp_layer_types against first_k_dense_replace", "\"mlp_layer_types\": [\"dense\", \"dense\"]", "first_k_dense_replace says 1"},
        {"unknown architecture", "\"architectures\": [\"LlamaForCausalLM\"]", "field 'architectures'"},
    };
    const char *base = "\"vocab_size\": 96, \"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
                       "\"q_lora_rank\": null, \"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 8,"
                       "\"v_head_dim\": 8, \"n_routed_experts\": 8, \"n_group\": 1, \"topk_group\": 1, \"num_experts_per_tok\": 2,"
                       "\"first_k_dense_replace\": 1";
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[2048];
        snprintf(json, sizeof json, "{%s, %s}", base, cases[i].json);
        kdt_model_config c;
        kdt_status s = kdt_model_config_parse(json, strlen(json), "cfg", &c);
        if (!cases[i].needle)
            kt_check(s == KDT_OK, "config %s: accepted (softmax %d, topk_method %d, dense layers %d)%s", cases[i].what, c.router_softmax,
                     c.topk_method, c.first_k_dense_replace, s == KDT_OK ? "" : kdt_last_error());
        else
            kt_check(s != KDT_OK && strstr(kdt_last_error(), cases[i].needle), "config %s: refused naming '%s': %s", cases[i].what,
                     cases[i].needle, s == KDT_OK ? "(accepted!)" : kdt_last_error());
    }
    /* Nested: text_config holds the model (and here, the quantization_config sits at the top). */
    char json[2048];
    snprintf(json, sizeof json, "{\"architectures\": [\"KimiK25ForConditionalGeneration\"], \"text_config\": {%s}, "
             "\"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"weight_block_size\": [128, 64]}}", base);
    kdt_model_config c;
    kdt_ckpt_format f;
    cJSON *r = cJSON_Parse(json);
    kdt_status s = kdt_model_config_parse(json, strlen(json), "cfg", &c);
    if (s == KDT_OK) s = kdt_ckpt_format_parse(r, "cfg", &f);
    kt_check(s == KDT_OK && c.hidden_size == 32 && f.quant == KDT_QUANT_FP8 && f.block_n == 128 && f.block_k == 64 &&
             !strcmp(f.prefix, "language_model."),
             "nested config: text_config parsed, top-level quantization_config found, prefix language_model.%s",
             s == KDT_OK ? "" : kdt_last_error());
    if (s == KDT_OK) kdt_ckpt_format_free(&f);
    cJSON_Delete(r);
}

int main(void) {
    check_family_configs();
    check_unpack();
    check_ignore();
    check_twin("fp8");
    check_twin("int4_k26");
    check_broken();
    return kt_exit_code();
}
