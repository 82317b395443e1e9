/* tiktoken.model (one "base64-token rank" per line, the rank being the id) with the special tokens
 * of tokenizer_config.json's added_tokens_decoder, as Kimi K2 ships them. tiktoken merges any two
 * adjacent parts whose concatenation is a token, lowest rank first: the merge table holds, for
 * every token, each split of it into two tokens. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/internal.h"

/* Kimi K2's split (tokenization_kimi.py), written with class intersection as the `regex` crate
 * reads it (tok_compile translates it into PCRE2). */
static const char KIMI_PATTERN[] =
    "[\\p{Han}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static int b64_value(uint8_t c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Standard base64 with padding; -1 on a bad character or length. */
static long b64_decode(const char *s, size_t n, uint8_t *out) {
    if (n % 4) return -1;
    long k = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4], pad = 0;
        for (int j = 0; j < 4; j++) {
            if (s[i + j] == '=' && i + 4 == n && j >= 2) { v[j] = 0, pad++; continue; }
            if (pad || (v[j] = b64_value((uint8_t)s[i + j])) < 0) return -1;
        }
        uint32_t x = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        out[k++] = (uint8_t)(x >> 16);
        if (pad < 2) out[k++] = (uint8_t)(x >> 8);
        if (pad < 1) out[k++] = (uint8_t)x;
    }
    return k;
}

typedef struct line { const char *tok; size_t tok_len; long rank; } line;

static kdt_status read_model(const char *path, char *text, size_t len, line **lines, size_t *n_lines, long *max_rank) {
    size_t cap = 1024, n = 0, no = 0;
    line *v = malloc(cap * sizeof *v);
    if (!v) return kdt_fail(KDT_ERR_NOMEM, "%s: out of memory", path);
    *max_rank = -1;
    for (char *p = text, *end = text + len; p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p)), *eol = nl ? nl : end;
        no++;
        if (eol > p && eol[-1] == '\r') eol[-1] = 0;
        *eol = 0;
        if (*p) {
            char *sp = strchr(p, ' '), *rend;
            long r = sp ? strtol(sp + 1, &rend, 10) : -1;
            if (!sp || sp == p || rend == sp + 1 || *rend || r < 0 || r >= INT32_MAX) {
                free(v);
                return kdt_fail(KDT_ERR_INVALID_ARG, "%s: line %zu is not \"base64-token rank\"", path, no);
            }
            if (n == cap) {
                line *g = realloc(v, 2 * cap * sizeof *v);
                if (!g) { free(v); return kdt_fail(KDT_ERR_NOMEM, "%s: out of memory", path); }
                v = g, cap *= 2;
            }
            v[n++] = (line){p, (size_t)(sp - p), r};
            if (r > *max_rank) *max_rank = r;
        }
        p = eol + 1;
    }
    *lines = v, *n_lines = n;
    return KDT_OK;
}

/* The special tokens: added_tokens_decoder {"163584": {"content": "[BOS]", ...}, ...}. */
static kdt_status read_specials(kdt_tokenizer *t, const char *path, const cJSON *dec, long *max_id, int add) {
    const cJSON *e;
    cJSON_ArrayForEach(e, dec) {
        char *end;
        long id = strtol(e->string, &end, 10);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (*end || end == e->string || id < 0 || id >= INT32_MAX - 1 || !cJSON_IsString(c))
            return kdt_fail(KDT_ERR_INVALID_ARG, "%s: added_tokens_decoder['%s'] needs an id key and a content", path, e->string);
        if (!add) { if (id > *max_id) *max_id = id; continue; }
        kdt_status s = tok_vocab_set(t, (int32_t)id, c->valuestring, strlen(c->valuestring), 0);
        if (s == KDT_OK)
            s = tok_add_special(t, c->valuestring, (int32_t)id, cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "lstrip")),
                                cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "rstrip")));
        if (s != KDT_OK) return s;
    }
    return KDT_OK;
}

kdt_status tok_load_tiktoken(kdt_tokenizer *t, const char *path, const char *config_path) {
    char *text = NULL, *ctext = NULL;
    size_t len, clen, n = 0;
    line *lines = NULL;
    uint8_t *buf = NULL;
    cJSON *cfg = NULL;
    long max_id;
    kdt_status s = tok_read_file(path, &text, &len);
    if (s == KDT_OK) s = read_model(path, text, len, &lines, &n, &max_id);
    if (s == KDT_OK) s = tok_read_file(config_path, &ctext, &clen);
    if (s != KDT_OK) goto done;
    if (!(cfg = cJSON_ParseWithLength(ctext, clen)) || !cJSON_IsObject(cfg)) {
        s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: not a JSON object", config_path);
        goto done;
    }
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(cfg, "added_tokens_decoder");
    if (dec && !cJSON_IsObject(dec)) { s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: added_tokens_decoder is not an object", config_path); goto done; }
    if ((s = read_specials(t, config_path, dec, &max_id, 0)) != KDT_OK) goto done;
    if ((s = tok_vocab_init(t, n, (int32_t)max_id + 1)) != KDT_OK) goto done;
    size_t longest = 0;
    for (size_t i = 0; i < n; i++) longest = lines[i].tok_len > longest ? lines[i].tok_len : longest;
    if (!(buf = malloc(longest + 1))) { s = kdt_fail(KDT_ERR_NOMEM, "%s: out of memory", path); goto done; }
    size_t n_pairs = 0;
    for (size_t i = 0; i < n; i++) {
        long k = b64_decode(lines[i].tok, lines[i].tok_len, buf);
        if (k <= 0) { s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: token of rank %ld is not valid base64", path, lines[i].rank); goto done; }
        if (t->tok_len[lines[i].rank] != UINT32_MAX) { s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: rank %ld appears twice", path, lines[i].rank); goto done; }
        if ((s = tok_vocab_set(t, (int32_t)lines[i].rank, buf, (size_t)k, 1)) != KDT_OK) goto done;
        n_pairs += (size_t)k - 1;
    }
    if ((s = tok_pairs_init(t, n_pairs)) != KDT_OK) goto done;
    for (size_t i = 0; i < n; i++) {
        const int32_t id = (int32_t)lines[i].rank;
        const char *b = t->arena + t->tok_off[id];
        for (uint32_t k = 1; k < t->tok_len[id] && s == KDT_OK; k++) {
            int32_t l = tok_vocab_find(t, b, k), r = tok_vocab_find(t, b + k, t->tok_len[id] - k);
            if (l >= 0 && r >= 0) s = tok_pair_add(t, l, r, (uint32_t)id, id);
        }
    }
    if (s != KDT_OK || (s = read_specials(t, config_path, dec, &max_id, 1)) != KDT_OK) goto done;
    t->ignore_merges = 1; /* tiktoken: a piece that is a token is that token */
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(cfg, "pat_str");
    char where[600];
    snprintf(where, sizeof where, "%s: %s", config_path, cJSON_IsString(pat) ? "pat_str" : "Kimi K2's split pattern");
    s = tok_compile(t, cJSON_IsString(pat) ? pat->valuestring : KIMI_PATTERN, 0, where);
done:
    cJSON_Delete(cfg);
    free(text), free(ctext), free(lines), free(buf);
    return s;
}
