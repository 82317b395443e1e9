/* The arithmetic of tree_sample_accept (docs/interfaces.md 2.4, docs/sampling.md) that decides outcomes, in one
 * header compiled by the C reference and the CUDA kernel alike so both give the same bits:
 * Philox4x32-10, the f32 exp, the token weights, the draws. Every f32/f64 operation is one IEEE
 * operation rounded to nearest (on CUDA the __f*_rn / __d*_rn intrinsics, which are never fused;
 * the C side is compiled with -std=c11, where GCC does not contract, and without FMA). Sums of
 * weights are u64 integers, exact in any order. python/gen_tree_sample_accept.py does the same. */
#pragma once

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define KDT_SAMPLE_FN static __host__ __device__ __forceinline__
#else
#define KDT_SAMPLE_FN static inline
#endif

#if defined(__CUDA_ARCH__)
#define KDT_FMUL(a, b) __fmul_rn((a), (b))
#define KDT_FADD(a, b) __fadd_rn((a), (b))
#define KDT_FSUB(a, b) __fsub_rn((a), (b))
#define KDT_FDIV(a, b) __fdiv_rn((a), (b))
#define KDT_DMUL(a, b) __dmul_rn((a), (b))
#define KDT_DDIV(a, b) __ddiv_rn((a), (b))
#define KDT_U2D(x) __ull2double_rn(x)
#else
#define KDT_FMUL(a, b) ((float)(a) * (float)(b))
#define KDT_FADD(a, b) ((float)(a) + (float)(b))
#define KDT_FSUB(a, b) ((float)(a) - (float)(b))
#define KDT_FDIV(a, b) ((float)(a) / (float)(b))
#define KDT_DMUL(a, b) ((double)(a) * (double)(b))
#define KDT_DDIV(a, b) ((double)(a) / (double)(b))
#define KDT_U2D(x) ((double)(uint64_t)(x))
#endif

/* A token's weight is its probability times 2^32 relative to the row's largest (an integer). */
#define KDT_SAMPLE_ONE 4294967296ull
/* Philox streams: the acceptance draws and the model drafter's draws never share a counter. */
#define KDT_SAMPLE_STREAM_ACCEPT 0u
#define KDT_SAMPLE_STREAM_DRAFT 1u
#define KDT_SAMPLE_STREAM_STEP 2u /* the loop's per-step seeds */
/* Draw index of the final (bonus) draw at a node; child tries use their ordinal 0, 1, ... */
#define KDT_SAMPLE_DRAW_BONUS 0xFFFFFFFFu

KDT_SAMPLE_FN uint32_t kdt_f2bits(float x) {
    union { float f; uint32_t u; } v;
    v.f = x;
    return v.u;
}

KDT_SAMPLE_FN float kdt_bits2f(uint32_t x) {
    union { float f; uint32_t u; } v;
    v.u = x;
    return v.f;
}

/* Philox4x32-10 (Salmon, Moraes, Dror, Shaw, SC 2011): 10 rounds, key bumped between rounds. */
KDT_SAMPLE_FN void kdt_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (uint32_t)p1;
        c2 = n2;
        c3 = (uint32_t)p0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* Uniform in [0, 1) with 53 bits, fixed by (seed, request b, depth t, draw j, stream). */
KDT_SAMPLE_FN double kdt_sample_uniform(uint64_t seed, uint32_t b, uint32_t t, uint32_t j, uint32_t stream) {
    const uint32_t ctr[4] = {b, t, j, stream}, key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t o[4];
    kdt_philox4x32_10(ctr, key, o);
    const uint64_t u = (((uint64_t)o[0] << 32) | o[1]) >> 11;
    return KDT_DMUL(KDT_U2D(u), 1.1102230246251565e-16); /* 2^-53, exact */
}

/* A logit's sort key at temperature T > 0: logit / T, with NaN -> -inf, +inf -> FLT_MAX and
 * -0 -> +0, so that float order and the order of kdt_key_order agree. */
KDT_SAMPLE_FN float kdt_sample_key(float logit, float T) {
    float s = KDT_FDIV(logit, T);
    if (s != s) return kdt_bits2f(0xFF800000u);
    if (s > 3.40282347e38f) return 3.40282347e38f;
    return s == 0.0f ? 0.0f : s;
}

