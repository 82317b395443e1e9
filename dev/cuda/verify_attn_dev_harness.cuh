/* Harness pieces for the verify_attn sm90 experiments in dev/cuda/ (the seesaw's): random
 * paged inputs on the device with NaN in every cache row past kv_len, the shipped kernel's run, the
 * library's CPU reference, output distances. Included after the library's tile header. */
#pragma once

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>

#include "../../bench/bench_common.h" /* CK, KCK, bench_splitmix64, bench_mix64, bench_flushed_us */
#include "cuda/sm90/verify_attn_sm90.h"
#include "cuda/sm90/verify_attn_sm90_tile.cuh"
#include "kdt/ops.h"

namespace kdt_va_dev {

using namespace kdt_va_sm90;

static __global__ void fill_bf16(bf16 *x, size_t n, uint64_t seed, float amp) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint64_t z = bench_mix64((i + 1) * 0x9E3779B97F4A7C15ull ^ seed);
        x[i] = __float2bfloat16((float)((z >> 40) * (1.0 / 16777216.0) * 2.0 - 1.0) * amp);
    }
}

/* NaN into every cache row of request b at or past kv_len[b] (the rest of its blocks). */
static __global__ void poison_tail(bf16 *kv, const int32_t *bt, const int32_t *len, int MB, int BS) {
    const int b = blockIdx.x;
    const __nv_bfloat16 nan = __ushort_as_bfloat16((unsigned short)0x7FC0);
    for (long long i = len[b] * (long long)kDqk + threadIdx.x; i < (long long)MB * BS * kDqk; i += blockDim.x) {
        const long long j = i / kDqk;
        kv[((long long)bt[(long long)b * MB + j / BS] * BS + j % BS) * kDqk + i % kDqk] = nan;
    }
}

inline uint64_t g_rng = 42;
inline uint64_t rnd() { return bench_splitmix64(&g_rng); }

struct Case {
    int B, H, Q, prefix, BS;
    int tree;    /* 0 random (deep-ish), 1 chain (causal), 2 star (every node a child of the root) */
    int ragged;  /* 1: kv_len varies per request (prefix - 0..200) */
};

struct Run {
    kdt_verify_attn_params p;
    Args a;
    int m_tiles;
    void *ws;
    bf16 *o2;
    float *lse2;
};

inline void make_case(const Case &c, Run *r) {
    memset(r, 0, sizeof *r);
    const int nmax = c.prefix + c.Q, MB = (nmax + c.BS - 1) / c.BS, NB = c.B * MB;
    const size_t q_n = (size_t)c.B * c.Q * c.H * kDqk, kv_n = (size_t)NB * c.BS * kDqk, rows = (size_t)c.B * c.Q * c.H;
    kdt_verify_attn_params *p = &r->p;
    void *q, *kv, *o;
    float *lse;
    CK(cudaMalloc(&q, q_n * 2));
    CK(cudaMalloc(&kv, kv_n * 2));
    CK(cudaMalloc(&o, rows * kDv * 2));
    CK(cudaMalloc(&lse, rows * 4));
    CK(cudaMalloc(&r->o2, rows * kDv * 2));
    CK(cudaMalloc(&r->lse2, rows * 4));
    fill_bf16<<<2048, 256>>>((bf16 *)q, q_n, rnd(), 2.f);
    fill_bf16<<<2048, 256>>>((bf16 *)kv, kv_n, rnd(), 1.f);
    CK(cudaGetLastError());
    int32_t *bt = (int32_t *)malloc(sizeof(int32_t) * NB), *len = (int32_t *)malloc(sizeof(int32_t) * c.B);
    for (int i = 0; i < NB; i++) bt[i] = i;
    for (int i = NB - 1; i > 0; i--) {
        const int j = (int)(rnd() % (uint64_t)(i + 1)), t = bt[i];
        bt[i] = bt[j], bt[j] = t;
    }
    for (int b = 0; b < c.B; b++) len[b] = c.ragged ? std::max(nmax - (int)(rnd() % 201), c.Q) : nmax;
    uint8_t *mask = (uint8_t *)calloc((size_t)c.B * c.Q * c.Q, 1);
    for (int b = 0; b < c.B; b++)
        for (int i = 0; i < c.Q; i++) {
            int parent = -1;
            if (i > 0) parent = c.tree == 1 ? i - 1 : c.tree == 2 ? 0 : (rnd() % 2 ? i - 1 : (int)(rnd() % (uint64_t)i));
            uint8_t *row = mask + ((size_t)b * c.Q + i) * c.Q;
            row[i] = 1;
            if (parent >= 0) /* ancestors: the parent's row (parent < i, already built) */
                for (int j = 0; j < i; j++) row[j] |= mask[((size_t)b * c.Q + parent) * c.Q + j];
        }
    int32_t *d_bt, *d_len;
    uint8_t *d_mask;
    CK(cudaMalloc(&d_bt, sizeof(int32_t) * NB));
    CK(cudaMalloc(&d_len, sizeof(int32_t) * c.B));
    CK(cudaMalloc(&d_mask, (size_t)c.B * c.Q * c.Q));
    CK(cudaMemcpy(d_bt, bt, sizeof(int32_t) * NB, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_len, len, sizeof(int32_t) * c.B, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_mask, mask, (size_t)c.B * c.Q * c.Q, cudaMemcpyHostToDevice));
    poison_tail<<<c.B, 256>>>((bf16 *)kv, d_bt, d_len, MB, c.BS);
    CK(cudaGetLastError());
    free(bt), free(len), free(mask);
    p->B = c.B, p->Q = c.Q, p->H = c.H, p->Dv = kDv, p->Dr = kDr, p->dtype = KDT_BF16, p->sm_scale = 0.13086f;
    p->q = q, p->kv_cache = kv, p->NB = NB, p->BS = c.BS, p->block_table = d_bt, p->MB = MB;
    p->kv_len = d_len, p->tree_mask = d_mask, p->o = o, p->lse = lse;
}

