/* The prompt-lookup drafter (model-free). Each slot keeps, per n = 1 .. NGRAM, a hash index of the
 * history's n-grams: bucket heads and a chain through earlier positions, so a lookup walks only
 * the positions whose n-gram hashes alike (most recent first) instead of the whole history.
 * Entry e stands for the n-gram ending at e; it is indexed once its continuation e + 1 exists.
 *
 * The longest match wins, and a draft starts only from a match of at least MIN_START tokens: a
 * step with a draft verifies N + 1 rows, which on the shipped model costs about three plain steps
 * (H200: 17 rows about 0.9 ms, a plain step 0.285 ms; docs/perf/spec.md), while a draft that starts
 * from one matching token kept about 2 tokens (the held-out prompts' greedy outputs replayed by
 * bench_lookup_replay at D=16 K=1 N=16: 6.2 tokens a step with 134 of 205 steps drafting before,
 * 5.8 with 94 of 221 now; 2.30x plain on the H200 against main's 1.84x). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "spec/internal.h"

#define NGRAM 4                 /* longest n-gram tried */
#define MIN_START 2             /* shortest match a draft starts from (depth 0) */
#define HASH_BITS 12
#define HASH_SIZE (1 << HASH_BITS)
#define MATCH_MAX 256           /* matches counted per lookup */
#define VISIT_MAX 1024          /* chain entries visited per lookup (hash collisions included) */

typedef struct lookup {
    kdt_draft_setup set;
    int32_t *head;              /* [slots, NGRAM, HASH_SIZE] newest entry of each bucket, -1 none */
    int32_t *prev;              /* [slots, NGRAM, max_len] the bucket's entry before e */
    int32_t *indexed;           /* [slots] entries e < indexed[s] are in the index */
    int32_t *path;              /* [D] the top candidate of each depth so far */
    int32_t cand[MATCH_MAX], count[MATCH_MAX];
} lookup;

static uint32_t bucket(const int32_t *t, int32_t n) {
    uint32_t h = 0x811C9DC5u;
    for (int32_t i = 0; i < n; i++) h = (h ^ (uint32_t)t[i]) * 0x9E3779B1u;
    return h >> (32 - HASH_BITS);
}

static void lookup_release(lookup *L) {
    free(L->head); free(L->prev); free(L->indexed); free(L->path);
    L->head = L->prev = L->indexed = L->path = NULL;
}

static kdt_status lookup_begin(void *state, const kdt_draft_setup *set) {
    lookup *L = state;
    lookup_release(L);
    L->set = *set;
    const size_t S = (size_t)set->slots;
    L->head = malloc(S * NGRAM * HASH_SIZE * sizeof *L->head);
    L->prev = malloc(S * NGRAM * (size_t)set->max_len * sizeof *L->prev);
    L->indexed = calloc(S, sizeof *L->indexed);
    L->path = malloc((size_t)set->D * sizeof *L->path);
    if (!L->head || !L->prev || !L->indexed || !L->path) {
        lookup_release(L);
        return kdt_fail(KDT_ERR_NOMEM, "lookup drafter: out of memory for %d slots of %d tokens", set->slots, set->max_len);
    }
    memset(L->head, 0xFF, S * NGRAM * HASH_SIZE * sizeof *L->head);
    return KDT_OK;
}

/* Indexes the n-grams of slot s ending before len - 1 (their continuation is known). */
static void index_history(lookup *L, int32_t s, const int32_t *hist, int32_t len) {
    for (int32_t e = L->indexed[s]; e + 1 < len; e++)
        for (int32_t n = 1; n <= NGRAM && n <= e + 1; n++) {
            int32_t *head = L->head + ((size_t)s * NGRAM + (n - 1)) * HASH_SIZE;
            int32_t *prev = L->prev + ((size_t)s * NGRAM + (n - 1)) * L->set.max_len;
            const uint32_t h = bucket(hist + e - n + 1, n);
            prev[e] = head[h];
            head[h] = e;
        }
    if (len - 1 > L->indexed[s]) L->indexed[s] = len - 1;
}

/* Counts the continuations of the n-gram q [n] in slot s's history; returns the matches. */
static int32_t tally(lookup *L, int32_t s, const int32_t *hist, const int32_t *q, int32_t n, int32_t *n_cand) {
    const int32_t *head = L->head + ((size_t)s * NGRAM + (n - 1)) * HASH_SIZE;
    const int32_t *prev = L->prev + ((size_t)s * NGRAM + (n - 1)) * L->set.max_len;
    int32_t matches = 0, visits = 0;
    *n_cand = 0;
    for (int32_t e = head[bucket(q, n)]; e >= 0 && matches < MATCH_MAX && visits < VISIT_MAX; e = prev[e], visits++) {
        if (memcmp(hist + e - n + 1, q, (size_t)n * sizeof *q) != 0) continue; /* a hash collision */
        const int32_t t = hist[e + 1];
        int32_t c = 0;
        while (c < *n_cand && L->cand[c] != t) c++;
        if (c == *n_cand) {
            L->cand[c] = t;
            L->count[c] = 0;
            (*n_cand)++;
        }
        L->count[c]++;
        matches++;
    }
    return matches;
}

