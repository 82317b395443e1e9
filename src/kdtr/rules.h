/* docs/interfaces.md section 1 rules shared by the KDTR reader and writer: names, byte counts, the name index. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "kdt/kdt.h"

/* 0 when s[0 .. len) is valid UTF-8 with no NUL (no overlongs, surrogates or code points past
 * U+10FFFF); otherwise KDT_ERR_KDTR_NAME with *bad_at the offset of the first bad byte. */
kdt_status kdtr_name_check(const unsigned char *s, size_t len, size_t *bad_at);

/* numel = product(dims) and nbytes = numel * esize as exact integers: a zero dim makes both 0
 * whatever the other dims. Returns 0 when either does not fit in 64 bits. */
int kdtr_byte_count(const uint64_t *dims, int ndim, size_t esize, uint64_t *numel, uint64_t *nbytes);

/* A printable, single-line copy of a name for messages: control bytes (and, with ascii_only,
 * every byte >= 0x80) become \xNN; long names are cut at a character boundary with "...". */
void kdtr_quote(const unsigned char *s, size_t len, int ascii_only, char *out, size_t cap);

/* Open-addressing hash index over names (NUL-terminated, owned by the caller): slot holds
 * index + 1, 0 when empty. The table keeps its load at or below one half. */
typedef const char *(*kdtr_name_at)(const void *ctx, uint32_t index);
typedef struct kdtr_index {
    uint32_t *slots;
    uint32_t mask;
} kdtr_index;

/* Makes room for `want` names; rehashes the `have` names already inserted. */
kdt_status kdtr_index_reserve(kdtr_index *ix, uint32_t want, uint32_t have, kdtr_name_at name_at, const void *ctx);
/* The index of `name`, or UINT32_MAX when absent. */
uint32_t   kdtr_index_find(const kdtr_index *ix, const char *name, kdtr_name_at name_at, const void *ctx);
/* Inserts index i under name (the caller checked it is absent and reserved room). */
void       kdtr_index_insert(kdtr_index *ix, const char *name, uint32_t i);
void       kdtr_index_free(kdtr_index *ix);
