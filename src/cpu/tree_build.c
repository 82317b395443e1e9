/* tree_build CPU reference (docs/interfaces.md 2.1): best-first selection with a binary heap of candidates.
 * Selecting a node pushes all its children with a finite score; the heap pops the interface's best
 * (score desc, then depth, parent, k asc). It does not rely on sorted rows, so it is safe and
 * still follows the rule literally on any input. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "ops/backends.h"

typedef struct cand {
    float score;
    int32_t depth, parent, k;
} cand;

/* 1 when a comes before b in the interface's order. Scores are finite; -0.0 == 0.0 is a tie. */
static int before(const cand *a, const cand *b) {
    if (a->score != b->score) return a->score > b->score;
    if (a->depth != b->depth) return a->depth < b->depth;
    if (a->parent != b->parent) return a->parent < b->parent;
    return a->k < b->k;
}

static void heap_push(cand *h, size_t *n, cand c) {
    size_t i = (*n)++;
    while (i > 0 && before(&c, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = c;
}

static cand heap_pop(cand *h, size_t *n) {
    cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && before(&h[c + 1], &h[c])) c++;
        if (!before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

/* Pushes the finite-score children of node i (tree depth t, score s): candidates of draft depth t. */
static void push_children(cand *h, size_t *n, const float *row, int32_t K, int32_t t, int32_t i, float s) {
    for (int32_t k = 0; k < K; k++) {
        cand c = {s + row[k], t + 1, i, k};
        if (isfinite(c.score)) heap_push(h, n, c);
    }
}

kdt_status kdt_tree_build_cpu(const kdt_tree_build_params *p) {
    const int32_t D = p->D, K = p->K, N = p->budget, Q = N + 1;
    cand *heap = malloc((size_t)Q * K * sizeof *heap); /* at most K pushes per selected node */
    if (!heap) return kdt_fail(KDT_ERR_NOMEM, "tree_build: heap of %d candidates", Q * K);
    for (int32_t b = 0; b < p->B; b++) {
        const size_t o = (size_t)b * Q;
        const float *sc = p->scores + (size_t)b * D * K;
        const int32_t *tok = p->tokens + (size_t)b * D * K;
        int32_t *par = p->node_parent + o, *dep = p->node_depth + o, *cnd = p->node_cand + o;
        int32_t *ntok = p->node_token + o, *pos = p->positions + o;
        int32_t *fc = p->first_child + o, *ns = p->next_sibling + o;
        float *nsc = p->node_score + o;
        for (int32_t i = 0; i < Q; i++) {
            par[i] = dep[i] = cnd[i] = ntok[i] = pos[i] = fc[i] = ns[i] = -1;
            nsc[i] = -INFINITY;
        }
        dep[0] = 0;
        nsc[0] = 0.0f;
        ntok[0] = p->root_token[b];

        size_t hn = 0;
        int32_t n = 0;
        push_children(heap, &hn, sc, K, 0, 0, 0.0f);
        while (n < N && hn > 0) {
            cand c = heap_pop(heap, &hn);
            n++;
            par[n] = c.parent;
            dep[n] = c.depth;
            cnd[n] = c.k;
            nsc[n] = c.score;
            ntok[n] = tok[(size_t)(c.depth - 1) * K + c.k];
            if (c.depth < D && n < N) push_children(heap, &hn, sc + (size_t)c.depth * K, K, c.depth, n, c.score);
        }
        p->num_nodes[b] = n;

        /* Unsigned add: wraps instead of overflowing for a caller's out-of-range seq_len. */
        for (int32_t i = 0; i <= n; i++) pos[i] = (int32_t)((uint32_t)p->seq_len[b] + (uint32_t)dep[i]);
        /* Children lists in increasing index order: walk the nodes from the last one down. */
        for (int32_t i = n; i >= 1; i--) {
            ns[i] = fc[par[i]];
            fc[par[i]] = i;
        }
        uint8_t *mask = p->tree_mask + (size_t)b * Q * Q;
        memset(mask, 0, (size_t)Q * Q);
        for (int32_t i = 0; i <= n; i++)
            for (int32_t j = i; j >= 0; j = par[j]) mask[(size_t)i * Q + j] = 1;
    }
    free(heap);
    return KDT_OK;
}
