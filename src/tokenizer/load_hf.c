/* Hugging Face tokenizer.json, byte-level BPE: what is supported is what DeepSeek-V3, GLM and
 * GPT-2 style tokenizers use (docs/tokenizer.md); anything else fails naming the field. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/internal.h"

/* GPT-2's split, what a ByteLevel pre-tokenizer with use_regex applies. */
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

typedef struct hf {
    kdt_tokenizer *t;
    const char *path;
    uint8_t *buf; /* scratch for byte-level decoding of one token */
    size_t cap;
} hf;

static const char *str_of(const cJSON *o, const char *key) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(j) ? j->valuestring : NULL;
}

static int is_true(const cJSON *o, const char *key) { return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, key)); }

/* A field that must be absent, null, false or "" for this loader. */
static int unset(const cJSON *o, const char *key) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return !j || cJSON_IsNull(j) || cJSON_IsFalse(j) || (cJSON_IsString(j) && !j->valuestring[0]);
}

static kdt_status reserve(hf *h, size_t len) {
    if (len <= h->cap) return KDT_OK;
    uint8_t *p = realloc(h->buf, 2 * len);
    if (!p) return kdt_fail(KDT_ERR_NOMEM, "%s: out of memory", h->path);
    h->buf = p, h->cap = 2 * len;
    return KDT_OK;
}

/* A token's bytes: its byte-level characters mapped back, or its UTF-8 text when a character is
 * not one of the 256 (what the ByteLevel decoder does with such tokens). */
static kdt_status token_bytes(hf *h, const char *s, const uint8_t **b, size_t *n) {
    size_t len = strlen(s);
    if (reserve(h, len) != KDT_OK) return KDT_ERR_NOMEM;
    long k = tok_bytelevel_decode(s, len, h->buf);
    *b = k >= 0 ? h->buf : (const uint8_t *)s;
    *n = k >= 0 ? (size_t)k : len;
    return KDT_OK;
}

static kdt_status load_pre_tokenizer(hf *h, const cJSON *pt, int *has_bytelevel) {
    const char *type = str_of(pt, "type");
    if (type && strcmp(type, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers"), *e;
        if (!cJSON_IsArray(list)) return kdt_fail(KDT_ERR_INVALID_ARG, "%s: pre_tokenizer.pretokenizers is not a list", h->path);
        cJSON_ArrayForEach(e, list) {
            kdt_status s = load_pre_tokenizer(h, e, has_bytelevel);
            if (s != KDT_OK) return s;
        }
        return KDT_OK;
    }
    if (type && strcmp(type, "ByteLevel") == 0) {
        if (is_true(pt, "add_prefix_space"))
            return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: pre_tokenizer ByteLevel add_prefix_space true is not supported", h->path);
        *has_bytelevel = 1;
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(pt, "use_regex");
        return r && cJSON_IsFalse(r) ? KDT_OK : tok_compile(h->t, GPT2_PATTERN, 0, "ByteLevel's GPT-2 pattern");
    }
    if (type && strcmp(type, "Split") == 0) {
        const char *beh = str_of(pt, "behavior");
        if (!beh || strcmp(beh, "Isolated") != 0)
            return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: pre_tokenizer Split behavior '%s' is not supported (only Isolated)", h->path,
                            beh ? beh : "(missing)");
        if (is_true(pt, "invert")) return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: pre_tokenizer Split invert true is not supported", h->path);
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(pt, "pattern");
        const char *re = str_of(pat, "Regex"), *lit = str_of(pat, "String");
        if (!re && !lit) return kdt_fail(KDT_ERR_INVALID_ARG, "%s: pre_tokenizer Split pattern has neither Regex nor String", h->path);
        char where[600];
        snprintf(where, sizeof where, "%s: pre_tokenizer Split pattern", h->path);
        return tok_compile(h->t, re ? re : lit, !re, where);
    }
    return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: pre_tokenizer type '%s' is not supported (Sequence, Split, ByteLevel)", h->path,
                    type ? type : "(missing)");
}

static kdt_status check_normalizer(hf *h, const cJSON *n) {
    if (!n || cJSON_IsNull(n)) return KDT_OK;
    const char *type = str_of(n, "type");
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
    if (type && strcmp(type, "Sequence") == 0 && cJSON_IsArray(list) && cJSON_GetArraySize(list) == 0) return KDT_OK;
    return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: normalizer '%s' is not supported (none only)", h->path, type ? type : "(missing)");
}

