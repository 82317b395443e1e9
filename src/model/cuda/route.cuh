/* The router's device code, with no includes of its own, so that tests/test_model_route_emu.cc
 * runs it on CPU threads. route_row is DeepSeek-V3's choice for one row (one warp), used by
 * kernels.cu's route kernel (a block per row) and by route_plan_block (route.cu: one block does
 * the router's scores, the choice of every row and the expert grouping of a small batch in one
 * launch) and by route_wide_block (route.cu's wide router: many blocks score a large router, the
 * last one routes). The CUDA subset it uses: threadIdx, blockIdx, blockDim, gridDim,
 * __syncthreads, __syncwarp, __threadfence, __shfl_xor_sync on floats and ints, __shfl_up_sync on
 * ints, __reduce_max_sync and __reduce_min_sync on unsigned ints, atomicOr on shared 64-bit words,
 * atomicAdd on ints, __popcll, __ldcg, __float_as_uint, float4 loads, __float2bfloat16_rn, expf,
 * fmaf, sqrtf, and norm.cuh's norm_sumsq_part (included first). */
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
    for (int e0 = lane; e0 < E; e0 += 32 * 16) { /* 16 logits and biases a lane in flight, then their stores */
        float lg[16], bs[16];
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int e = e0 + 32 * i;
            lg[i] = e < E ? __ldcg(logits + e) : 0.f; /* past L1: other blocks may have written them (route.cu) */
            bs[i] = e < E ? bias[e] : 0.f;
        }
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int e = e0 + 32 * i;
            if (e >= E) break;
            const float s = 1.0f / (1.0f + expf(-lg[i]));
            score[e] = s;
            choice[e] = s + bs[i];
            taken[e] = 0;
        }
    }
    __syncwarp();
    /* Each group's two best biased scores, the warp over its members: every lane keeps the two best
     * of its own, then a butterfly merges pairs. The two best of a set do not depend on the order
     * they are found in, so neither does the sum. */
    for (int g = 0; g < G; g++) {
        float t1 = -INFINITY, t2 = -INFINITY;
        for (int e = g * per + lane; e < (g + 1) * per; e += 32) {
            const float c = choice[e];
            if (c > t1) {
                t2 = t1;
                t1 = c;
            } else if (c > t2) {
                t2 = c;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float u1 = __shfl_xor_sync(0xffffffffu, t1, o), u2 = __shfl_xor_sync(0xffffffffu, t2, o);
            t2 = fmaxf(fminf(t1, u1), fmaxf(t2, u2));
            t1 = fmaxf(t1, u1);
        }
        if (lane == 0) {
            gscore[g] = per >= 2 ? t1 + t2 : t1;
            gsel[g] = 0;
        }
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
    if (topk_group < G) /* the experts of groups not kept are out, as if taken */
        for (int e = lane; e < E; e += 32) taken[e] = !gsel[e / per];
    __syncwarp();
    float sum = 0.f;
    for (int k = 0; k < K; k++) {
        /* This lane's best untaken expert (lower index on ties), then the warp's. */
        int bi = -1;
        float bv = 0.f;
#pragma unroll 4
        for (int e = lane; e < E; e += 32)
            if (!taken[e] && (bi < 0 || choice[e] > bv)) {
                bi = e;
                bv = choice[e];
            }
        /* The warp's: the largest value by its bits in an unsigned order (0: none; -0 as +0), then
         * the lowest index holding it. */
        unsigned key = 0u;
        if (bi >= 0) {
            const unsigned u = __float_as_uint(bv == 0.f ? 0.f : bv);
            key = (u & 0x80000000u) ? ~u : u | 0x80000000u;
        }
        const unsigned top = __reduce_max_sync(0xffffffffu, key);
        const unsigned at = __reduce_min_sync(0xffffffffu, bi >= 0 && key == top ? (unsigned)bi : 0xffffffffu);
        bi = top ? (int)at : -1;
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
    int most_route_warps;        /* route_warps' `most` (0: every warp may route a row) */
};

/* The warps of a block of `warps` that route rows (route_row), for R rows and at most `most` of
 * them routing (0: no limit). */
__host__ __device__ inline int route_warps(int warps, int R, int most) {
    const int w = most > 0 && most < warps ? most : warps;
    return w < R ? w : R;
}

/* Bytes of route_plan_block's shared memory: the route_row scratch of each of rw routing warps
 * (route_warps), then E offsets (ints) and E row masks (64-bit words). */
__host__ __device__ inline int route_plan_smem_bytes(int rw, int E, int G, int K) {
    return rw * route_scratch_bytes(E, G, K) + (E * 4 + 7) / 8 * 8 + E * 8;
}

/* One block (blockDim.x a multiple of 32) does the whole routing of a small batch (R <= 64): the
 * scores (a warp per (row, expert) pair, router_dot), each row's choice (a warp per row,
 * route_row), then the grouping kdt_mk_moe_plan makes. The grouping: a row chooses an expert at
 * most once, so expert e's assignments are the rows of a 64-bit mask (shared atomicOr: the same
 * word whatever the order); counts are its popcounts, offsets a scan by warp 0 (each lane a run of
 * experts), and assignment j of row r sits at offs[e] + the mask's rows before r: perm lists each
 * expert's assignments in increasing order. Global writes are read back by other threads of the
 * block only after a __syncthreads. */
__device__ inline void route_plan_block(const RoutePlanArgs &a, unsigned char *smem) {
    const int warps = (int)(blockDim.x / 32), warp = (int)(threadIdx.x / 32), lane = (int)(threadIdx.x % 32), n = a.R * a.K;
    if (a.h) {
        for (int p = warp; p < a.R * a.E; p += warps) {
            const int r = p / a.E, e = p % a.E;
            const float v = router_dot(a.h + (size_t)r * a.hid, a.w + (size_t)e * a.hid, a.hid);
            if (lane == 0) a.logits[p] = v;
        }
        __syncthreads();
    }
    const int rw = route_warps(warps, a.R, a.most_route_warps);
    void *scratch = smem + (size_t)warp * route_scratch_bytes(a.E, a.G, a.K);
    int *offs = (int *)(smem + (size_t)rw * route_scratch_bytes(a.E, a.G, a.K));
    unsigned long long *rows = (unsigned long long *)((unsigned char *)offs + (a.E * 4 + 7) / 8 * 8);
    for (int e = (int)threadIdx.x; e < a.E; e += (int)blockDim.x) rows[e] = 0;
    for (int r = warp; warp < rw && r < a.R; r += rw)
        route_row(a.logits + (size_t)r * a.E, a.bias, a.E, a.G, a.topk_group, a.K, a.norm, a.scale, a.idx + (size_t)r * a.K,
                  a.wt + (size_t)r * a.K, scratch);
    __syncthreads();
    for (int j = (int)threadIdx.x; j < n; j += (int)blockDim.x) {
        const int e = a.idx[j];
        if (e >= 0 && e < a.E) atomicOr(&rows[e], 1ull << (j / a.K));
    }
    __syncthreads();
    if (warp == 0) {
        const int per = (a.E + 31) / 32, e0 = lane * per, e1 = e0 + per < a.E ? e0 + per : a.E;
        int run = 0;
        for (int e = e0; e < e1; e++) run += __popcll(rows[e]);
        int incl = run; /* inclusive scan of the lanes' runs */
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += v;
        }
        run = incl - run;
        for (int e = e0; e < e1; e++) {
            const int c = __popcll(rows[e]);
            offs[e] = run;
            a.offs[e] = run;
            a.counts[e] = c;
            run += c;
        }
    }
    __syncthreads();
    for (int j = (int)threadIdx.x; j < n; j += (int)blockDim.x) {
        const int e = a.idx[j], r = j / a.K;
        if (e < 0 || e >= a.E) continue;
        const int p = offs[e] + __popcll(rows[e] & ((1ull << r) - 1ull));
        a.perm[p] = j;
        a.pos[j] = p;
    }
}

/* The layer's RMSNorm before the routing: rows x [R, hid] f32, weights w [hid]; out h [R, hid] f32
 * and hn [R, hid] (bf16, else f32). */
struct RouteNorm {
    const float *x, *w;
    float eps;
    float *h;
    void *hn;
    int bf16;
};

/* inv[r] = 1 / sqrt(mean(x_r^2) + eps) for r < R (shared, R floats; part: shared [R][8]). Each group
 * of 256 threads sums rows as kernels.cu's rmsnorm_kernel (thread t elements t, t + 256, ..., a
 * butterfly per warp, one over the 8 warps' sums), so the bits are its. */
__device__ inline void norm_inv_rows(const float *x, float eps, int R, int hid, float (*part)[8], float *inv) {
    const int groups = (int)blockDim.x / 256, t = (int)threadIdx.x % 256, lane = t % 32, wg = t / 32;
    const int warp = (int)threadIdx.x / 32, warps = (int)blockDim.x / 32;
    for (int r = (int)threadIdx.x / 256; r < R; r += groups) {
        float ss = norm_sumsq_part(x + (size_t)r * hid, hid, t, 256);
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) part[r][wg] = ss;
    }
    __syncthreads();
    for (int r = warp; r < R; r += warps) {
        float v = lane < 8 ? part[r][lane] : 0.f;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) inv[r] = 1.0f / sqrtf(v / (float)hid + eps);
    }
    __syncthreads();
}

