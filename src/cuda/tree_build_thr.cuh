/* tree_build's threshold path, device code (docs/perf/tree_build.md). Included by tree_build.cu
 * inside its anonymous namespace, and by tests/test_tree_build_emu.cc, which runs it on CPU
 * threads with the CUDA intrinsics emulated: so no includes here, and only the intrinsics that
 * test defines. */

constexpr unsigned kFull = 0xffffffffu;

/* The score's bits mapped so that unsigned order is float order for finite scores; 0 for -inf,
 * NaN and +inf (never selected). */
__device__ __forceinline__ uint32_t score_order(float f) {
    const uint32_t u = __float_as_uint(f);
    const uint32_t o = u ^ ((uint32_t)((int32_t)u >> 31) | 0x80000000u); /* ~u if negative */
    return isfinite(f) ? o : 0;
}

/* Node scores are binned by value, 16 bins a nat: bin(s) = min(-16 s, 511) for s <= 0. The map
 * is monotone (the scaling is exact), so a node in a higher bin scores strictly below every node
 * in a lower one: once N nodes lie in bins <= b, no node of a higher bin can be among the best N
 * (it has N strict predecessors), nor can its descendants. */
constexpr int kBins = 512;
constexpr int kThrWarps = 16; /* 8 measured slower (an earlier form, B = 64, N = 128: 21.0 us vs 18.5) */

__device__ __forceinline__ int score_bin(float s) { return (int)fminf(-16.0f * s, (float)(kBins - 1)); }

/* score_bin(s) <= b iff s > bin_floor(b), for finite s <= 0 (the scaling is exact); -inf for the
 * last bin, which also holds the lowest finite scores. */
__device__ __forceinline__ float bin_floor(int b) { return b >= kBins - 1 ? -INFINITY : (float)(b + 1) * -0.0625f; }

/* The threshold path's shared arrays. S is every node generated so far, level by level, S[0] the
 * root; a node's children are contiguous and in k order. */
struct thr_smem {
    uint64_t *key;   /* [M] final candidates by bin: key = score order << 32 | (127 - depth) << 24 */
    float *ss;       /* [M] node score */
    uint32_t *sm;    /* [M] parent's S index << 13 | depth << 6 | k */
    int32_t *rk;     /* [M] a node's rank among the final candidates (INT32_MAX: not one) */
    int32_t *lst;    /* [M] final candidates by bin: S index */
    int32_t *hist;   /* [2, kBins + 32] nodes a level adds per bin (by level parity); a spare bin a lane */
    int32_t *bstart; /* [kBins] final candidates in lower bins */
    int32_t *misc;   /* [10] bin limit by level parity; 3 level counts; 3 "more" flags; -; final count */
};

/* The pool's room: the level that passes N nodes adds at most N K, the later ones few (the pool
 * peaked at 1065 nodes for N = 128, 1957 for N = 256 over 64 requests of the bench's scores, in a
 * numpy model of the path). A multiple of 4 keeps the histogram 16-byte aligned. */
__host__ __device__ inline int thr_capacity(int K, int N) { return (N * (K + 6) + 4) & ~3; }

__host__ __device__ inline size_t thr_smem_bytes(int M) { return (size_t)24 * M + 4 * (3 * kBins + 64 + 10) + 16; }

__device__ thr_smem thr_carve(uint8_t *base, int M) {
    thr_smem h;
    /* pointer arithmetic on base (not a cast from an integer) keeps the accesses in shared memory */
    h.key = (uint64_t *)(base + ((16 - ((uintptr_t)base & 15)) & 15));
    h.ss = (float *)(h.key + M);
    h.sm = (uint32_t *)(h.ss + M);
    h.rk = (int32_t *)(h.sm + M);
    h.lst = h.rk + M;
    h.hist = h.lst + M;
    h.bstart = h.hist + 2 * (kBins + 32);
    h.misc = h.bstart + kBins;
    return h;
}

