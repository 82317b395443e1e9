/* Vocabulary and merge tables (open addressing), the byte-level character map, and BPE of one
 * pre-token: the lowest-ranked adjacent pair merges first, the leftmost on ties, which is both
 * tiktoken's rule and the `tokenizers` BPE model's (a heap of (rank, position)). */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/internal.h"

static uint64_t tok_hash(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0xFF51AFD7ED558CCDULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xC4CEB9FE1A85EC53ULL;
        h ^= h >> 29;
        s += 8, n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ULL;
    return h ^ (h >> 32);
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

int tok_ids_push(tok_ids *a, int32_t id) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 256;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) return -1;
        a->v = v, a->cap = cap;
    }
    a->v[a->n++] = id;
    return 0;
}

kdt_status tok_vocab_init(kdt_tokenizer *t, size_t n_tokens, int32_t n_ids) {
    t->n_ids = n_ids;
    t->vcap = pow2_at_least(2 * n_tokens + 2);
    t->vslot = calloc(t->vcap, sizeof *t->vslot);
    t->tok_off = calloc((size_t)n_ids + 1, sizeof *t->tok_off);
    t->tok_len = malloc(((size_t)n_ids + 1) * sizeof *t->tok_len);
    if (!t->vslot || !t->tok_off || !t->tok_len) return kdt_fail(KDT_ERR_NOMEM, "tokenizer: out of memory");
    memset(t->tok_len, 0xFF, ((size_t)n_ids + 1) * sizeof *t->tok_len);
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    return KDT_OK;
}

int32_t tok_vocab_find(const kdt_tokenizer *t, const void *bytes, size_t n) {
    for (size_t i = tok_hash(bytes, n) & (t->vcap - 1);; i = (i + 1) & (t->vcap - 1)) {
        uint32_t v = t->vslot[i];
        if (!v) return -1;
        if (t->tok_len[v - 1] == n && memcmp(t->arena + t->tok_off[v - 1], bytes, n) == 0) return (int32_t)v - 1;
    }
}

kdt_status tok_vocab_set(kdt_tokenizer *t, int32_t id, const void *bytes, size_t n, int in_model) {
    if (id < 0 || id >= t->n_ids) return kdt_fail(KDT_ERR_INTERNAL, "tokenizer: id %d outside the table", id);
    if (t->arena_len + n > t->arena_cap) {
        size_t cap = t->arena_cap ? t->arena_cap : 1 << 16;
        while (cap < t->arena_len + n) cap *= 2;
        char *a = realloc(t->arena, cap);
        if (!a) return kdt_fail(KDT_ERR_NOMEM, "tokenizer: out of memory");
        t->arena = a, t->arena_cap = cap;
    }
    if (n > UINT32_MAX - 1 || t->arena_len + n > UINT32_MAX)
        return kdt_fail(KDT_ERR_UNSUPPORTED, "tokenizer: vocabulary larger than 4 GB");
    memcpy(t->arena + t->arena_len, bytes, n);
    t->tok_off[id] = (uint32_t)t->arena_len;
    t->tok_len[id] = (uint32_t)n;
    t->arena_len += n;
    if (!in_model) return KDT_OK;
    if (n == 1) t->byte_id[*(const uint8_t *)bytes] = id;
    for (size_t i = tok_hash(bytes, n) & (t->vcap - 1);; i = (i + 1) & (t->vcap - 1)) {
        uint32_t v = t->vslot[i];
        if (!v) { t->vslot[i] = (uint32_t)id + 1; return KDT_OK; }
        /* two ids with the same bytes: the first one is what encoding gives, as in tokenizers */
        if (t->tok_len[v - 1] == n && memcmp(t->arena + t->tok_off[v - 1], bytes, n) == 0) return KDT_OK;
    }
}

kdt_status tok_pairs_init(kdt_tokenizer *t, size_t n) {
    t->pcap = pow2_at_least(2 * n + 2);
    t->pairs = calloc(t->pcap, sizeof *t->pairs);
    return t->pairs ? KDT_OK : kdt_fail(KDT_ERR_NOMEM, "tokenizer: out of memory");
}

/* ids are below 2^31, so the key is never 0, the empty slot's mark */
static inline uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1; }

static inline size_t pair_slot(uint64_t key, size_t cap) {
    uint64_t h = key * 0x9E3779B97F4A7C15ULL;
    return (size_t)(h ^ (h >> 31)) & (cap - 1);
}

/* A merge listed twice keeps its first (lower) rank, as tokenizers does. */
kdt_status tok_pair_add(kdt_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    const uint64_t key = pair_key(a, b);
    if (2 * (t->n_pairs + 1) > t->pcap) return kdt_fail(KDT_ERR_INTERNAL, "tokenizer: merge table full");
    for (size_t i = pair_slot(key, t->pcap);; i = (i + 1) & (t->pcap - 1)) {
        if (t->pairs[i].key == key) return KDT_OK;
        if (t->pairs[i].key == 0) {
            t->pairs[i] = (tok_pair){key, rank, id};
            t->n_pairs++;
            return KDT_OK;
        }
    }
}

static inline const tok_pair *pair_find(const kdt_tokenizer *t, int32_t a, int32_t b) {
    const uint64_t key = pair_key(a, b);
    for (size_t i = pair_slot(key, t->pcap);; i = (i + 1) & (t->pcap - 1)) {
        if (t->pairs[i].key == key) return &t->pairs[i];
        if (t->pairs[i].key == 0) return NULL;
    }
}

