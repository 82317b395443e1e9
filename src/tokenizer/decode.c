/* Decoding: ids -> bytes -> UTF-8 with U+FFFD for each maximal invalid subpart (Unicode's
 * "substitution of maximal subparts", what Python and Rust do), whole or streamed. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/internal.h"

int tok_utf8_step(const uint8_t *p, size_t n) {
    const uint8_t b = p[0];
    if (b < 0x80) return 1;
    int len;
    uint8_t lo = 0x80, hi = 0xBF; /* range of the second byte */
    if (b >= 0xC2 && b <= 0xDF) len = 2;
    else if (b >= 0xE0 && b <= 0xEF) len = 3, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
    else if (b >= 0xF0 && b <= 0xF4) len = 4, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
    else return -1;
    for (int k = 1; k < len; k++) {
        if ((size_t)k == n) return 0;
        if (p[k] < (k == 1 ? lo : 0x80) || p[k] > (k == 1 ? hi : 0xBF)) return -k;
    }
    return len;
}

size_t tok_utf8_check(const uint8_t *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) { i++; continue; }
        int k = tok_utf8_step(p + i, n - i);
        if (k <= 0) return i;
        i += (size_t)k;
    }
    return n;
}

/* Converts p[0 .. n) into valid UTF-8 at out (room for 3 * n bytes), U+FFFD for invalid bytes.
 * Unless final, an incomplete character at the end is left unconsumed. Returns bytes written and
 * sets *used to the bytes consumed. */
static size_t lossy(const uint8_t *p, size_t n, int final, char *out, size_t *used) {
    size_t i = 0, o = 0;
    while (i < n) {
        int k = tok_utf8_step(p + i, n - i);
        if (k > 0) {
            memcpy(out + o, p + i, (size_t)k);
            o += (size_t)k, i += (size_t)k;
            continue;
        }
        if (k == 0 && !final) break;
        memcpy(out + o, "\xEF\xBF\xBD", 3);
        o += 3;
        i += k == 0 ? n - i : (size_t)-k;
    }
    *used = i;
    return o;
}

static kdt_status token_bytes(const kdt_tokenizer *t, int32_t id, size_t at, const char **p, size_t *n) {
    if (id < 0 || id >= t->n_ids || t->tok_len[id] == UINT32_MAX)
        return kdt_fail(KDT_ERR_INVALID_ARG, "decode: id %d at position %zu is not a token (vocabulary size %d)", id, at,
                        t->n_ids);
    *p = t->arena + t->tok_off[id];
    *n = t->tok_len[id];
    return KDT_OK;
}

kdt_status kdt_tokenizer_decode(const kdt_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len) {
    if (!t || (!ids && n) || !text || !len) return kdt_fail(KDT_ERR_INVALID_ARG, "decode: NULL argument");
    *text = NULL, *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t k;
        kdt_status s = token_bytes(t, ids[i], i, &p, &k);
        if (s != KDT_OK) return s;
        total += k;
    }
    char *raw = malloc(total + 1), *out = malloc(3 * total + 1);
    if (!raw || !out) {
        free(raw), free(out);
        return kdt_fail(KDT_ERR_NOMEM, "decode: out of memory");
    }
    size_t o = 0, used;
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t k;
        token_bytes(t, ids[i], i, &p, &k);
        memcpy(raw + o, p, k);
        o += k;
    }
    *len = lossy((const uint8_t *)raw, total, 1, out, &used);
    out[*len] = 0;
    free(raw);
    *text = out;
    return KDT_OK;
}

/* ---- streaming ---- */

struct kdt_detok_stream {
    const kdt_tokenizer *t;
    uint8_t *held;  /* bytes of an incomplete character, at most 3, then the new token's */
    size_t n_held, cap_held;
    char *out;
    size_t cap_out;
};

kdt_status kdt_detok_stream_create(const kdt_tokenizer *t, kdt_detok_stream **out) {
    if (!t || !out) return kdt_fail(KDT_ERR_INVALID_ARG, "detok stream: NULL argument");
    *out = calloc(1, sizeof **out);
    if (!*out) return kdt_fail(KDT_ERR_NOMEM, "detok stream: out of memory");
    (*out)->t = t;
    return KDT_OK;
}

static kdt_status drain(kdt_detok_stream *s, int final, const char **text, size_t *len) {
    if (3 * s->n_held + 1 > s->cap_out) {
        size_t cap = 3 * s->n_held + 64;
        char *o = realloc(s->out, cap);
        if (!o) return kdt_fail(KDT_ERR_NOMEM, "detok stream: out of memory");
        s->out = o, s->cap_out = cap;
    }
    size_t used;
    *len = lossy(s->held, s->n_held, final, s->out, &used);
    s->out[*len] = 0;
    memmove(s->held, s->held + used, s->n_held - used);
    s->n_held -= used;
    *text = s->out;
    return KDT_OK;
}

kdt_status kdt_detok_stream_push(kdt_detok_stream *s, int32_t id, const char **text, size_t *len) {
    if (!s || !text || !len) return kdt_fail(KDT_ERR_INVALID_ARG, "detok stream: NULL argument");
    *text = "", *len = 0;
    const char *p;
    size_t k;
    kdt_status st = token_bytes(s->t, id, 0, &p, &k);
    if (st != KDT_OK) return st;
    if (s->n_held + k > s->cap_held) {
        size_t cap = s->n_held + k + 64;
        uint8_t *h = realloc(s->held, cap);
        if (!h) return kdt_fail(KDT_ERR_NOMEM, "detok stream: out of memory");
        s->held = h, s->cap_held = cap;
    }
    memcpy(s->held + s->n_held, p, k);
    s->n_held += k;
    return drain(s, 0, text, len);
}

kdt_status kdt_detok_stream_flush(kdt_detok_stream *s, const char **text, size_t *len) {
    if (!s || !text || !len) return kdt_fail(KDT_ERR_INVALID_ARG, "detok stream: NULL argument");
    return drain(s, 1, text, len);
}

void kdt_detok_stream_free(kdt_detok_stream *s) {
    if (!s) return;
    free(s->held), free(s->out);
    free(s);
}
