/* tree_accept CPU reference (docs/interfaces.md 2.3). Safe on any input: the tree is checked before the walk,
 * and the walk takes at most num_nodes steps. */
#include "ops/backends.h"

/* 0 if request b's tree is well formed, else a non-zero code naming the first fault. */
static int32_t check_tree(const int32_t *parent, int32_t n, int32_t Q) {
    if (n < 0 || n > Q - 1) return 1;               /* num_nodes out of range */
    for (int32_t c = 1; c <= n; c++)
        if (parent[c] < 0 || parent[c] >= c) return 2; /* parent out of range or not below child */
    return 0;
}

kdt_status kdt_tree_accept_cpu(const kdt_tree_accept_params *p) {
    const int32_t Q = p->Q;
    for (int32_t b = 0; b < p->B; b++) {
        const int32_t *tok = p->node_token + (size_t)b * Q, *par = p->node_parent + (size_t)b * Q;
        const int32_t *pred = p->target_pred + (size_t)b * Q;
        int32_t *idx = p->accept_index + (size_t)b * Q, *out = p->accept_tokens + (size_t)b * Q;
        for (int32_t i = 0; i < Q; i++) idx[i] = out[i] = -1;
        int32_t n = p->num_nodes[b];
        int32_t status = check_tree(par, n, Q);
        int32_t cur = 0, len = 0;
        idx[0] = 0;
        if (status == 0) {
            /* Children of cur are nodes c > cur with par[c] == cur; the lowest matching index wins. */
            for (int32_t step = 0; step < n; step++) {
                int32_t next = -1;
                for (int32_t c = cur + 1; c <= n; c++)
                    if (par[c] == cur && tok[c] == pred[cur]) { next = c; break; }
                if (next < 0) break;
                out[len] = tok[next];
                cur = next;
                idx[++len] = cur;
            }
        }
        out[len] = pred[cur];
        p->accept_len[b] = len;
        p->status[b] = status;
    }
    return KDT_OK;
}