/* Depth by depth for one request: the context is the history then the path of top candidates. */
static void propose_one(lookup *L, int32_t s, const int32_t *hist, int32_t len, float *sc, int32_t *tk) {
    const int32_t D = L->set.D, K = L->set.K;
    int32_t d = 0;
    for (; d < D; d++) {
        int32_t q[NGRAM], matches = 0, n_cand = 0, n = NGRAM;
        for (; n >= 1; n--) { /* the longest n-gram that occurred before */
            if (len + d < n) continue;
            for (int32_t i = 0; i < n; i++) {
                const int32_t j = len + d - n + i;
                q[i] = j < len ? hist[j] : L->path[j - len];
            }
            if ((matches = tally(L, s, hist, q, n, &n_cand)) > 0) break;
        }
        if (matches == 0 || (d == 0 && n < MIN_START)) break;
        /* Candidates in the order found are newest first: a stable selection by count keeps that
         * order among equal counts. */
        for (int32_t k = 0; k < K; k++) {
            if (k >= n_cand) {
                sc[d * K + k] = -INFINITY;
                tk[d * K + k] = 0;
                continue;
            }
            int32_t best = k;
            for (int32_t c = k + 1; c < n_cand; c++)
                if (L->count[c] > L->count[best]) best = c;
            const int32_t t = L->cand[best], cnt = L->count[best];
            memmove(L->cand + k + 1, L->cand + k, (size_t)(best - k) * sizeof *L->cand);
            memmove(L->count + k + 1, L->count + k, (size_t)(best - k) * sizeof *L->count);
            L->cand[k] = t;
            L->count[k] = cnt;
            sc[d * K + k] = (float)log((double)cnt / matches);
            tk[d * K + k] = t;
        }
        L->path[d] = L->cand[0];
    }
    for (; d < D; d++)
        for (int32_t k = 0; k < K; k++) {
            sc[d * K + k] = -INFINITY;
            tk[d * K + k] = 0;
        }
}

/* Host memory on every backend (host_candidates). */
static kdt_status lookup_propose(void *state, const kdt_draft_ctx *ctx, float *scores, int32_t *tokens) {
    lookup *L = state;
    const size_t dk = (size_t)L->set.D * L->set.K;
    for (int32_t b = 0; b < ctx->B; b++)
        propose_one(L, ctx->slot[b], ctx->history[b], ctx->hist_len[b], scores + b * dk, tokens + b * dk);
    return KDT_OK;
}

static kdt_status lookup_observe(void *state, const kdt_draft_ctx *ctx, const kdt_draft_feedback *fb) {
    (void)fb;
    lookup *L = state;
    for (int32_t b = 0; b < ctx->B; b++) {
        if (ctx->hist_len[b] > L->set.max_len)
            return kdt_fail(KDT_ERR_INVALID_ARG, "lookup drafter: slot %d holds %d tokens, more than max_len %d", ctx->slot[b],
                            ctx->hist_len[b], L->set.max_len);
        index_history(L, ctx->slot[b], ctx->history[b], ctx->hist_len[b]);
    }
    return KDT_OK;
}

static kdt_status lookup_reset(void *state, int32_t slot) {
    lookup *L = state;
    if (slot < 0 || slot >= L->set.slots) return kdt_fail(KDT_ERR_INVALID_ARG, "lookup drafter: slot %d out of range", slot);
    memset(L->head + (size_t)slot * NGRAM * HASH_SIZE, 0xFF, NGRAM * HASH_SIZE * sizeof *L->head);
    L->indexed[slot] = 0;
    return KDT_OK;
}

static void lookup_destroy(void *state) {
    lookup_release(state);
    free(state);
}

kdt_status kdt_drafter_lookup(kdt_drafter **out) {
    if (!out) return kdt_fail(KDT_ERR_INVALID_ARG, "drafter_lookup: out is NULL");
    *out = NULL;
    kdt_drafter *d = calloc(1, sizeof *d);
    lookup *L = calloc(1, sizeof *L);
    if (!d || !L) {
        free(d);
        free(L);
        return kdt_fail(KDT_ERR_NOMEM, "drafter_lookup: out of memory");
    }
    *d = (kdt_drafter){.name = "lookup", .state = L, .host_candidates = 1, .begin = lookup_begin, .propose = lookup_propose,
                       .observe = lookup_observe, .reset = lookup_reset, .destroy = lookup_destroy};
    *out = d;
    return KDT_OK;
}

void kdt_drafter_free(kdt_drafter *d) {
    if (!d) return;
    if (d->destroy) d->destroy(d->state);
    free(d);
}