/* BOS from a TemplateProcessing post-processor whose single template starts with a special token. */
static kdt_status load_post_processor(hf *h, const cJSON *pp, int32_t *bos) {
    if (!pp || cJSON_IsNull(pp)) return KDT_OK;
    const char *type = str_of(pp, "type");
    if (type && strcmp(type, "Sequence") == 0) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(pp, "processors")) {
            kdt_status s = load_post_processor(h, e, bos);
            if (s != KDT_OK) return s;
        }
        return KDT_OK;
    }
    if (type && strcmp(type, "ByteLevel") == 0) return KDT_OK; /* offsets only */
    if (!type || strcmp(type, "TemplateProcessing") != 0)
        return kdt_fail(KDT_ERR_UNSUPPORTED, "%s: post_processor '%s' is not supported (TemplateProcessing, ByteLevel)", h->path,
                        type ? type : "(missing)");
    const cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(pp, "single"), 0);
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(first, "SpecialToken");
    const char *name = str_of(sp, "id");
    if (!name) return KDT_OK;
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(pp, "special_tokens"), name), "ids");
    const cJSON *id = cJSON_GetArrayItem(ids, 0);
    if (!cJSON_IsNumber(id) || cJSON_GetArraySize(ids) != 1 || id->valuedouble < 0 || id->valuedouble >= h->t->n_ids)
        return kdt_fail(KDT_ERR_INVALID_ARG, "%s: post_processor.special_tokens['%s'].ids is not one token id", h->path, name);
    *bos = id->valueint;
    return KDT_OK;
}

static kdt_status load_merges(hf *h, const cJSON *merges) {
    kdt_tokenizer *t = h->t;
    kdt_status s = tok_pairs_init(t, (size_t)cJSON_GetArraySize(merges));
    size_t rank = 0;
    char *cat = NULL;
    size_t cat_cap = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges) {
        if (s != KDT_OK) break;
        const char *a = NULL, *b = NULL, *sp = NULL;
        if (cJSON_IsString(m) && (sp = strchr(m->valuestring, ' '))) a = m->valuestring, b = sp + 1;
        else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) && cJSON_IsString(m->child->next))
            a = m->child->valuestring, b = m->child->next->valuestring;
        if (!a) { s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: model.merges[%zu] is neither \"a b\" nor [a, b]", h->path, rank); break; }
        size_t na = sp ? (size_t)(sp - a) : strlen(a), nb = strlen(b);
        if (na + nb + 1 > cat_cap) {
            cat_cap = 2 * (na + nb + 1);
            char *c = realloc(cat, cat_cap);
            if (!c) { s = kdt_fail(KDT_ERR_NOMEM, "%s: out of memory", h->path); break; }
            cat = c;
        }
        if ((s = reserve(h, na + nb)) != KDT_OK) break;
        int32_t ids[3];
        const size_t lens[3] = {na, nb, na + nb};
        memcpy(cat, a, na);
        memcpy(cat + na, b, nb);
        const char *parts[3] = {a, b, cat};
        for (int k = 0; k < 3 && s == KDT_OK; k++) {
            long n = tok_bytelevel_decode(parts[k], lens[k], h->buf);
            ids[k] = n >= 0 ? tok_vocab_find(t, h->buf, (size_t)n) : -1;
            if (ids[k] < 0)
                s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: model.merges[%zu]: '%.*s' is not in model.vocab", h->path, rank, (int)lens[k],
                             parts[k]);
        }
        if (s == KDT_OK) s = tok_pair_add(t, ids[0], ids[1], (uint32_t)rank, ids[2]);
        rank++;
    }
    free(cat);
    return s;
}