/* h and hn elements i = first, first + step, ... < R * hid of the norm: w * (x * inv), as
 * kernels.cu's rmsnorm writes them. */
__device__ inline void norm_write(const RouteNorm &n, const float *inv, int R, int hid, int first, int step) {
    for (int i = first; i < R * hid; i += step) {
        const float y = n.w[i % hid] * (n.x[i] * inv[i / hid]);
        n.h[i] = y;
        if (n.bf16) ((__nv_bfloat16 *)n.hn)[i] = __float2bfloat16_rn(y);
        else ((float *)n.hn)[i] = y;
    }
}

constexpr int kScoreRows = 4; /* rows route_wide_block scores at a time */

/* Shared memory of route_wide_block besides route_plan_block's: per warp kScoreRows partial scores,
 * the norm's partial sums and inverse RMS of up to 4 rows, the last-block flag. */
struct RouteWideShared {
    float part[32][kScoreRows];
    float npart[4][8], inv[4];
    int last;
};

/* One block of the wide router (route.cu): a team of `team` warps per expert (blockDim.x / 32 / team
 * experts a block, block b from expert b * that), kScoreRows rows at a time. A row's score for
 * expert e, h_r . w_e (hid % 4 == 0; h, w 16-byte aligned): lane l of member m sums the 4-float
 * chunks c = 32 m + l, + 32 team, ... in increasing order (a chunk's 4 products in order), a
 * butterfly over the warp, then the members' sums in member order: one order per (hid, team),
 * whatever the batch or grid. Each writer fences its scores; then the block takes a ticket, and the
 * block that takes the last one (which one does not change any result) routes and groups all rows
 * (route_plan_block, with smem) and sets the ticket back to zero. kNorm (R <= blockDim.x / 256,
 * at most 4): the layer's norm first, each block finding the rows' inverse RMS itself and writing
 * its share of h and hn; the scores take h = w * (x * inv) as they go, the bits of h, since other
 * blocks are writing h. */
