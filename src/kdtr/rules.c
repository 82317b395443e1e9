/* docs/interfaces.md section 1 rules shared by the reader and writer, and the name index. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "kdtr/rules.h"

kdt_status kdtr_name_check(const unsigned char *s, size_t len, size_t *bad_at) {
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        size_t need;
        unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        if (c == 0) goto bad;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0) lo = 0xA0;      /* overlong */
            else if (c == 0xED) hi = 0x9F; /* surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0) lo = 0x90;      /* overlong */
            else if (c == 0xF4) hi = 0x8F; /* past U+10FFFF */
        } else goto bad;                   /* stray continuation, C0/C1 overlong, F5.. */
        if (len - i - 1 < need) goto bad;
        if (s[i + 1] < lo || s[i + 1] > hi) { i++; goto bad; }
        for (size_t k = 2; k <= need; k++)
            if ((s[i + k] & 0xC0) != 0x80) { i += k; goto bad; }
        i += need + 1;
    }
    return KDT_OK;
bad:
    *bad_at = i;
    return KDT_ERR_KDTR_NAME;
}

int kdtr_byte_count(const uint64_t *dims, int ndim, size_t esize, uint64_t *numel, uint64_t *nbytes) {
    uint64_t n = 1;
    for (int d = 0; d < ndim; d++)
        if (dims[d] == 0) n = 0;
    for (int d = 0; d < ndim && n; d++)
        if (!kdt_mul_u64(n, dims[d], &n)) return 0;
    if (!kdt_mul_u64(n, esize, nbytes)) return 0;
    *numel = n;
    return 1;
}

void kdtr_quote(const unsigned char *s, size_t len, int ascii_only, char *out, size_t cap) {
    const size_t max_src = 64; /* enough to recognize a name in a one-line message */
    size_t o = 0;
    if (cap == 0) return;
    for (size_t i = 0; i < len; i++) {
        if (i >= max_src && (s[i] & 0xC0) != 0x80) {
            if (o + 4 <= cap) memcpy(out + o, "...", 3), o += 3;
            break;
        }
        int escape = s[i] < 0x20 || s[i] == 0x7F || (ascii_only && s[i] >= 0x80);
        size_t need = escape ? 4 : 1;
        if (o + need + 1 > cap) break;
        if (escape) o += (size_t)snprintf(out + o, cap - o, "\\x%02x", s[i]);
        else out[o++] = (char)s[i];
    }
    out[o] = '\0';
}

static uint32_t hash(const char *s) { /* FNV-1a */
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

kdt_status kdtr_index_reserve(kdtr_index *ix, uint32_t want, uint32_t have, kdtr_name_at name_at, const void *ctx) {
    uint64_t size = 16;
    while (size < 2 * (uint64_t)want) size *= 2;
    if (ix->slots && size <= (uint64_t)ix->mask + 1) return KDT_OK;
    uint32_t *slots = calloc(size, sizeof *slots);
    if (!slots) return kdt_fail(KDT_ERR_NOMEM, "kdtr: out of memory for a name index of %u tensors", want);
    free(ix->slots);
    ix->slots = slots;
    ix->mask = (uint32_t)(size - 1);
    for (uint32_t i = 0; i < have; i++) kdtr_index_insert(ix, name_at(ctx, i), i);
    return KDT_OK;
}

uint32_t kdtr_index_find(const kdtr_index *ix, const char *name, kdtr_name_at name_at, const void *ctx) {
    if (!ix->slots) return UINT32_MAX;
    for (uint32_t h = hash(name) & ix->mask;; h = (h + 1) & ix->mask) {
        uint32_t v = ix->slots[h];
        if (v == 0) return UINT32_MAX;
        if (strcmp(name_at(ctx, v - 1), name) == 0) return v - 1;
    }
}

void kdtr_index_insert(kdtr_index *ix, const char *name, uint32_t i) {
    uint32_t h = hash(name) & ix->mask;
    while (ix->slots[h]) h = (h + 1) & ix->mask;
    ix->slots[h] = i + 1;
}

void kdtr_index_free(kdtr_index *ix) {
    free(ix->slots);
    ix->slots = NULL;
    ix->mask = 0;
}
