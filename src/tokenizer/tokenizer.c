/* Loading (format dispatch, tokenizer_config.json), encoding (added tokens, regex splits, BPE)
 * and the getters. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tokenizer/internal.h"

kdt_status tok_read_file(const char *path, char **buf, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return kdt_fail(KDT_ERR_IO, "%s: cannot open", path);
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size < 0) {
        fclose(f);
        return kdt_fail(KDT_ERR_IO, "%s: cannot stat", path);
    }
    *buf = malloc((size_t)st.st_size + 1);
    if (!*buf) {
        fclose(f);
        return kdt_fail(KDT_ERR_NOMEM, "%s: out of memory", path);
    }
    *len = fread(*buf, 1, (size_t)st.st_size, f);
    int bad = *len != (size_t)st.st_size || ferror(f);
    fclose(f);
    if (bad) {
        free(*buf);
        return kdt_fail(KDT_ERR_IO, "%s: read failed", path);
    }
    (*buf)[*len] = 0;
    return KDT_OK;
}

kdt_status tok_add_special(kdt_tokenizer *t, const char *text, int32_t id, int lstrip, int rstrip) {
    size_t n = strlen(text);
    if (!n) return KDT_OK; /* an empty token can never be matched */
    tok_added *a = realloc(t->added, ((size_t)t->n_added + 1) * sizeof *a);
    if (!a) return kdt_fail(KDT_ERR_NOMEM, "tokenizer: out of memory");
    t->added = a;
    char *s = malloc(n + 1);
    if (!s) return kdt_fail(KDT_ERR_NOMEM, "tokenizer: out of memory");
    memcpy(s, text, n + 1);
    t->added[t->n_added++] = (tok_added){s, n, id, (uint8_t)lstrip, (uint8_t)rstrip};
    return KDT_OK;
}