kdt_status tok_load_hf(kdt_tokenizer *t, const char *path) {
    char *text;
    size_t len;
    kdt_status s = tok_read_file(path, &text, &len);
    if (s != KDT_OK) return s;
    hf h = {.t = t, .path = path};
    cJSON *root = cJSON_ParseWithLength(text, len);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), *e;
    const char *type = str_of(model, "type");
    if (!root) { s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: not valid JSON (error near byte %ld)", path, (long)(cJSON_GetErrorPtr() - text)); goto done; }
    if (type && strcmp(type, "BPE") != 0) { s = kdt_fail(KDT_ERR_UNSUPPORTED, "%s: model.type '%s' is not supported (BPE only)", path, type); goto done; }
    if (!cJSON_IsObject(vocab)) { s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: model.vocab is missing or not an object", path); goto done; }
    if (!cJSON_IsArray(merges)) { s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: model.merges is missing or not a list", path); goto done; }
    static const char *const unsupported[] = {"dropout", "continuing_subword_prefix", "end_of_word_suffix", "byte_fallback"};
    for (size_t k = 0; k < sizeof unsupported / sizeof *unsupported; k++)
        if (!unset(model, unsupported[k])) { s = kdt_fail(KDT_ERR_UNSUPPORTED, "%s: model.%s is set, which is not supported", path, unsupported[k]); goto done; }
    if (added && !cJSON_IsArray(added)) { s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: added_tokens is not a list", path); goto done; }
    /* ids: the largest of the vocabulary's and the added tokens' */
    double max_id = -1;
    size_t i = 0;
    cJSON_ArrayForEach(e, vocab) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > INT32_MAX - 1 || e->valuedouble != (double)e->valueint) {
            s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: model.vocab['%s'] is not a token id", path, e->string);
            goto done;
        }
        if (e->valuedouble > max_id) max_id = e->valuedouble;
        i++;
    }
    size_t a = 0;
    cJSON_ArrayForEach(e, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > INT32_MAX - 1 || !str_of(e, "content")) {
            s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: added_tokens[%zu] needs an id and a content", path, a);
            goto done;
        }
        if (is_true(e, "single_word")) {
            s = kdt_fail(KDT_ERR_UNSUPPORTED, "%s: added_tokens[%zu] ('%s'): single_word true is not supported", path, a, str_of(e, "content"));
            goto done;
        }
        if (id->valuedouble > max_id) max_id = id->valuedouble;
        a++;
    }
    if ((s = tok_vocab_init(t, i, (int32_t)max_id + 1)) != KDT_OK) goto done;
    t->byte_level = t->keep_gaps = 1;
    t->ignore_merges = is_true(model, "ignore_merges");
    cJSON_ArrayForEach(e, vocab) {
        const uint8_t *b;
        size_t n;
        if ((s = token_bytes(&h, e->string, &b, &n)) != KDT_OK) goto done;
        if ((s = tok_vocab_set(t, e->valueint, b, n, 1)) != KDT_OK) goto done;
    }
    if ((s = load_merges(&h, merges)) != KDT_OK) goto done;
    a = 0;
    cJSON_ArrayForEach(e, added) { /* decodes as the ByteLevel decoder does; matched as its text */
        const char *content = str_of(e, "content");
        const int32_t id = cJSON_GetObjectItemCaseSensitive(e, "id")->valueint;
        const uint8_t *b;
        size_t n;
        if ((s = token_bytes(&h, content, &b, &n)) != KDT_OK) goto done;
        if ((s = tok_vocab_set(t, id, b, n, 0)) != KDT_OK) goto done;
        if ((s = tok_add_special(t, content, id, is_true(e, "lstrip"), is_true(e, "rstrip"))) != KDT_OK) goto done;
    }
    if ((s = check_normalizer(&h, cJSON_GetObjectItemCaseSensitive(root, "normalizer"))) != KDT_OK) goto done;
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    int has_bytelevel = 0;
    if (pt && !cJSON_IsNull(pt) && (s = load_pre_tokenizer(&h, pt, &has_bytelevel)) != KDT_OK) goto done;
    if (!has_bytelevel) { s = kdt_fail(KDT_ERR_UNSUPPORTED, "%s: pre_tokenizer has no ByteLevel step (only byte-level BPE is supported)", path); goto done; }
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (dec && !cJSON_IsNull(dec) && (!str_of(dec, "type") || strcmp(str_of(dec, "type"), "ByteLevel") != 0)) {
        s = kdt_fail(KDT_ERR_UNSUPPORTED, "%s: decoder '%s' is not supported (ByteLevel only)", path, str_of(dec, "type") ? str_of(dec, "type") : "(missing)");
        goto done;
    }
    int32_t bos = -1;
    if ((s = load_post_processor(&h, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), &bos)) != KDT_OK) goto done;
    if (bos >= 0) t->bos = bos, t->add_bos = 1;
done:
    cJSON_Delete(root);
    free(text);
    free(h.buf);
    return s;
}