/* ---- GPT-2's byte-level map: printable bytes stand for themselves, the 68 others (0-32, 127-160,
 * 173, in order) for U+0100 - U+0143 ---- */

static int bytelevel_byte(uint32_t c) {
    if ((c >= 33 && c <= 126) || (c >= 161 && c <= 255 && c != 173)) return (int)c;
    if (c >= 256 && c <= 288) return (int)(c - 256);
    if (c >= 289 && c <= 322) return (int)(c - 289 + 127);
    if (c == 323) return 173;
    return -1;
}

long tok_bytelevel_decode(const char *s, size_t n, uint8_t *out) {
    const uint8_t *p = (const uint8_t *)s;
    long k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t c;
        if (p[i] < 0x80) c = p[i], i += 1;
        else if ((p[i] & 0xE0) == 0xC0 && i + 1 < n) c = (uint32_t)(p[i] & 0x1F) << 6 | (p[i + 1] & 0x3F), i += 2;
        else return -1; /* every mapped character is below U+0800 */
        int b = bytelevel_byte(c);
        if (b < 0) return -1;
        out[k++] = (uint8_t)b;
    }
    return k;
}

/* ---- BPE of one pre-token ---- */

struct tok_scratch {
    int32_t *id, *nxt, *prv;
    uint64_t *heap; /* (rank << 32 | position), a min-heap */
    size_t cap;
};

tok_scratch *tok_scratch_new(void) { return calloc(1, sizeof(tok_scratch)); }

void tok_scratch_free(tok_scratch *s) {
    if (!s) return;
    free(s->id), free(s->nxt), free(s->prv), free(s->heap);
    free(s);
}

static int scratch_reserve(tok_scratch *s, size_t n) {
    if (n <= s->cap) return 0;
    size_t cap = n < 64 ? 64 : 2 * n;
    free(s->id), free(s->nxt), free(s->prv), free(s->heap);
    s->id = malloc(cap * sizeof *s->id);
    s->nxt = malloc(cap * sizeof *s->nxt);
    s->prv = malloc(cap * sizeof *s->prv);
    s->heap = malloc(3 * cap * sizeof *s->heap); /* n - 1 pairs, then at most 2 per merge */
    s->cap = (s->id && s->nxt && s->prv && s->heap) ? cap : 0;
    return s->cap ? 0 : -1;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i && h[(i - 1) / 2] > v) h[i] = h[(i - 1) / 2], i = (i - 1) / 2;
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    const uint64_t top = h[0], v = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c], i = c;
    }
    h[i] = v;
    return top;
}

static inline void push_pair(const kdt_tokenizer *t, tok_scratch *s, size_t *hn, int32_t pos) {
    const int32_t j = s->nxt[pos];
    if (j < 0) return;
    const tok_pair *m = pair_find(t, s->id[pos], s->id[j]);
    if (m) heap_push(s->heap, hn, (uint64_t)m->rank << 32 | (uint32_t)pos);
}

kdt_status tok_bpe(const kdt_tokenizer *t, const uint8_t *p, size_t n, tok_scratch *s, tok_ids *out) {
    if (n == 1 && t->byte_id[p[0]] >= 0) return tok_ids_push(out, t->byte_id[p[0]]) ? kdt_fail(KDT_ERR_NOMEM, "encode: out of memory") : KDT_OK;
    if (t->ignore_merges) {
        int32_t id = tok_vocab_find(t, p, n);
        if (id >= 0) return tok_ids_push(out, id) ? kdt_fail(KDT_ERR_NOMEM, "encode: out of memory") : KDT_OK;
    }
    if (n > INT32_MAX / 2 || scratch_reserve(s, n)) return kdt_fail(KDT_ERR_NOMEM, "encode: out of memory");
    int32_t m = 0;
    for (size_t i = 0; i < n; i++) /* a byte with no token is dropped, as tokenizers does without unk_token */
        if (t->byte_id[p[i]] >= 0) s->id[m++] = t->byte_id[p[i]];
    for (int32_t i = 0; i < m; i++) s->nxt[i] = i + 1 < m ? i + 1 : -1, s->prv[i] = i - 1;
    size_t hn = 0;
    for (int32_t i = 0; i + 1 < m; i++) push_pair(t, s, &hn, i);
    while (hn) {
        const uint64_t top = heap_pop(s->heap, &hn);
        const int32_t i = (int32_t)(uint32_t)top, j = s->nxt[i];
        if (s->id[i] < 0 || j < 0) continue;
        const tok_pair *mp = pair_find(t, s->id[i], s->id[j]);
        if (!mp || mp->rank != (uint32_t)(top >> 32)) continue; /* stale: the pair changed since */
        s->id[i] = mp->id;
        s->id[j] = -1;
        s->nxt[i] = s->nxt[j];
        if (s->nxt[i] >= 0) s->prv[s->nxt[i]] = i;
        if (s->prv[i] >= 0) push_pair(t, s, &hn, s->prv[i]);
        push_pair(t, s, &hn, i);
    }
    for (int32_t i = m ? 0 : -1; i >= 0; i = s->nxt[i])
        if (tok_ids_push(out, s->id[i])) return kdt_fail(KDT_ERR_NOMEM, "encode: out of memory");
    return KDT_OK;
}