template <bool kNorm>
__device__ inline void route_wide_block(const RoutePlanArgs &a, const RouteNorm &n, int team, int *ticket, unsigned char *smem,
                                        RouteWideShared &sh) {
    if (kNorm) {
        norm_inv_rows(n.x, n.eps, a.R, a.hid, sh.npart, sh.inv);
        norm_write(n, sh.inv, a.R, a.hid, (int)(blockIdx.x * blockDim.x + threadIdx.x), (int)(gridDim.x * blockDim.x));
    }
    const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32, m = warp % team, slot = warp / team;
    const int e = (int)blockIdx.x * ((int)blockDim.x / 32 / team) + slot, chunks = a.hid / 4;
    const float4 *w = (const float4 *)(a.w + (size_t)(e < a.E ? e : 0) * a.hid);
    for (int r0 = 0; r0 < a.R; r0 += kScoreRows) {
        float acc[kScoreRows] = {};
#pragma unroll 4
        for (int c = m * 32 + lane; c < chunks; c += 32 * team) {
            const float4 wv = w[c], nv = kNorm ? ((const float4 *)n.w)[c] : float4{};
#pragma unroll
            for (int q = 0; q < kScoreRows; q++) {
                if (r0 + q >= a.R) break;
                float4 hv;
                if (kNorm) {
                    const float4 xv = ((const float4 *)(n.x + (size_t)(r0 + q) * a.hid))[c];
                    const float s = sh.inv[r0 + q];
                    hv = float4{nv.x * (xv.x * s), nv.y * (xv.y * s), nv.z * (xv.z * s), nv.w * (xv.w * s)};
                } else {
                    hv = ((const float4 *)(a.h + (size_t)(r0 + q) * a.hid))[c];
                }
                acc[q] = fmaf(hv.w, wv.w, fmaf(hv.z, wv.z, fmaf(hv.y, wv.y, fmaf(hv.x, wv.x, acc[q]))));
            }
        }
#pragma unroll
        for (int q = 0; q < kScoreRows; q++) {
            for (int o = 16; o > 0; o >>= 1) acc[q] += __shfl_xor_sync(0xffffffffu, acc[q], o);
            if (lane == 0) sh.part[warp][q] = acc[q];
        }
        __syncthreads();
        if (m == 0 && lane < kScoreRows && r0 + lane < a.R && e < a.E) {
            float v = sh.part[warp][lane];
            for (int k = 1; k < team; k++) v += sh.part[warp + k][lane];
            a.logits[(size_t)(r0 + lane) * a.E + e] = v;
            __threadfence(); /* device-wide before the block's ticket (the last block reads it) */
        }
        __syncthreads(); /* part is rewritten by the next rows */
    }
    if (threadIdx.x == 0) {
        __threadfence(); /* and the block's scores, seen by this thread through the barrier, before its ticket */
        sh.last = atomicAdd(ticket, 1) == (int)gridDim.x - 1;
    }
    __syncthreads();
    if (!sh.last) return;
    __threadfence();
    RoutePlanArgs b = a;
    b.h = nullptr; /* the scores are in logits now */
    route_plan_block(b, smem);
    if (threadIdx.x == 0) *ticket = 0; /* every other block has taken its ticket */
}