/* First byte ascending, then longest first: the first hit at a position is the longest match. */
static int added_cmp(const void *x, const void *y) {
    const tok_added *a = x, *b = y;
    uint8_t ca = (uint8_t)a->text[0], cb = (uint8_t)b->text[0];
    if (ca != cb) return ca < cb ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static void index_added(kdt_tokenizer *t) {
    if (t->n_added) qsort(t->added, (size_t)t->n_added, sizeof *t->added, added_cmp);
    int32_t i = 0;
    for (int c = 0; c <= 256; c++) {
        t->added_first[c] = i;
        while (c < 256 && i < t->n_added && (uint8_t)t->added[i].text[0] == c) i++;
    }
}

/* A token in tokenizer_config.json: "text" or {"content": "text", ...}. */
static const char *config_token(const cJSON *j) {
    if (cJSON_IsString(j)) return j->valuestring;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

static kdt_status load_config(kdt_tokenizer *t, const char *path) {
    char *buf;
    size_t len;
    kdt_status s = tok_read_file(path, &buf, &len);
    if (s != KDT_OK) return s;
    cJSON *root = cJSON_ParseWithLength(buf, len);
    if (!root || !cJSON_IsObject(root)) {
        const char *e = cJSON_GetErrorPtr();
        s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: not a JSON object (error near byte %ld)", path,
                     root || !e ? 0L : (long)(e - buf));
        goto done;
    }
    const cJSON *j;
    if ((j = cJSON_GetObjectItemCaseSensitive(root, "add_bos_token")) && !cJSON_IsNull(j)) {
        if (!cJSON_IsBool(j)) { s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: add_bos_token is not true or false", path); goto done; }
        t->add_bos = cJSON_IsTrue(j);
    }
    const char *names[2] = {"bos_token", "eos_token"};
    int32_t *ids[2] = {&t->bos, &t->eos};
    for (int k = 0; k < 2; k++) {
        if (!(j = cJSON_GetObjectItemCaseSensitive(root, names[k])) || cJSON_IsNull(j)) continue;
        const char *tok = config_token(j);
        if (!tok) { s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: %s is neither a string nor {\"content\": ...}", path, names[k]); goto done; }
        *ids[k] = kdt_tokenizer_token_id(t, tok);
        if (*ids[k] < 0) { s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: %s '%s' is not a token", path, names[k], tok); goto done; }
    }
    if ((j = cJSON_GetObjectItemCaseSensitive(root, "chat_template")) && !cJSON_IsNull(j)) {
        const char *tmpl = cJSON_IsString(j) ? j->valuestring : NULL;
        if (cJSON_IsArray(j)) { /* [{"name": ..., "template": ...}]: "default", else the first */
            const cJSON *e;
            cJSON_ArrayForEach(e, j) {
                const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "name"), *v = cJSON_GetObjectItemCaseSensitive(e, "template");
                if (!cJSON_IsString(v)) continue;
                if (!tmpl || (cJSON_IsString(n) && strcmp(n->valuestring, "default") == 0)) tmpl = v->valuestring;
            }
        }
        if (!tmpl) { s = kdt_fail(KDT_ERR_INVALID_ARG, "%s: chat_template is neither a string nor a list of templates", path); goto done; }
        if (!(t->chat_template = strdup(tmpl))) s = kdt_fail(KDT_ERR_NOMEM, "%s: out of memory", path);
    }
done:
    cJSON_Delete(root);
    free(buf);
    return s;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

kdt_status kdt_tokenizer_load(const char *dir, kdt_tokenizer **out) {
    if (!dir || !out) return kdt_fail(KDT_ERR_INVALID_ARG, "tokenizer: NULL argument");
    *out = NULL;
    kdt_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return kdt_fail(KDT_ERR_NOMEM, "tokenizer: out of memory");
    t->bos = t->eos = -1;
    size_t n = strlen(dir) + 32;
    char *json = malloc(n), *tik = malloc(n), *cfg = malloc(n);
    kdt_status s = KDT_OK;
    if (!json || !tik || !cfg) { s = kdt_fail(KDT_ERR_NOMEM, "tokenizer: out of memory"); goto done; }
    snprintf(json, n, "%s/tokenizer.json", dir);
    snprintf(tik, n, "%s/tiktoken.model", dir);
    snprintf(cfg, n, "%s/tokenizer_config.json", dir);
    if (file_exists(json)) s = tok_load_hf(t, json);
    else if (file_exists(tik)) {
        if (!file_exists(cfg)) s = kdt_fail(KDT_ERR_NOT_FOUND, "%s: tiktoken.model needs tokenizer_config.json beside it (its special tokens)", dir);
        else s = tok_load_tiktoken(t, tik, cfg);
    } else s = kdt_fail(KDT_ERR_NOT_FOUND, "%s: no tokenizer.json or tiktoken.model", dir);
    if (s == KDT_OK) index_added(t);
    if (s == KDT_OK && file_exists(cfg)) s = load_config(t, cfg);
done:
    free(json), free(tik), free(cfg);
    if (s != KDT_OK) kdt_tokenizer_free(t);
    else *out = t;
    return s;
}

void kdt_tokenizer_free(kdt_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_split; i++) pcre2_code_free(t->split[i]);
    for (int32_t i = 0; i < t->n_added; i++) free(t->added[i].text);
    free(t->added), free(t->arena), free(t->tok_off), free(t->tok_len), free(t->vslot), free(t->pairs);
    free(t->chat_template);
    free(t);
}

/* ---- encoding ---- */

typedef struct enc {
    const kdt_tokenizer *t;
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
    tok_scratch *sc;
    tok_ids ids;
} enc;

/* Splits p[0 .. n) with split `level` and the ones after it, then BPE on each piece. */
static kdt_status split(enc *e, int level, const uint8_t *p, size_t n) {
    if (level == e->t->n_split) return tok_bpe(e->t, p, n, e->sc, &e->ids);
    const pcre2_code *re = e->t->split[level];
    const int keep_gaps = e->t->keep_gaps;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
    size_t off = 0, prev = 0;
    kdt_status s;
    while (off < n) {
        int rc = pcre2_match(re, p, n, off, PCRE2_NO_UTF_CHECK, e->md, e->mc);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            char msg[160];
            pcre2_get_error_message(rc, (PCRE2_UCHAR *)msg, sizeof msg);
            return kdt_fail(KDT_ERR_INTERNAL, "encode: split %d failed: %s", level, msg);
        }
        const size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* an empty match makes no piece; step over one character */
            off = ms + 1;
            while (off < n && (p[off] & 0xC0) == 0x80) off++;
            continue;
        }
        if (keep_gaps && ms > prev && (s = split(e, level + 1, p + prev, ms - prev)) != KDT_OK) return s;
        if ((s = split(e, level + 1, p + ms, me - ms)) != KDT_OK) return s;
        prev = off = me;
    }
    if (keep_gaps && prev < n) return split(e, level + 1, p + prev, n - prev);
    return KDT_OK;
}

/* Byte length of the character at p[0 .. n) when it is White_Space (what lstrip / rstrip
 * swallow, as Rust's char::is_whitespace), else 0. */
