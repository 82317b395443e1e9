/* Host reductions over logit rows: greedy argmax (the target's prediction), top-K with
 * log-softmax scores (a model drafter's candidates) and sampled candidates (a model drafter's when
 * its request samples). */
#include <math.h>

#include "common/sample_math.h"
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

/* Thread-free twin of kdt_spec_sample_cuda (spec/internal.h): the same draws; q may differ in its
 * last bits (the sum's order), which changes nothing the op relies on: the candidates are drawn
 * from the weights of the q written. */
void kdt_spec_sample_host(const float *x, int64_t R, int32_t V, int32_t K, int32_t depth, const float *temperature,
                          const uint64_t *seed, float *probs, int64_t pstride, float *scores, int32_t *tokens, int64_t stride) {
    for (int64_t r = 0; r < R; r++) {
        const float *row = x + r * V, T = temperature[r];
        float *q = probs + r * pstride;
        if (!(T > 0.0f)) {
            for (int32_t v = 0; v < V; v++) q[v] = 0.0f;
            continue;
        }
        float m = -INFINITY;
        for (int32_t v = 0; v < V; v++) m = fmaxf(m, kdt_sample_key(row[v], T));
        double sum = 0;
        for (int32_t v = 0; v < V; v++) sum += q[v] = kdt_sample_weight(kdt_sample_key(row[v], T), m) * 0x1p-32f;
        uint64_t Qz = 0;
        for (int32_t v = 0; v < V; v++) Qz += kdt_draft_weight(q[v] = (float)(q[v] / sum));
        for (int32_t k = 0; k < K; k++) {
            const uint64_t t = kdt_sample_target(kdt_sample_uniform(seed[r], 0, (uint32_t)depth, (uint32_t)k, KDT_SAMPLE_STREAM_DRAFT), Qz);
            uint64_t cum = 0;
            int32_t v = 0;
            while (v < V - 1 && (cum += kdt_draft_weight(q[v])) <= t) v++;
            tokens[r * stride + k] = v;
            scores[r * stride + k] = KDT_SPEC_SAMPLE_SCORE(k);
        }
    }
}