/* The pool before level 0: S = the root alone, both level histograms empty, level 0's count and
 * flag cleared; thread tid of T. The caller's barrier follows. */
__device__ __forceinline__ void thr_init(const thr_smem &h, int tid, int T) {
    for (int i = tid; i < 2 * (kBins + 32); i += T) h.hist[i] = 0;
    if (tid == 0) {
        h.ss[0] = 0.0f;
        h.sm[0] = 0;
        h.misc[2] = h.misc[5] = 0;
    }
}

constexpr int kBinsPerLane = kBins / 32;

/* Adds a level's histogram (shared [kBins]) to a lane's share of the running one (registers: bins
 * lane * kBinsPerLane + i), clearing it for reuse when `clear`. */
__device__ __forceinline__ void fold_bins(int (&cum)[kBinsPerLane], int32_t *hist, int lane, bool clear) {
#pragma unroll
    for (int i = 0; i < kBinsPerLane; i += 4) {
        int4 *q = (int4 *)&hist[lane * kBinsPerLane + i];
        const int4 v = *q;
        cum[i] += v.x;
        cum[i + 1] += v.y;
        cum[i + 2] += v.z;
        cum[i + 3] += v.w;
        if (clear) *q = make_int4(0, 0, 0, 0);
    }
}

/* Inclusive prefix sum of v over the warp's lanes. */
__device__ __forceinline__ int warp_scan(int v, int lane) {
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(kFull, v, o);
        if (lane >= o) v += y;
    }
    return v;
}

/* The smallest bin b with at least N nodes in bins <= b, from the running histogram held by the
 * warp's lanes (which must hold >= N nodes). */
__device__ int bin_limit(const int (&cum)[kBinsPerLane], int N, int lane) {
    int sum = 0;
#pragma unroll
    for (int i = 0; i < kBinsPerLane; i++) sum += cum[i];
    const int incl = warp_scan(sum, lane);
    const int first = __ffs(__ballot_sync(kFull, incl >= N)) - 1; /* lane 31 holds all: >= N */
    int b = kBinsPerLane - 1, c = incl; /* c: nodes in bins <= lane * kBinsPerLane + i */
#pragma unroll
    for (int i = kBinsPerLane - 1; i >= 0; i--) {
        if (c >= N) b = i;
        c -= cum[i];
    }
    return __shfl_sync(kFull, lane * kBinsPerLane + b, first);
}

/* Whether node c precedes node a, two nodes of equal score and depth: by their parents' order
 * (the SPEC's lower parent index), which is score, then (same depth) their own parents, up to a
 * common parent, where k decides. */
__device__ __forceinline__ bool tie_precedes(const float *ss, const uint32_t *sm, int c, int a) {
    for (int step = 0; step < 64; step++) { /* depth <= 64: the walk meets by then */
        const int pa = (int)(sm[a] >> 13), pc = (int)(sm[c] >> 13);
        if (pa == pc) return (sm[c] & 63) < (sm[a] & 63);
        if (ss[pa] != ss[pc]) return ss[pc] > ss[pa];
        a = pa;
        c = pc;
    }
    return false;
}

/* Runs on the whole block after a barrier that follows the kernel's set-up of S[0], hist and
 * misc; returns the number of draft nodes (records in rec, lists in fc / ns), or -1 when S would
 * outgrow its M entries (then nothing was written but the mask's zeroes). Rows must be sorted and
 * no score above 0.
 * Levels: every node of the newest level whose bin is <= b counts its children of bin <= b (a
 * prefix of the sorted row), takes places for them in S (one shared atomic a warp: the order of
 * parents in S is free), writes them and counts them in the level's histogram; after a barrier
 * the keeper warp folds the level into its running histogram and lowers b to the smallest bin
 * holding N nodes of S (published after a second barrier). The final candidates (bin <= b: a
 * superset of the best N, closed under parents, usually N plus a few) are then sorted by bin (a
 * counting sort); a candidate's rank = the candidates of lower bins + those of its own bin that
 * precede it: higher key (score, then lower depth) or, on an equal key, the parents' walk. */
