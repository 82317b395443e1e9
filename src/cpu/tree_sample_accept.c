/* tree_sample_accept CPU reference (docs/interfaces.md 2.4; the rule and its arithmetic in docs/sampling.md).
 * Every outcome is decided by the integer weights and draws of common/sample_math.h, so the CUDA
 * kernel, which sums the same integers in another order, gives the same bits. Safe on any input:
 * the tree is checked before the walk, the walk takes at most num_nodes steps, tokens outside
 * [0, V) weigh 0. */
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "common/sample_math.h"
#include "ops/backends.h"

/* Same codes as tree_accept. */
static int32_t check_tree(const int32_t *parent, int32_t n, int32_t Q) {
    if (n < 0 || n > Q - 1) return 1;
    for (int32_t c = 1; c <= n; c++)
        if (parent[c] < 0 || parent[c] >= c) return 2;
    return 0;
}

/* The argmax the loop takes (src/spec/rows.c): NaN below everything, ties to the lowest id. */
static int32_t argmax_row(const float *x, int32_t V) {
    int32_t best = 0;
    for (int32_t i = 1; i < V; i++)
        if (x[i] > x[best] || (x[best] != x[best] && x[i] == x[i])) best = i;
    return best;
}

/* One node's filtered target distribution: token v weighs w(v) = weight(key_v, m) when
 * order(key_v) >= tau, else 0; Z is the sum. */
typedef struct dist {
    const float *key; /* [V] */
    float m;
    uint32_t tau;
    uint64_t Z;
} dist;

typedef struct scratch {
    int32_t V;
    float *key;      /* [V] */
    uint64_t *pair;  /* [V]: order << 32 | index, sorted for the thresholds */
    uint64_t *qw;    /* [V] draft weights of the current node */
    int32_t *rej;    /* [Q] tokens rejected at the current node (deterministic children) */
    double *chain;   /* [Q] residual steps at the current node (sampled children) */
} scratch;

static uint64_t dist_w(const dist *d, int32_t v) {
    const float k = d->key[v];
    return kdt_key_order(k) >= d->tau ? kdt_sample_weight(k, d->m) : 0;
}

