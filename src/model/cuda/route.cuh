/* The router's device code, with no includes of its own, so that tests/test_model_route_emu.cc
 * runs it on CPU threads. route_row is DeepSeek-V3's choice for one row (one warp), used by
 * kernels.cu's route kernel (a block per row) and by route_plan_block (route.cu: one block does
 * the router's scores, the choice of every row and the expert grouping of a small batch in one
 * launch). The CUDA subset it uses: threadIdx, blockDim, __syncthreads, __syncwarp,
 * __shfl_xor_sync on floats and ints, expf, fmaf. */
#pragma once

/* Bytes of one warp's route_row scratch: score [E], choice [E], gscore [G], wsel [K] floats, then
 * taken [E] and gsel [G] bytes; rounded up to 16 so that warps' pieces stay aligned. */
__host__ __device__ inline int route_scratch_bytes(int E, int G, int K) {
    return ((2 * E + G + K) * 4 + E + G + 15) / 16 * 16;
}

/* One warp (lane = threadIdx.x % 32) routes one row: sigmoid scores of logits [E], bias [E]
 * added for choosing only, the topk_group groups (of E / G) with the best sums of their two best
 * biased scores, the K best experts in them (ties to the lower index); weights the unbiased
 * scores, divided by their sum + 1e-20 when norm, times scale. Out: idx [K], wt [K]. */
__device__ inline void route_row(const float *logits, const float *bias, int E, int G, int topk_group, int K, int norm,
                                 float scale, int32_t *idx, float *wt, void *scratch) {
    float *score = (float *)scratch, *choice = score + E, *gscore = choice + E, *wsel = gscore + G;
    unsigned char *taken = (unsigned char *)(wsel + K), *gsel = taken + E;
    const int lane = (int)(threadIdx.x % 32), per = E / G;
    for (int e = lane; e < E; e += 32) {
        const float s = 1.0f / (1.0f + expf(-logits[e]));
        score[e] = s;
        choice[e] = s + bias[e];
        taken[e] = 0;
    }
    __syncwarp();
    for (int g = lane; g < G; g += 32) {
        float t1 = -INFINITY, t2 = -INFINITY;
        for (int e = g * per; e < (g + 1) * per; e++) {
            const float c = choice[e];
            if (c > t1) {
                t2 = t1;
                t1 = c;
            } else if (c > t2) {
                t2 = c;
            }
        }
        gscore[g] = per >= 2 ? t1 + t2 : t1;
        gsel[g] = 0;
    }
    __syncwarp();
    if (lane == 0)
        for (int kept = 0; kept < topk_group; kept++) {
            int best = -1;
            for (int g = 0; g < G; g++)
                if (!gsel[g] && (best < 0 || gscore[g] > gscore[best])) best = g;
            if (best >= 0) gsel[best] = 1;
        }
    __syncwarp();
    float sum = 0.f;
    for (int k = 0; k < K; k++) {
        /* This lane's best untaken expert of a kept group (lower index on ties), then the warp's. */
        int bi = -1;
        float bv = 0.f;
        for (int e = lane; e < E; e += 32)
            if (gsel[e / per] && !taken[e] && (bi < 0 || choice[e] > bv)) {
                bi = e;
                bv = choice[e];
            }
        for (int o = 16; o > 0; o >>= 1) {
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) {
                bi = oi;
                bv = ov;
            }
        }
        if (lane == 0) {
            const float w = bi >= 0 ? score[bi] : 0.f;
            if (bi >= 0) taken[bi] = 1;
            idx[k] = bi;
            wsel[k] = w;
            sum += w;
        }
        __syncwarp();
    }
    if (lane == 0)
        for (int k = 0; k < K; k++) {
            float w = wsel[k];
            if (norm) w /= sum + 1e-20f;
            wt[k] = w * scale;
        }
    __syncwarp(); /* the scratch is free for the warp's next row */
}

/* h [n] . w [n] in f32 by one warp: lane l sums elements l, l + 32, ... in order, then a butterfly.
 * The order depends on n alone, so a row's score has the same bits in any batch. */
__device__ inline float router_dot(const float *h, const float *w, int n) {
    const int lane = (int)(threadIdx.x % 32);
    float acc = 0.f;
#pragma unroll 8
    for (int i = lane; i < n; i += 32) acc = fmaf(h[i], w[i], acc);
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    return acc;
}

struct RoutePlanArgs {
    const float *h;              /* [R, hid] f32, the router's input; NULL: logits are given */
    const float *w;              /* [E, hid] f32, the router's weights (with h) */
    float *logits;               /* [R, E] f32: written from h and w, else read */
    const float *bias;           /* [E] */
    int R, E, G, topk_group, K, hid, norm;
    float scale;
    int32_t *idx;                /* [R, K] chosen experts (-1: none) */
    float *wt;                   /* [R, K] their weights */
    int32_t *counts, *offs;      /* [E] assignments per expert, first place in perm */
    int32_t *perm;               /* [R * K] assignments of expert 0 in order, then expert 1, ... */
    int32_t *pos;                /* [R * K] where each assignment sits in perm */
};

/* One block (blockDim.x a multiple of 32) does the whole routing of a small batch: the scores
 * (a warp per (row, expert) pair, router_dot), each row's choice (a warp per row, route_row, with
 * route_scratch_bytes of smem per warp), then the grouping kdt_mk_moe_plan makes (a thread per
 * expert scanning the assignments in order, so perm lists each expert's assignments in
 * increasing order). smem: warps x route_scratch_bytes, then E ints. Global writes are read back
 * by other threads of the block only after a __syncthreads. */
__device__ inline void route_plan_block(const RoutePlanArgs &a, unsigned char *smem) {
    const int warps = (int)(blockDim.x / 32), warp = (int)(threadIdx.x / 32), n = a.R * a.K;
    if (a.h) {
        for (int p = warp; p < a.R * a.E; p += warps) {
            const int r = p / a.E, e = p % a.E;
            const float v = router_dot(a.h + (size_t)r * a.hid, a.w + (size_t)e * a.hid, a.hid);
            if (threadIdx.x % 32 == 0) a.logits[p] = v;
        }
        __syncthreads();
    }
    void *scratch = smem + (size_t)warp * route_scratch_bytes(a.E, a.G, a.K);
    for (int r = warp; r < a.R; r += warps)
        route_row(a.logits + (size_t)r * a.E, a.bias, a.E, a.G, a.topk_group, a.K, a.norm, a.scale, a.idx + (size_t)r * a.K,
                  a.wt + (size_t)r * a.K, scratch);
    __syncthreads();
    int *cnt = (int *)(smem + (size_t)warps * route_scratch_bytes(a.E, a.G, a.K));
    for (int e = (int)threadIdx.x; e < a.E; e += (int)blockDim.x) {
        int c = 0;
        for (int j = 0; j < n; j++) c += a.idx[j] == e;
        cnt[e] = c;
        a.counts[e] = c;
    }
    __syncthreads();
    for (int e = (int)threadIdx.x; e < a.E; e += (int)blockDim.x) {
        int run = 0;
        for (int i = 0; i < e; i++) run += cnt[i];
        a.offs[e] = run;
        for (int j = 0; j < n; j++)
            if (a.idx[j] == e) {
                a.perm[run] = j;
                a.pos[j] = run++;
            }
    }
}