__device__ int thr_select(const float *sc, int D, int K, int N, int M, const thr_smem &h, uint4 *rec, short *fc, short *ns) {
    constexpr int T = 32 * kThrWarps;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    constexpr int kKeeper = kThrWarps - 1; /* the warp that keeps the running histogram */
    int lo = 0, hi = 1, bmax = kBins - 1;
    int cum[kBinsPerLane]; /* the keeper's running histogram of S: bins lane * kBinsPerLane + i */
#pragma unroll
    for (int i = 0; i < kBinsPerLane; i++) cum[i] = 0;
    for (int t = 0; t < D; t++) {
        const float *x = sc + t * K;
        const float lim = bin_floor(bmax); /* a score is in a bin <= bmax iff it is above lim */
        float x8[8];                       /* the row's head in registers: no loads in the loops */
#pragma unroll
        for (int u = 0; u < 8; u++) x8[u] = x[min(u, K - 1)];
        const float xnext = t + 1 < D ? x[K] : -INFINITY; /* the next row's best */
        int32_t *ctr = h.misc + 2 + t % 3;                /* level t's count and "more" flag */
        int32_t *more = h.misc + 5 + t % 3;               /* (cleared a level ahead) */
        if (tid == 0) h.misc[2 + (t + 1) % 3] = h.misc[5 + (t + 1) % 3] = 0;
        int32_t *hist = h.hist + (t & 1) * (kBins + 32);
        for (int f0 = lo; f0 < hi; f0 += T) {
            if (f0 + warp * 32 >= hi) continue; /* warp-uniform: no node of this chunk here */
            const int f = f0 + tid;
            float s = 0.0f;
            int cnt = 0; /* children above lim: a prefix of the sorted row */
            if (f < hi && (s = h.ss[f]) > lim) {
#pragma unroll
                for (int u = 0; u < 8; u++) cnt += u < K && __fadd_rn(s, x8[u]) > lim;
                if (cnt == 8)
                    while (cnt < K && __fadd_rn(s, x[cnt]) > lim) cnt++;
            }
            /* places in S: the warp's prefix by ballots over cnt's bits (cnt <= K <= 64), one
             * shared atomic a warp */
            const unsigned lt = (1u << lane) - 1;
            int excl = 0, tot = 0;
#pragma unroll
            for (int bit = 0; bit < 7; bit++) {
                if (1 << bit > K) break;
                const unsigned m = __ballot_sync(kFull, cnt >> bit & 1);
                excl += __popc(m & lt) << bit;
                tot += __popc(m) << bit;
            }
            int base = 0;
            if (lane == 0 && tot) base = atomicAdd(ctr, tot);
            const int off = hi + __shfl_sync(kFull, base, 0) + excl;
            /* A child with no child above lim ends its branch (bounds only tighten); the first
             * child is the best. */
            const bool grows = __any_sync(kFull, cnt > 0 && __fadd_rn(__fadd_rn(s, x8[0]), xnext) > lim);
            if (lane == 0 && grows) atomicOr(more, 1);
            if (off + cnt <= M) {
                const uint32_t meta = (uint32_t)f << 13 | (uint32_t)(t + 1) << 6;
#pragma unroll
                for (int u = 0; u < 8; u++) { /* branch-free: past cnt, a lane counts into its own spare bin */
                    const float c = __fadd_rn(s, x8[u]);
                    if (u < cnt) {
                        h.ss[off + u] = c;
                        h.sm[off + u] = meta | (uint32_t)u;
                    }
                    atomicAdd(&hist[u < cnt ? score_bin(c) : kBins + lane], 1);
                }
                for (int k = 8; k < cnt; k++) {
                    const float c = __fadd_rn(s, x[k]);
                    h.ss[off + k] = c;
                    h.sm[off + k] = meta | (uint32_t)k;
                    atomicAdd(&hist[score_bin(c)], 1);
                }
            }
        }
        __syncthreads();
        const int top = hi + *ctr, grow = *more;
        if (top > M) return -1; /* S is full: the caller takes the sequential path */
        /* The keeper folds the level into its running histogram (clearing the buffer for level
         * t + 2) and, once S holds N nodes, publishes the new bin limit (a slot by parity). */
        if (warp == kKeeper) fold_bins(cum, hist, lane, true);
        if (top - 1 >= N) { /* block-uniform */
            if (warp == kKeeper) {
                const int b = bin_limit(cum, N, lane);
                if (lane == 0) h.misc[t & 1] = b;
            }
            __syncthreads();
            bmax = h.misc[t & 1];
        }
        lo = hi;
        hi = top;
        if (!grow) break; /* no node of S can have a child above the bound: the tree is complete */
    }

    /* Counting sort of the final candidates by bin: the keeper writes bstart = exclusive prefix
     * of cum over bins <= bmax, also as the bins' cursors (in a spent level buffer). */
    int32_t *cursor = h.hist;
    if (warp == kKeeper) {
        int sum = 0;
#pragma unroll
        for (int i = 0; i < kBinsPerLane; i++) {
            cum[i] = lane * kBinsPerLane + i <= bmax ? cum[i] : 0;
            sum += cum[i];
        }
        const int incl = warp_scan(sum, lane);
        int run = incl - sum;
#pragma unroll
        for (int i = 0; i < kBinsPerLane; i++) {
            h.bstart[lane * kBinsPerLane + i] = cursor[lane * kBinsPerLane + i] = run;
            run += cum[i];
        }
        if (lane == 31) h.misc[9] = incl;
    }
    __syncthreads();
    const int nc = h.misc[9];
    for (int i = 1 + tid; i < hi; i += T) {
        h.rk[i] = INT32_MAX;
        const float s = h.ss[i];
        const int bn = score_bin(s);
        if (bn <= bmax) {
            const int pos = atomicAdd(&cursor[bn], 1);
            h.lst[pos] = i;
            h.key[pos] = (uint64_t)score_order(s) << 32 | (uint64_t)(127 - (h.sm[i] >> 6 & 127)) << 24;
        }
    }
    __syncthreads();

    /* Ranks: within a bin, by key; equal keys (same score and depth) by the parents' walk. */
    for (int c = tid; c < nc; c += T) {
        const int i = h.lst[c], bn = score_bin(h.ss[i]);
        const int b0 = h.bstart[bn], b1 = bn < bmax ? h.bstart[bn + 1] : nc;
        const uint64_t ki = h.key[c];
        int r = b0;
        for (int j = b0; j < b1; j++) {
            const uint64_t kj = h.key[j];
            r += kj > ki || (kj == ki && j != c && tie_precedes(h.ss, h.sm, h.lst[j], i));
        }
        h.rk[i] = r;
    }
    __syncthreads();

    /* Node r + 1 = the candidate of rank r < N. A node's children are its k = 0, 1, ... (a prefix,
     * in index order), contiguous in S: k = 0 heads the list, S's next entry follows. Indices read
     * from shared memory are clamped: memory-safe whatever the ranks. */
    for (int c = tid; c < nc; c += T) {
        const int i = h.lst[c], r = h.rk[i];
        if (r >= N) continue;
        const uint32_t mt = h.sm[i];
        const int ps = (int)(mt >> 13), k = (int)(mt & 63);
        const int pi = ps == 0 ? 0 : min(h.rk[ps], N - 1) + 1;
        rec[r + 1] = make_uint4((mt >> 6 & 127u) << 17 | (uint32_t)pi << 6 | (uint32_t)k, __float_as_uint(h.ss[i]), 0, 0);
        if (k == 0) fc[pi] = (short)(r + 1);
        if (i + 1 < hi && (int)(h.sm[i + 1] >> 13) == ps && h.rk[i + 1] < N) ns[r + 1] = (short)(h.rk[i + 1] + 1);
    }
    return min(N, nc);
}