static size_t space_at(const uint8_t *p, size_t n) {
    int k = tok_utf8_step(p, n);
    if (k <= 0) return 0;
    uint32_t c = k == 1 ? p[0] : k == 2 ? (uint32_t)(p[0] & 0x1F) << 6 | (p[1] & 0x3F)
                 : k == 3 ? (uint32_t)(p[0] & 0x0F) << 12 | (uint32_t)(p[1] & 0x3F) << 6 | (p[2] & 0x3F) : 0;
    int ws = (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
             c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
    return ws ? (size_t)k : 0;
}

/* Byte length of the White_Space character that ends just before p[lo] (lo > start; the text
 * is valid UTF-8), else 0. */
static size_t space_before(const uint8_t *p, size_t start, size_t lo) {
    size_t b = lo - 1;
    while (b > start && (p[b] & 0xC0) == 0x80) b--;
    return space_at(p + b, lo - b) == lo - b ? lo - b : 0;
}

/* The added token matched at p (the longest), or NULL. */
static const tok_added *added_at(const kdt_tokenizer *t, const uint8_t *p, size_t n) {
    for (int32_t i = t->added_first[p[0]]; i < t->added_first[p[0] + 1]; i++) {
        const tok_added *a = &t->added[i];
        if (a->len <= n && memcmp(a->text, p, a->len) == 0) return a;
    }
    return NULL;
}

static kdt_status encode_text(enc *e, const uint8_t *p, size_t n) {
    const kdt_tokenizer *t = e->t;
    size_t start = 0, i = 0;
    kdt_status s;
    while (i < n) {
        const tok_added *a = t->added_first[p[i]] < t->added_first[p[i] + 1] ? added_at(t, p + i, n - i) : NULL;
        if (!a) { i++; continue; }
        size_t lo = i, hi = i + a->len;
        size_t k;
        while (a->lstrip && lo > start && (k = space_before(p, start, lo))) lo -= k;
        while (a->rstrip && hi < n && (k = space_at(p + hi, n - hi))) hi += k;
        if (lo > start && (s = split(e, 0, p + start, lo - start)) != KDT_OK) return s;
        if (tok_ids_push(&e->ids, a->id)) return kdt_fail(KDT_ERR_NOMEM, "encode: out of memory");
        start = i = hi;
    }
    return start < n ? split(e, 0, p + start, n - start) : KDT_OK;
}

kdt_status kdt_tokenizer_encode(const kdt_tokenizer *t, const char *text, size_t len, int add_special, int32_t **ids,
                                size_t *n_ids) {
    if (!t || (!text && len) || !ids || !n_ids) return kdt_fail(KDT_ERR_INVALID_ARG, "encode: NULL argument");
    *ids = NULL, *n_ids = 0;
    const uint8_t *p = (const uint8_t *)(text ? text : "");
    size_t bad = tok_utf8_check(p, len);
    if (bad < len) return kdt_fail(KDT_ERR_INVALID_ARG, "encode: text is not valid UTF-8 at byte offset %zu (byte 0x%02X)", bad, p[bad]);
    enc e = {.t = t};
    kdt_status s = KDT_OK;
    e.md = pcre2_match_data_create(1, NULL);
    e.mc = pcre2_match_context_create(NULL);
    e.js = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, NULL);
    e.sc = tok_scratch_new();
    if (!e.md || !e.mc || !e.js || !e.sc) s = kdt_fail(KDT_ERR_NOMEM, "encode: out of memory");
    if (s == KDT_OK) {
        pcre2_jit_stack_assign(e.mc, NULL, e.js);
        if (add_special && t->add_bos && t->bos >= 0 && tok_ids_push(&e.ids, t->bos)) s = kdt_fail(KDT_ERR_NOMEM, "encode: out of memory");
    }
    if (s == KDT_OK) s = encode_text(&e, p, len);
    pcre2_match_data_free(e.md);
    pcre2_match_context_free(e.mc);
    pcre2_jit_stack_free(e.js);
    tok_scratch_free(e.sc);
    if (s != KDT_OK) {
        free(e.ids.v);
        return s;
    }
    *ids = e.ids.v ? e.ids.v : malloc(sizeof(int32_t)); /* never NULL on success */
    if (!*ids) return kdt_fail(KDT_ERR_NOMEM, "encode: out of memory");
    *n_ids = e.ids.n;
    return KDT_OK;
}

/* ---- getters ---- */

int32_t kdt_tokenizer_vocab_size(const kdt_tokenizer *t) { return t ? t->n_ids : 0; }
int32_t kdt_tokenizer_bos_id(const kdt_tokenizer *t) { return t ? t->bos : -1; }
int32_t kdt_tokenizer_eos_id(const kdt_tokenizer *t) { return t ? t->eos : -1; }
const char *kdt_tokenizer_chat_template(const kdt_tokenizer *t) { return t ? t->chat_template : NULL; }

/* Added tokens by their text; then the model vocabulary: for tokenizer.json the token as the file
 * spells it (byte-level characters, "Ġthe"), for tiktoken its bytes. */
int32_t kdt_tokenizer_token_id(const kdt_tokenizer *t, const char *token) {
    if (!t || !token) return -1;
    size_t n = strlen(token);
    for (int32_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && memcmp(t->added[i].text, token, n) == 0) return t->added[i].id;
    if (!t->byte_level) return tok_vocab_find(t, token, n);
    uint8_t *b = malloc(n + 1);
    if (!b) return -1;
    long k = tok_bytelevel_decode(token, n, b);
    int32_t id = k >= 0 ? tok_vocab_find(t, b, (size_t)k) : -1;
    free(b);
    return id;
}