inline void free_case(Run *r) {
    cudaFree((void *)r->p.q), cudaFree((void *)r->p.kv_cache), cudaFree(r->p.o), cudaFree(r->p.lse);
    cudaFree((void *)r->p.block_table), cudaFree((void *)r->p.kv_len), cudaFree((void *)r->p.tree_mask);
    cudaFree(r->o2), cudaFree(r->lse2), cudaFree(r->ws);
}

/* The shipped TMA kernel with `parts` (0: its scheduler); *info gets what ran. */
inline void run_shipped(const Run &r, int parts, kdt_va_sm90_info *info) {
    const kdt_va_sm90_config cfg = {KDT_VA_SM90_TMA, parts, 0};
    int handled = 0;
    KCK(kdt_verify_attn_sm90_ex(&r.p, NULL, &cfg, info, &handled));
    if (!handled) {
        fprintf(stderr, "the shipped sm90 kernel declined the call (not an sm_90 device?)\n");
        exit(1);
    }
}

inline float bf2f(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The library's CPU reference (double accumulation) on host copies of run r's inputs: o (bf16
 * bits) and lse of every row. Only for small cases: it is O(B Q H kv_len 1088) on one core. */
inline void cpu_reference(const Case &c, const Run &r, uint16_t *o, float *lse) {
    const kdt_verify_attn_params &d = r.p;
    const size_t q_bytes = (size_t)c.B * c.Q * c.H * kDqk * 2, kv_bytes = (size_t)d.NB * d.BS * kDqk * 2;
    void *q = malloc(q_bytes), *kv = malloc(kv_bytes);
    int32_t *bt = (int32_t *)malloc(sizeof(int32_t) * (size_t)d.NB), *len = (int32_t *)malloc(sizeof(int32_t) * (size_t)c.B);
    uint8_t *mask = (uint8_t *)malloc((size_t)c.B * c.Q * c.Q);
    CK(cudaMemcpy(q, d.q, q_bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(kv, d.kv_cache, kv_bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(bt, d.block_table, sizeof(int32_t) * (size_t)d.NB, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(len, d.kv_len, sizeof(int32_t) * (size_t)c.B, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(mask, d.tree_mask, (size_t)c.B * c.Q * c.Q, cudaMemcpyDeviceToHost));
    kdt_verify_attn_params h = d;
    h.q = q, h.kv_cache = kv, h.block_table = bt, h.kv_len = len, h.tree_mask = mask, h.o = o, h.lse = lse;
    KCK(kdt_verify_attn(&h, KDT_BACKEND_CPU, NULL));
    free(q), free(kv), free(bt), free(len), free(mask);
}

/* Distance of bf16 output a to reference b (n elements): rel L2, max |d|, differing, NaN in either. */
struct Diff {
    double rel, max_abs;
    size_t differ, nan;
};
inline Diff diff_bf16(const uint16_t *a, const uint16_t *b, size_t n) {
    Diff d = {0, 0, 0, 0};
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const float fa = bf2f(a[i]), fb = bf2f(b[i]);
        if (isnan(fa) || isnan(fb)) {
            d.nan++;
            continue;
        }
        d.differ += a[i] != b[i];
        num += ((double)fa - fb) * ((double)fa - fb), den += (double)fb * fb;
        d.max_abs = fmax(d.max_abs, fabs((double)fa - fb));
    }
    d.rel = den > 0 ? sqrt(num / den) : sqrt(num);
    return d;
}
/* Max |a - b| over n lse values; both -inf counts as equal; NaN in either adds to *nan. */
inline double diff_lse(const float *a, const float *b, size_t n, size_t *nan) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) (*nan)++;
        else if (!(isinf(a[i]) && a[i] == b[i])) m = fmax(m, fabs((double)a[i] - b[i]));
    }
    return m;
}

} // namespace kdt_va_dev
