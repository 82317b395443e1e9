/* verify_attn CPU reference (docs/interfaces.md 2.2). Scores, softmax and output accumulate in double; bf16
 * inputs are widened exactly and a bf16 output is rounded to nearest even once, at the end.
 *
 * For each (request, tree row) the visible keys are streamed once and each is used by every
 * head, with an online softmax per head. Runs after kdt_verify_attn checked kv_len, the block
 * table and the mask, so every key it reads lies inside the cache. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "ops/backends.h"

static void widen(const void *src, kdt_dtype dt, size_t n, double *dst) {
    if (dt == KDT_F32) {
        const float *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = s[i];
        return;
    }
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)s[i] << 16;
        float f;
        memcpy(&f, &bits, sizeof f);
        dst[i] = f;
    }
}

/* Nearest even bf16 of a double. Going through float first rounds twice; where that made a
 * bf16 tie that v itself is not, v's side of the tie decides. */
static uint16_t bf16_round(double v) {
    const float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if (isnan(f)) return 0x7FC0;
    if ((u & 0xFFFFu) == 0x8000u && (double)f != v) return (uint16_t)((u >> 16) + (fabs(v) > fabs((double)f)));
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* Key j of request b: [Dqk] in the input dtype. */
static const void *key_row(const kdt_verify_attn_params *p, int32_t b, int32_t j, size_t row_bytes) {
    if (p->kv) return (const char *)p->kv + ((size_t)b * (size_t)p->L + (size_t)j) * row_bytes;
    const int32_t blk = p->block_table[(size_t)b * p->MB + j / p->BS];
    return (const char *)p->kv_cache + ((size_t)blk * p->BS + (size_t)(j % p->BS)) * row_bytes;
}

/* Four independent sums so the loop is not one long chain of dependent adds. */
static double dot(const double *a, const double *b, int32_t n) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int32_t d = 0;
    for (; d + 4 <= n; d += 4) {
        s0 += a[d] * b[d];
        s1 += a[d + 1] * b[d + 1];
        s2 += a[d + 2] * b[d + 2];
        s3 += a[d + 3] * b[d + 3];
    }
    for (; d < n; d++) s0 += a[d] * b[d];
    return (s0 + s1) + (s2 + s3);
}

kdt_status kdt_verify_attn_cpu(const kdt_verify_attn_params *p) {
    const int32_t Q = p->Q, H = p->H, Dv = p->Dv, Dqk = p->Dv + p->Dr;
    const size_t es = kdt_dtype_size(p->dtype), row_bytes = (size_t)Dqk * es;
    double *qd = malloc((size_t)H * Dqk * sizeof *qd);   /* [H, Dqk] one tree row, all heads */
    double *kd = malloc((size_t)Dqk * sizeof *kd);        /* [Dqk] one key */
    double *acc = malloc((size_t)H * Dv * sizeof *acc);  /* [H, Dv] unnormalized output */
    double *m = malloc((size_t)H * sizeof *m), *l = malloc((size_t)H * sizeof *l);
    if (!qd || !kd || !acc || !m || !l) {
        free(qd), free(kd), free(acc), free(m), free(l);
        return kdt_fail(KDT_ERR_NOMEM, "verify_attn cpu: out of memory for H = %d, Dqk = %d", H, Dqk);
    }
    const double scale = p->sm_scale;
    for (int32_t b = 0; b < p->B; b++) {
        const int32_t n = p->kv_len[b], prefix = n - Q; /* key prefix + i is tree node i */
        for (int32_t i = 0; i < Q; i++) {
            const size_t row = (size_t)b * Q + i;
            const uint8_t *mask = p->tree_mask + row * Q;
            widen((const char *)p->q + row * H * row_bytes, p->dtype, (size_t)H * Dqk, qd);
            memset(acc, 0, (size_t)H * Dv * sizeof *acc);
            for (int32_t h = 0; h < H; h++) m[h] = -INFINITY, l[h] = 0;
            for (int32_t j = 0; j < n; j++) {
                if (j >= prefix && !mask[j - prefix]) continue;
                widen(key_row(p, b, j, row_bytes), p->dtype, (size_t)Dqk, kd);
                for (int32_t h = 0; h < H; h++) {
                    const double s = scale * dot(qd + (size_t)h * Dqk, kd, Dqk);
                    double *a = acc + (size_t)h * Dv;
                    if (s > m[h]) { /* new maximum: rescale what was summed so far */
                        const double c = exp(m[h] - s);
                        l[h] *= c;
                        for (int32_t d = 0; d < Dv; d++) a[d] *= c;
                        m[h] = s;
                    }
                    const double e = exp(s - m[h]);
                    l[h] += e;
                    for (int32_t d = 0; d < Dv; d++) a[d] += e * kd[d];
                }
            }
            for (int32_t h = 0; h < H; h++) {
                const size_t oi = (row * H + h) * (size_t)Dv;
                const double inv = l[h] > 0 ? 1.0 / l[h] : 0.0; /* a row that sees no key: o = 0 */
                p->lse[row * H + h] = l[h] > 0 ? (float)(m[h] + log(l[h])) : -INFINITY;
                for (int32_t d = 0; d < Dv; d++) {
                    const double v = acc[(size_t)h * Dv + d] * inv;
                    if (p->dtype == KDT_F32) ((float *)p->o)[oi + d] = (float)v;
                    else ((uint16_t *)p->o)[oi + d] = bf16_round(v);
                }
            }
        }
    }
    free(qd), free(kd), free(acc), free(m), free(l);
    return KDT_OK;
}