/* Monotone map of a key (no NaN) to u32: a < b as floats iff order(a) < order(b). */
KDT_SAMPLE_FN uint32_t kdt_key_order(float key) {
    const uint32_t u = kdt_f2bits(key);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

KDT_SAMPLE_FN float kdt_key_from_order(uint32_t o) {
    return kdt_bits2f((o & 0x80000000u) ? (o & 0x7FFFFFFFu) : ~o);
}

/* exp(x) for x <= 0 in f32: n = floor(x log2 e + 1/2), r = x - n ln2 (two-part ln2), a degree-6
 * Taylor polynomial in Horner order, times 2^n. Below -87 it is 0. Relative error ~2e-7. */
KDT_SAMPLE_FN float kdt_sample_exp(float x) {
    if (!(x >= -87.0f)) return 0.0f;
    const float n = floorf(KDT_FADD(KDT_FMUL(x, 0x1.715476p+0f), 0.5f));
    float r = KDT_FSUB(x, KDT_FMUL(n, 0x1.63p-1f));
    r = KDT_FSUB(r, KDT_FMUL(n, -0x1.bd0106p-13f));
    float p = 0x1.6c16c2p-10f;
    p = KDT_FADD(KDT_FMUL(p, r), 0x1.111112p-7f);
    p = KDT_FADD(KDT_FMUL(p, r), 0x1.555556p-5f);
    p = KDT_FADD(KDT_FMUL(p, r), 0x1.555556p-3f);
    p = KDT_FADD(KDT_FMUL(p, r), 0.5f);
    p = KDT_FADD(KDT_FMUL(p, r), 1.0f);
    p = KDT_FADD(KDT_FMUL(p, r), 1.0f);
    return KDT_FMUL(p, kdt_bits2f((uint32_t)((int32_t)n + 127) << 23));
}

/* Weight of a token with key `key` in a row whose largest key is m: exp(key - m) * 2^32,
 * truncated (a key equal to m weighs exactly 2^32, also when both are -inf). */
KDT_SAMPLE_FN uint64_t kdt_sample_weight(float key, float m) {
    if (key == m) return KDT_SAMPLE_ONE;
    const float e = kdt_sample_exp(KDT_FSUB(key, m));
    const float s = KDT_FMUL(e > 1.0f ? 1.0f : e, 4294967296.0f);
    return (uint64_t)s;
}

/* Weight of a draft probability: q clamped to [0, 1] (NaN -> 0) times 2^32, truncated. */
KDT_SAMPLE_FN uint64_t kdt_draft_weight(float q) {
    if (!(q > 0.0f)) return 0;
    return (uint64_t)KDT_FMUL(q > 1.0f ? 1.0f : q, 4294967296.0f);
}

/* The draft weight's share, floor(qw * c), to take off a residual weight r (0 at the floor). */
KDT_SAMPLE_FN uint64_t kdt_residual_step(uint64_t r, uint64_t qw, double c) {
    const double d = KDT_DMUL(KDT_U2D(qw), c);
    if (d >= 4611686018427387904.0) return 0; /* 2^62 > any residual weight */
    const uint64_t sub = (uint64_t)d;
    return r > sub ? r - sub : 0;
}

/* Index in [0, Z) of a draw u in [0, 1): floor(u Z), kept below Z. Z > 0. */
KDT_SAMPLE_FN uint64_t kdt_sample_target(double u, uint64_t Z) {
    const uint64_t t = (uint64_t)KDT_DMUL(u, KDT_U2D(Z));
    return t < Z ? t : Z - 1;
}

/* The op's seed for a request at a step of the loop: Philox of counter (history length, 0, 0,
 * KDT_SAMPLE_STREAM_STEP) under the request's seed, words 0 and 1. */
KDT_SAMPLE_FN uint64_t kdt_sample_step_seed(uint64_t seed, uint32_t hist_len) {
    const uint32_t ctr[4] = {hist_len, 0, 0, KDT_SAMPLE_STREAM_STEP}, key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t o[4];
    kdt_philox4x32_10(ctr, key, o);
    return ((uint64_t)o[0] << 32) | o[1];
}

/* Deterministic child: accept iff u < w / Z (Z > 0). */
KDT_SAMPLE_FN int kdt_accept_det(double u, uint64_t w, uint64_t Z) {
    return u < KDT_DDIV(KDT_U2D(w), KDT_U2D(Z));
}

/* Sampled child: accept iff u < (r Qz) / (Z qw), i.e. min(1, r(x) / q(x)); with qw = 0 iff r > 0. */
KDT_SAMPLE_FN int kdt_accept_sampled(double u, uint64_t r, uint64_t Z, uint64_t qw, uint64_t Qz) {
    const double num = KDT_DMUL(KDT_U2D(r), KDT_U2D(Qz)), den = KDT_DMUL(KDT_U2D(Z), KDT_U2D(qw));
    if (den == 0.0) return num > 0.0;
    return u < KDT_DDIV(num, den);
}

/* The top-p mass to reach: floor(P * W) as doubles, at least 1. */
KDT_SAMPLE_FN uint64_t kdt_top_p_need(float P, uint64_t W) {
    const double d = KDT_DMUL((double)P, KDT_U2D(W));
    const uint64_t n = d >= 1.8446744073709552e19 ? W : (uint64_t)d;
    return n < 1 ? 1 : n;
}
