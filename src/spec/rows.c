/* Host reductions over logit rows: greedy argmax (the target's prediction) and top-K with
 * log-softmax scores (a model drafter's candidates). */
#include <math.h>

#include "spec/internal.h"

void kdt_spec_argmax_host(const float *x, int64_t R, int32_t V, int32_t *out) {
    for (int64_t r = 0; r < R; r++) {
        const float *row = x + r * V;
        int32_t best = 0;
        for (int32_t i = 1; i < V; i++)
            if (row[i] > row[best] || (isnan(row[best]) && !isnan(row[i]))) best = i;
        out[r] = best;
    }
}

void kdt_spec_topk_host(const float *x, int64_t R, int32_t V, int32_t K, float *scores, int32_t *tokens, int64_t stride) {
    for (int64_t r = 0; r < R; r++) {
        const float *row = x + r * V;
        float *sc = scores + r * stride;
        int32_t *tk = tokens + r * stride, n = 0;
        double mx = -INFINITY;
        for (int32_t i = 0; i < V; i++)
            if (isfinite(row[i]) && row[i] > mx) mx = row[i];
        double sum = 0;
        for (int32_t i = 0; i < V; i++) {
            const float v = row[i];
            if (!isfinite(v)) continue;
            sum += exp((double)v - mx);
            /* Insertion into the sorted top list; strict > keeps the lower index first among equals. */
            if (n == K && !(v > sc[K - 1])) continue;
            int32_t j = n < K ? n++ : K - 1;
            for (; j > 0 && v > sc[j - 1]; j--) {
                sc[j] = sc[j - 1];
                tk[j] = tk[j - 1];
            }
            sc[j] = v;
            tk[j] = i;
        }
        const double lse = mx + log(sum);
        for (int32_t k = 0; k < n; k++) sc[k] = (float)((double)sc[k] - lse);
        for (int32_t k = n; k < K; k++) {
            sc[k] = -INFINITY;
            tk[k] = 0;
        }
    }
}