static int cmp_desc(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void dist_make(dist *d, scratch *s, const float *logits, float T, int32_t k, float P) {
    const int32_t V = s->V;
    d->key = s->key;
    d->m = kdt_bits2f(0xFF800000u);
    d->tau = 0;
    for (int32_t v = 0; v < V; v++) {
        s->key[v] = kdt_sample_key(logits[v], T);
        if (s->key[v] > d->m) d->m = s->key[v];
    }
    const int need_sort = (k > 0 && k < V) || P < 1.0f;
    if (need_sort) {
        for (int32_t v = 0; v < V; v++) s->pair[v] = (uint64_t)kdt_key_order(s->key[v]) << 32 | (uint32_t)v;
        qsort(s->pair, (size_t)V, sizeof *s->pair, cmp_desc);
    }
    if (k > 0 && k < V) d->tau = (uint32_t)(s->pair[k - 1] >> 32); /* the k-th largest key */
    uint64_t W = 0;
    for (int32_t v = 0; v < V; v++) W += dist_w(d, v);
    if (P < 1.0f) { /* the largest key t with W(key >= t) >= need, over whole groups of equal keys */
        const uint64_t need = kdt_top_p_need(P, W);
        uint64_t cum = 0;
        for (int32_t i = 0; i < V; i++) {
            const uint32_t o = (uint32_t)(s->pair[i] >> 32);
            cum += dist_w(d, (int32_t)(uint32_t)s->pair[i]);
            if (cum >= need && (i + 1 == V || (uint32_t)(s->pair[i + 1] >> 32) != o)) {
                d->tau = o;
                break;
            }
        }
        W = cum;
    }
    d->Z = W;
}

/* The residual weight of token v: deterministic children zero the rejected tokens; sampled ones
 * take floor(qw * c) off at each rejection (c = Z / Qz of that rejection). */
static uint64_t residual_w(const dist *d, const scratch *s, int32_t v, int32_t n_rej, int32_t n_chain) {
    uint64_t r = dist_w(d, v);
    for (int32_t i = 0; i < n_rej; i++)
        if (s->rej[i] == v) return 0;
    for (int32_t i = 0; i < n_chain && r; i++) r = kdt_residual_step(r, s->qw[v], s->chain[i]);
    return r;
}

static int32_t sample_row(const dist *d, const scratch *s, uint64_t Z, int32_t n_rej, int32_t n_chain, double u) {
    const uint64_t t = kdt_sample_target(u, Z);
    uint64_t cum = 0;
    for (int32_t v = 0; v < s->V; v++) {
        cum += residual_w(d, s, v, n_rej, n_chain);
        if (cum > t) return v;
    }
    return s->V - 1; /* unreachable: the weights sum to Z > t */
}

static void one_request(const kdt_tree_sample_accept_params *p, scratch *s, int32_t b) {
    const int32_t Q = p->Q, V = p->V;
    const int32_t *tok = p->node_token + (size_t)b * Q, *par = p->node_parent + (size_t)b * Q;
    const float *logits = p->target_logits + (size_t)b * Q * V;
    const float *q = p->draft_probs ? p->draft_probs + (size_t)b * Q * V : NULL;
    int32_t *idx = p->accept_index + (size_t)b * Q, *out = p->accept_tokens + (size_t)b * Q;
    for (int32_t i = 0; i < Q; i++) idx[i] = out[i] = -1;
    const int32_t n = p->num_nodes[b], status = check_tree(par, n, Q);
    const float T = p->temperature[b], P = p->top_p[b];
    const uint64_t seed = p->seed[b];
    int32_t cur = 0, len = 0;
    idx[0] = 0;
    for (;;) {
        const float *row = logits + (size_t)cur * V;
        int32_t next = -1;
        if (!(T > 0.0f)) { /* greedy: docs/interfaces.md 2.3 on the row's argmax */
            const int32_t pred = argmax_row(row, V);
            for (int32_t c = cur + 1; status == 0 && c <= n && next < 0; c++)
                if (par[c] == cur && tok[c] == pred) next = c;
            if (next < 0) { out[len] = pred; break; }
        } else {
            dist d;
            dist_make(&d, s, row, T, p->top_k[b], P);
            uint64_t Z = d.Z, Qz = 0;
            int32_t n_rej = 0, n_chain = 0, j = 0;
            const float *qrow = q ? q + (size_t)cur * V : NULL;
            if (qrow && status == 0) {
                for (int32_t v = 0; v < V; v++) Qz += s->qw[v] = kdt_draft_weight(qrow[v]);
            }
            for (int32_t c = cur + 1; status == 0 && c <= n && next < 0; c++) {
                if (par[c] != cur) continue;
                const int32_t x = tok[c];
                const double u = kdt_sample_uniform(seed, (uint32_t)b, (uint32_t)len, (uint32_t)j++,
                                                    KDT_SAMPLE_STREAM_ACCEPT);
                const uint64_t r = x >= 0 && x < V ? residual_w(&d, s, x, n_rej, n_chain) : 0;
                if (Qz > 0) { /* sampled children: min(1, r(x) / q(x)), else r <- norm(max(0, r - q)) */
                    if (kdt_accept_sampled(u, r, Z, x >= 0 && x < V ? s->qw[x] : 0, Qz)) { next = c; break; }
                    s->chain[n_chain++] = KDT_DDIV(KDT_U2D(Z), KDT_U2D(Qz));
                    Z = 0;
                    for (int32_t v = 0; v < V; v++) Z += residual_w(&d, s, v, n_rej, n_chain);
                } else { /* deterministic children: r(x), else x leaves the residual */
                    if (Z > 0 && kdt_accept_det(u, r, Z)) { next = c; break; }
                    if (r > 0) { s->rej[n_rej++] = x; Z -= r; }
                }
            }
            if (next < 0) {
                if (Z == 0) { n_rej = n_chain = 0; Z = d.Z; } /* residual used up: the full distribution */
                const double u = kdt_sample_uniform(seed, (uint32_t)b, (uint32_t)len, KDT_SAMPLE_DRAW_BONUS,
                                                    KDT_SAMPLE_STREAM_ACCEPT);
                out[len] = sample_row(&d, s, Z, n_rej, n_chain, u);
                break;
            }
        }
        out[len] = tok[next];
        cur = next;
        idx[++len] = cur;
    }
    p->accept_len[b] = len;
    p->status[b] = status;
}

kdt_status kdt_tree_sample_accept_cpu(const kdt_tree_sample_accept_params *p) {
    scratch s = {.V = p->V};
    s.key = malloc((size_t)p->V * sizeof *s.key);
    s.pair = malloc((size_t)p->V * sizeof *s.pair);
    s.qw = malloc((size_t)p->V * sizeof *s.qw);
    s.rej = malloc((size_t)p->Q * sizeof *s.rej);
    s.chain = malloc((size_t)p->Q * sizeof *s.chain);
    kdt_status st = KDT_OK;
    if (!s.key || !s.pair || !s.qw || !s.rej || !s.chain)
        st = kdt_fail(KDT_ERR_NOMEM, "tree_sample_accept: no host memory for V = %d scratch rows", p->V);
    for (int32_t b = 0; st == KDT_OK && b < p->B; b++) one_request(p, &s, b);
    free(s.key);
    free(s.pair);
    free(s.qw);
    free(s.rej);
    free(s.chain);
    return st;
}
