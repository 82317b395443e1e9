/* How a checkpoint stores its weights (docs/interfaces.md section 4): where the language model's tensors live
 * (K2.5 / K2.6 and Kimi-VL nest it under `language_model.`) and how its linears are quantized:
 * FP8 blocks (`quant_method: fp8`) or compressed-tensors `pack-quantized` INT4 groups, with the
 * `ignore` list of modules that stay in a float dtype. Also the exact dequantizers the CPU
 * backend runs at load. */
#pragma once

#include <cjson/cJSON.h>

#include "kdt/kdt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kdt_quant_method {
    KDT_QUANT_NONE = 0,
    KDT_QUANT_FP8 = 1,           /* X.weight F8_E4M3 [out, in], X.weight_scale_inv F32 [ceil(out/bn), ceil(in/bk)] */
    KDT_QUANT_INT4 = 2,          /* X.weight_packed I32 [out, ceil(in/8)], X.weight_scale BF16 [out, ceil(in/g)], X.weight_shape [2] */
} kdt_quant_method;

typedef struct kdt_ckpt_format {
    const char *prefix;          /* "" or "language_model.": prepended to every tensor name */
    kdt_quant_method quant;
    int32_t block_n, block_k;    /* FP8: a scale covers block_n rows x block_k columns */
    int32_t group;               /* INT4: a scale covers `group` consecutive inputs of a row */
    size_t n_ignore;
    char **ignore;               /* INT4: module names ("re:" patterns compiled in ignore_re) */
    void **ignore_re;            /* pcre2_code * per entry; NULL for exact names */
} kdt_ckpt_format;

/* The format from config.json's top-level object `root` (the same text kdt_model_config_parse
 * reads): quantization_config in text_config when the config nests one, else at the top. An
 * unknown quant_method, fmt, format, bit width, strategy or a bad pattern fails naming the field. */
kdt_status kdt_ckpt_format_parse(const cJSON *root, const char *what, kdt_ckpt_format *out);
void       kdt_ckpt_format_free(kdt_ckpt_format *f);
/* INT4: whether module `name` (full name, prefix included, no ".weight") is in the ignore list:
 * an exact entry equals it, a "re:" entry matches from its start (Python's re.match, as
 * compressed-tensors does). */
int        kdt_ckpt_ignored(const kdt_ckpt_format *f, const char *name);

/* OCP float8 e4m3fn (torch.float8_e4m3fn): bias 7, no infinities, 0x7f / 0xff NaN. Exact. */
float kdt_fp8_e4m3_to_f32(uint8_t v);
/* out[r, c] = e4m3(w[r, c]) * scale[r / bn, c / bk]; w [rows, cols] bytes, scale [ceil(rows/bn),
 * ceil(cols/bk)] f32 (read unaligned), out [rows, cols]. Exact in f32. */
void kdt_dequant_fp8(const void *w, const void *scale, int64_t rows, int64_t cols, int32_t bn, int32_t bk, float *out);
/* out[r, c] = (nibble(r, c) - 8) * bf16 scale[r, c / g]; packed: little-endian int32 words
 * [rows, ceil(cols/8)], value c of a row in bits 4 (c % 8) .. 4 (c % 8) + 3 of word c / 8 (low
 * nibble first, compressed-tensors' pack_to_int32); scale [rows, ceil(cols/g)] bf16. Exact. */
void kdt_dequant_int4(const void *packed, const void *scale, int64_t rows, int64_t cols, int32_t g, float *out);

#ifdef __cplusplus
}
#endif
