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
constexpr int kKeeper = 0; /* the warp that keeps the running histogram and runs narrow levels */
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
    int32_t *hist;   /* [kBins + 32] nodes of S per bin (the root aside); a spare bin a lane */
    int32_t *cursor; /* [kBins + 32] the counting sort's turns by bin */
    int32_t *bstart; /* [kBins] final candidates in lower bins */
    int32_t *misc;   /* [16] bin limit by level parity; 3 level counts; 3 "more" flags; -; final count; narrow state (6) */
    uint8_t *mb;     /* [thr_mask_bytes(Q)] the mask as bytes, when Q < kMaskBitsQ */
};

/* The pool's room: the level that passes N nodes adds at most N K, the later ones few (the pool
 * peaked at 1065 nodes for N = 128, 1957 for N = 256 over 64 requests of the bench's scores, in a
 * numpy model of the path). A multiple of 4 keeps the histogram 16-byte aligned. */
__host__ __device__ inline int thr_capacity(int K, int N) { return (N * (K + 6) + 4) & ~3; }

/* From this Q on, thr_write builds the mask as bit rows in the spent key array (8 M bytes); below,
 * as bytes in a region of its own. Either way the whole mask then goes out in 16-byte stores. The
 * switch was set when the small masks' ones went straight to global memory (H200,
 * docs/perf/tree_build.md: B = 256, N = 256: 25.3 -> 22.3 us with bit rows; B = 64, N = 128:
 * 15.1 us with ones one by one, 15.5 with bit rows); bytes in shared memory against bit rows
 * below 160 were not compared. */
constexpr int kMaskBitsQ = 160;

/* The byte mask's region: Q Q bytes rounded up to 16, and 16 more to start the mask at the global
 * mask's offset within 16 bytes (so that 16-byte loads and stores line up). */
__host__ __device__ inline int thr_mask_bytes(int Q) { return Q < kMaskBitsQ ? ((Q * Q + 15) & ~15) + 16 : 0; }

__host__ __device__ inline size_t thr_smem_bytes(int M, int Q) {
    return (size_t)24 * M + 4 * (3 * kBins + 64 + 16) + 16 + thr_mask_bytes(Q);
}

__device__ thr_smem thr_carve(uint8_t *base, int M) {
    thr_smem h;
    /* pointer arithmetic on base (not a cast from an integer) keeps the accesses in shared memory */
    h.key = (uint64_t *)(base + ((16 - ((uintptr_t)base & 15)) & 15));
    h.ss = (float *)(h.key + M);
    h.sm = (uint32_t *)(h.ss + M);
    h.rk = (int32_t *)(h.sm + M);
    h.lst = h.rk + M;
    h.hist = h.lst + M;
    h.cursor = h.hist + kBins + 32;
    h.bstart = h.cursor + kBins + 32;
    h.misc = h.bstart + kBins;
    h.mb = (uint8_t *)(h.misc + 16); /* 16-aligned, like key: every array before is a multiple of 16 bytes */
    return h;
}

/* The pool before level 0: S = the root alone, the histogram and the counting sort's turns
 * empty, the first wide level's count and flag cleared; thread tid of T. The caller's barrier
 * follows. */
__device__ __forceinline__ void thr_init(const thr_smem &h, int tid, int T) {
#pragma unroll 1
    for (int i = tid; i < kBins + 32; i += T) h.hist[i] = h.cursor[i] = 0;
    if (tid == 0) {
        h.ss[0] = 0.0f;
        h.sm[0] = 0;
        h.misc[2] = h.misc[5] = 0;
    }
}

/* Zeroes the byte mask (thread i of n), before thr_select: the warps that wait while the keeper
 * runs the first levels do it (thr_write sets the ones after thr_select's barriers). */
__device__ __forceinline__ void thr_mask_zero(const thr_smem &h, int Q, int i, int n) {
#pragma unroll 1
    for (int j = i; j < thr_mask_bytes(Q) / 16; j += n) ((uint4 *)h.mb)[j] = make_uint4(0, 0, 0, 0);
}

constexpr int kBinsPerLane = kBins / 32;

/* A lane's share of the histogram: bins lane * kBinsPerLane + i (16-byte loads). */
__device__ __forceinline__ void load_bins(int (&v)[kBinsPerLane], const int32_t *hist, int lane) {
#pragma unroll
    for (int i = 0; i < kBinsPerLane; i += 4) {
        const int4 q = *(const int4 *)&hist[lane * kBinsPerLane + i];
        v[i] = q.x;
        v[i + 1] = q.y;
        v[i + 2] = q.z;
        v[i + 3] = q.w;
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

/* The smallest bin b with at least N nodes in bins <= b, from the whole histogram (which must hold
 * >= N nodes), and *cnt = the nodes in bins <= b; on one whole warp. */
__device__ int bin_limit(const int32_t *hist, int N, int lane, int *cnt) {
    int cum[kBinsPerLane];
    load_bins(cum, hist, lane);
    int sum = 0;
#pragma unroll
    for (int i = 0; i < kBinsPerLane; i++) sum += cum[i];
    const int incl = warp_scan(sum, lane);
    const int first = __ffs(__ballot_sync(kFull, incl >= N)) - 1; /* lane 31 holds all: >= N */
    int b = kBinsPerLane - 1, c = incl, cb = incl; /* c: nodes in bins <= lane * kBinsPerLane + i */
#pragma unroll
    for (int i = kBinsPerLane - 1; i >= 0; i--) {
        if (c >= N) {
            b = i;
            cb = c;
        }
        c -= cum[i];
    }
    *cnt = __shfl_sync(kFull, cb, first);
    return __shfl_sync(kFull, lane * kBinsPerLane + b, first);
}

/* The same from a bound b that holds cnt >= N nodes in bins <= b: lowers b 32 bins a round (a
 * bound moves a few bins a level, so one round is the rule: a load and a scan, where bin_limit
 * loads and scans all 512 bins). cnt follows b. On one whole warp. */
__device__ int bin_lower(const int32_t *hist, int N, int lane, int b, int *cnt) {
    int c = *cnt;
    while (b > 0) {
        const int v = b - lane >= 0 ? hist[b - lane] : 0;
        const int suf = warp_scan(v, lane); /* nodes in bins b - lane .. b */
        /* bin b - lane - 1 still holds N nodes below it iff c - suf >= N: a prefix of the lanes */
        const int j = __popc(__ballot_sync(kFull, c - suf >= N));
        c -= j ? __shfl_sync(kFull, suf, j - 1) : 0;
        b -= j;
        if (j < 32) break;
    }
    *cnt = c;
    return b;
}

/* The keeper's new bound. cnt = S's nodes in bins <= bmax, the root aside: a level adds all its
 * nodes to it (they pass the bound it used), and the bound lowers it. The first bound (bmax still
 * the last bin) comes from the whole histogram. */
__device__ __forceinline__ void keeper_bound(const int32_t *hist, int N, int lane, int &bmax, int &cnt) {
    bmax = bmax == kBins - 1 ? bin_limit(hist, N, lane, &cnt) : bin_lower(hist, N, lane, bmax, &cnt);
}

/* The counting sort's bin starts: bstart = exclusive prefix of the histogram over bins <= bmax
 * (16-byte stores), misc[9] = the final candidates; on the keeper warp. */
__device__ void bin_starts(const thr_smem &h, int bmax, int lane) {
    int cum[kBinsPerLane], sum = 0;
    load_bins(cum, h.hist, lane);
#pragma unroll
    for (int i = 0; i < kBinsPerLane; i++) {
        cum[i] = lane * kBinsPerLane + i <= bmax ? cum[i] : 0;
        sum += cum[i];
    }
    const int incl = warp_scan(sum, lane);
    int run = incl - sum;
#pragma unroll
    for (int i = 0; i < kBinsPerLane; i += 4) {
        int4 q;
        q.x = run;
        q.y = run += cum[i];
        q.z = run += cum[i + 1];
        q.w = run += cum[i + 2];
        run += cum[i + 3];
        *(int4 *)&h.bstart[lane * kBinsPerLane + i] = q;
    }
    if (lane == 31) h.misc[9] = incl;
}

/* Whether node c precedes node a, two nodes of equal score and depth: by their parents' order
 * (the lower parent index of docs/interfaces.md 2.1), which is score, then (same depth) their own parents, up to a
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

/* A level's row in registers: its head (no loads in the loops), the next row's best, the bound. */
struct level_row {
    const float *x; /* [K] the row, shared */
    float x8[8];    /* x[u], -inf from K on (a sum with it never passes the bound) */
    float xnext;    /* the next row's best (-inf at the last depth) */
    float lim;      /* a score is in a bin <= bmax iff it is above lim */
};

__device__ __forceinline__ level_row load_row(const float *sc, int t, int D, int K, int bmax) {
    level_row r;
    r.x = sc + t * K;
#pragma unroll
    for (int u = 0; u < 8; u++) r.x8[u] = u < K ? r.x[u] : -INFINITY;
    r.xnext = t + 1 < D ? r.x[K] : -INFINITY;
    r.lim = bin_floor(bmax);
    return r;
}

/* Frontier node f's children above the bound: a prefix of the sorted row; its length. */
__device__ __forceinline__ int count_children(float s, const level_row &r, int K) {
    int cnt = 0;
    if (s > r.lim) {
#pragma unroll
        for (int u = 0; u < 8; u++) cnt += __fadd_rn(s, r.x8[u]) > r.lim;
        if (cnt == 8)
            while (cnt < K && __fadd_rn(s, r.x[cnt]) > r.lim) cnt++;
    }
    return cnt;
}

/* The warp's exclusive prefix of cnt (<= K <= 64) and its total, by ballots over cnt's 7 bits:
 * all issued before any count is used, with no branch between them (a loop cut at K's top bit
 * cost ~70 cycles a bit). */
__device__ __forceinline__ int warp_prefix(int cnt, int lane, int *tot) {
    const unsigned lt = (1u << lane) - 1;
    unsigned m[7];
#pragma unroll
    for (int bit = 0; bit < 7; bit++) m[bit] = __ballot_sync(kFull, cnt >> bit & 1);
    int excl = 0, sum = 0;
#pragma unroll
    for (int bit = 0; bit < 7; bit++) {
        excl += __popc(m[bit] & lt) << bit;
        sum += __popc(m[bit]) << bit;
    }
    *tot = sum;
    return excl;
}

/* Whether any of the warp's new children can have a child above the bound (bounds only tighten;
 * a node's first child is its best). */
__device__ __forceinline__ bool warp_grows(float s, int cnt, const level_row &r) {
    return __any_sync(kFull, cnt > 0 && __fadd_rn(__fadd_rn(s, r.x8[0]), r.xnext) > r.lim);
}

/* Writes node f's cnt children (depth t + 1) at S[off ..] and counts them in S's histogram;
 * branch-free over the row's head: past cnt, a lane counts into its own spare bin. */
__device__ __forceinline__ void write_children(const thr_smem &h, int off, int cnt, float s, int f, int t,
                                               const level_row &r, int lane) {
    const uint32_t meta = (uint32_t)f << 13 | (uint32_t)(t + 1) << 6;
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const float c = __fadd_rn(s, r.x8[u]);
        if (u < cnt) {
            h.ss[off + u] = c;
            h.sm[off + u] = meta | (uint32_t)u;
        }
        atomicAdd(&h.hist[u < cnt ? score_bin(c) : kBins + lane], 1);
    }
    for (int k = 8; k < cnt; k++) {
        const float c = __fadd_rn(s, r.x[k]);
        h.ss[off + k] = c;
        h.sm[off + k] = meta | (uint32_t)k;
        atomicAdd(&h.hist[score_bin(c)], 1);
    }
}

/* Whether the bound is due: S holds N nodes (the root aside) and either no bound is set yet
 * (fresh = 0) or S has grown by 32 nodes since it was (at size fresh). A stale bound only loosens,
 * so S still holds every node that a fresh one keeps (and a few more); most levels save the bin
 * search (and a wide level its second barrier), and refreshing keeps deep trees' pools as small
 * as a bound set every level does. */
__device__ __forceinline__ bool bound_due(int hi, int N, int fresh) { return hi - 1 >= N && (fresh == 0 || hi - fresh >= 32); }

/* Narrow levels (a frontier of at most 32 nodes) on one warp, the keeper, without block
 * barriers: lane i expands frontier node i, places come from the warp prefix; the keeper
 * refreshes the bound when it is due (bound_due). Returns 0 when the next frontier is wide (t,
 * lo, hi, bmax, cnt, fresh updated), 1 when the tree is complete (the bin starts written), -1
 * when S would outgrow M. */
__device__ int narrow_levels(const float *sc, int D, int K, int N, int M, const thr_smem &h, int lane, int &t, int &lo,
                             int &hi, int &bmax, int &cnt, int &fresh) {
    for (; t < D; t++) {
        if (hi - lo > 32) return 0;
        const level_row r = load_row(sc, t, D, K, bmax);
        const int f = lo + lane;
        const float s = f < hi ? h.ss[f] : -INFINITY;
        const int cnt_f = count_children(s, r, K);
        int tot;
        const int excl = warp_prefix(cnt_f, lane, &tot);
        if (hi + tot > M) return -1;
        write_children(h, hi + excl, cnt_f, s, f, t, r, lane);
        const bool grows = warp_grows(s, cnt_f, r);
        lo = hi;
        hi += tot;
        cnt += tot;
        __syncwarp(); /* the next level reads the nodes other lanes wrote */
        if (bound_due(hi, N, fresh)) {
            keeper_bound(h.hist, N, lane, bmax, cnt);
            fresh = hi;
        }
        if (!grows) break;
    }
    /* a stale final bound only adds candidates: S holds the best N and all that precede them */
    bin_starts(h, bmax, lane);
    return 1;
}

/* Runs on the whole block after a barrier that follows the kernel's set-up of S[0], hist and
 * misc; returns the number of draft nodes n (the candidates' ranks in rk, S's size in *size, for
 * thr_write), or -1 when S would outgrow its M entries. Rows must be sorted and no score above 0.
 * Levels: every node of the newest level whose bin is <= b counts its children of bin <= b (a
 * prefix of the sorted row), takes places for them in S (the order of parents in S is free),
 * writes them and counts them in S's histogram; when the bound is due (bound_due) the keeper
 * warp lowers b to the smallest bin holding N nodes of S. Narrow levels run on the keeper alone,
 * wide ones on every warp (a shared atomic a warp for the places, a barrier; when the bound is due
 * or the tree complete, the keeper and a second barrier). The final candidates (bin <= b: a
 * superset of the best N, closed under parents, usually N plus a few) are then sorted by bin (a
 * counting sort whose bin starts the last level's keeper wrote); a candidate's rank =
 * the candidates of lower bins + those of its own bin that precede it: higher key (score, then
 * lower depth) or, on an equal key, the parents' walk. */
__device__ int thr_select(const float *sc, int D, int K, int N, int M, const thr_smem &h, int *size) {
    constexpr int T = 32 * kThrWarps;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int lo = 0, hi = 1, bmax = kBins - 1, t = 0;
    int cnt = 0;   /* S's nodes in bins <= bmax, the root aside (kept by the keeper) */
    int fresh = 0; /* S's size when the bound was last set; 0: no bound yet */
    int w = 0;     /* wide levels so far: their count and flag rotate over 3 slots */
    while (t < D) {
        if (hi - lo <= 32) { /* block-uniform */
            if (warp == kKeeper) {
                const int st = narrow_levels(sc, D, K, N, M, h, lane, t, lo, hi, bmax, cnt, fresh);
                if (lane == 0) {
                    int32_t *q = h.misc + 10;
                    q[0] = st;
                    q[1] = t;
                    q[2] = lo;
                    q[3] = hi;
                    q[4] = bmax;
                    q[5] = fresh;
                }
            }
            __syncthreads();
            const int st = h.misc[10];
            t = h.misc[11];
            lo = h.misc[12];
            hi = h.misc[13];
            bmax = h.misc[14];
            fresh = h.misc[15];
            if (st < 0) return -1; /* S is full: the caller takes the sequential path */
            if (st > 0) break;
            continue; /* misc[10 ..] is rewritten only after the wide level's barriers */
        }
        const level_row r = load_row(sc, t, D, K, bmax);
        /* this level's count and "more" flag, cleared a wide level ahead (thr_init clears the
         * first); the slot cleared here was last read right after the barrier of the wide level
         * before the previous one, so behind the previous one's barrier (narrow levels between
         * wide ones add no barrier before this point) */
        int32_t *ctr = h.misc + 2 + w % 3, *more = h.misc + 5 + w % 3;
        if (tid == 0) h.misc[2 + (w + 1) % 3] = h.misc[5 + (w + 1) % 3] = 0;
        for (int f0 = lo; f0 < hi; f0 += T) {
            if (f0 + warp * 32 >= hi) continue; /* warp-uniform: no node of this chunk here */
            const int f = f0 + tid;
            const float s = f < hi ? h.ss[f] : -INFINITY;
            const int cnt_f = count_children(s, r, K);
            int tot;
            const int excl = warp_prefix(cnt_f, lane, &tot);
            int base = 0;
            if (lane == 0 && tot) base = atomicAdd(ctr, tot);
            const int off = hi + __shfl_sync(kFull, base, 0) + excl;
            const bool grows = warp_grows(s, cnt_f, r);
            if (lane == 0 && grows) atomicOr(more, 1);
            if (off + cnt_f <= M) write_children(h, off, cnt_f, s, f, t, r, lane);
        }
        __syncthreads();
        const int top = hi + *ctr, grow = *more; /* never set at the last depth (xnext = -inf) */
        if (top > M) return -1; /* S is full: the caller takes the sequential path */
        cnt += top - hi;
        /* When the bound is due, the keeper publishes the new bin limit (a slot by parity), and
         * after the last level the bin starts; the others wait, so the histogram is still. */
        const bool due = bound_due(top, N, fresh);
        if (due || !grow) { /* block-uniform */
            if (warp == kKeeper) {
                if (due) keeper_bound(h.hist, N, lane, bmax, cnt);
                if (!grow) bin_starts(h, bmax, lane);
                if (lane == 0) h.misc[t & 1] = bmax;
            }
            __syncthreads();
            bmax = h.misc[t & 1];
            if (due) fresh = top;
        }
        lo = hi;
        hi = top;
        t++;
        w++;
        if (!grow) break; /* no node of S can have a child above the bound: the tree is complete */
    }

    /* Counting sort of the final candidates by bin (the last level's keeper wrote the bin starts,
     * before its barrier): a candidate's place is its bin's start plus its turn in the bin. */
    const int nc = h.misc[9];
#pragma unroll 1
    for (int i = 1 + tid; i < hi; i += T) {
        h.rk[i] = INT32_MAX;
        const float s = h.ss[i];
        const int bn = score_bin(s);
        if (bn <= bmax) {
            const int pos = h.bstart[bn] + atomicAdd(&h.cursor[bn], 1);
            h.lst[pos] = i;
            h.key[pos] = (uint64_t)score_order(s) << 32 | (uint64_t)(127 - (h.sm[i] >> 6 & 127)) << 24;
        }
    }
    __syncthreads();

    /* Ranks: within a bin, by key; equal keys (same score and depth) by the parents' walk. */
#pragma unroll 1
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

    *size = hi;
    return min(N, nc);
}

/* Words of a mask row as bits: Q bits and a zero word, so that the 16 bits from any column < Q
 * lie in two words. thr_write keeps Q such rows in the spent key array (8 M bytes: thr_capacity
 * leaves room, see kdt_tree_build_cuda_path's check). */
__host__ __device__ inline int thr_row_words(int Q) { return (Q + 31) / 32 + 1; }

/* Bits col .. col + 15 of a bit row (col < Q). */
__device__ __forceinline__ uint32_t row_bits16(const uint32_t *row, int col) {
    const uint64_t w = (uint64_t)row[(col >> 5) + 1] << 32 | row[col >> 5];
    return (uint32_t)(w >> (col & 31)) & 0xffffu;
}

/* The mask's bytes pos .. pos + 15 (pos + 16 <= Q Q) as bits: a row's tail, then maybe the next
 * row's head (Q >= 16). pos / Q = __umulhi(pos, qinv), qinv = 2^32 / Q rounded up: exact for
 * pos < Q Q (checked for every Q <= 1099). */
__device__ __forceinline__ uint32_t mask_bits16(const uint32_t *bits, int W, int Q, uint32_t qinv, int pos) {
    const int r = (int)__umulhi((uint32_t)pos, qinv), c = pos - r * Q, n1 = Q - c;
    uint32_t v = row_bits16(bits + r * W, c);
    if (n1 < 16) v = (v & ((1u << n1) - 1)) | (row_bits16(bits + (r + 1) * W, 0) << n1 & 0xffffu);
    return v;
}

/* The mask's byte pos as a bit. */
__device__ __forceinline__ uint8_t mask_bit(const uint32_t *bits, int W, int Q, uint32_t qinv, int pos) {
    const int r = (int)__umulhi((uint32_t)pos, qinv), c = pos - r * Q;
    return (uint8_t)(bits[r * W + (c >> 5)] >> (c & 31) & 1);
}

/* Four bits to four bytes of 0 / 1 (bit i to byte i: the products land on disjoint bits). */
__device__ __forceinline__ uint32_t bits_to_bytes(uint32_t nib) { return nib * 0x204081u & 0x01010101u; }

/* S node a's parent in S, forced below a (so that any walk up ends at the root, S[0]). */
__device__ __forceinline__ int s_parent(const thr_smem &h, int a) { return min((int)(h.sm[a] >> 13), a - 1); }

/* The node index of S node a > 0, a selected candidate: its rank + 1, clamped into 1 .. N. */
__device__ __forceinline__ int node_index(const thr_smem &h, int a, int N) { return min(h.rk[a], N - 1) + 1; }

/* Writes request b's outputs straight from the pool, after thr_select (its last barrier orders
 * the ranks before): node r + 1 = the candidate of rank r < N, n = min(N, candidates) nodes, S of
 * `size` entries. The caller has set the request's first_child to -1, with a barrier since. A
 * node's children are its k = 0, 1, ... (a prefix, in index order), contiguous in S: a k = 0
 * child heads its parent's list, S's next entry follows. A mask row's ones: the node, its
 * ancestors by the parents in S (each below its child, so the walk ends) and the root, set in
 * shared memory (bytes in the region thr_init zeroed, or from Q = kMaskBitsQ on, bit rows); then
 * the whole mask goes out in 16-byte stores (ones stored one by one into global memory cost a
 * cache-line transaction each). Indices read from shared memory are clamped: memory-safe
 * whatever the ranks. Every thread of the block, tid of T. */
__device__ void thr_write(const kdt_tree_build_params &p, int b, const thr_smem &h, const int32_t *tk, int n, int size,
                          int32_t seq, int32_t root, int tid, int T) {
    const int K = p.K, N = p.budget, Q = N + 1, nc = h.misc[9], W = thr_row_words(Q);
    const size_t o = (size_t)b * Q;
    uint8_t *mask = p.tree_mask + (size_t)b * Q * Q;    /* [Q, Q] */
    uint8_t *mb = h.mb + ((uintptr_t)mask & 15);        /* [Q, Q] as bytes, in line with mask */
    uint32_t *bits = (uint32_t *)h.key;                 /* [Q, W] */
#pragma unroll 1
    for (int c = tid; c < nc; c += T) {
        const int i = h.lst[c], r = h.rk[i];
        if (r >= N) continue;
        const uint32_t mt = h.sm[i];
        const int ps = (int)(mt >> 13), k = (int)(mt & 63), dep = (int)(mt >> 6 & 127), v = r + 1;
        const int pi = ps == 0 ? 0 : node_index(h, ps, N);
        const bool sib = i + 1 < size && (int)(h.sm[i + 1] >> 13) == ps && h.rk[i + 1] < N;
        p.node_token[o + v] = tk[(dep - 1) * K + k];
        p.node_parent[o + v] = pi;
        p.node_depth[o + v] = dep;
        p.node_cand[o + v] = k;
        p.node_score[o + v] = h.ss[i];
        p.positions[o + v] = (int32_t)((uint32_t)seq + (uint32_t)dep); /* wraps, never UB, on a bad seq_len */
        p.next_sibling[o + v] = sib ? h.rk[i + 1] + 1 : -1;
        if (k == 0) p.first_child[o + pi] = v;
        if (Q < kMaskBitsQ) {
            uint8_t *row = mb + v * Q;
            row[0] = row[v] = 1;
            for (int a = min(ps, i - 1); a > 0; a = s_parent(h, a)) row[node_index(h, a, N)] = 1;
            continue;
        }
        /* row v: the ancestors' indices fall along the walk, so each word is stored once */
        uint32_t *row = bits + v * W;
        for (int w = 0; w < W; w++) row[w] = 0;
        int cw = v >> 5;
        uint32_t acc = 1u << (v & 31);
        for (int a = min(ps, i - 1);; a = s_parent(h, a)) {
            const int x = a > 0 ? node_index(h, a, N) : 0; /* the root's index: 0 */
            if (x >> 5 != cw) {
                row[cw] = acc;
                cw = x >> 5;
                acc = 0;
            }
            acc |= 1u << (x & 31);
            if (a <= 0) break;
        }
        row[cw] = acc;
    }
#pragma unroll 1
    for (int i = tid; i < Q; i += T) { /* the root and the fills */
        if (i > 0 && i <= n) continue;
        p.node_token[o + i] = i ? -1 : root;
        p.node_parent[o + i] = -1;
        p.node_depth[o + i] = i ? -1 : 0;
        p.node_cand[o + i] = -1;
        p.node_score[o + i] = i ? -INFINITY : 0.0f;
        p.positions[o + i] = i ? -1 : seq;
        p.next_sibling[o + i] = -1;
        if (Q >= kMaskBitsQ)
            for (int w = 0; w < W; w++) bits[i * W + w] = i || w ? 0u : 1u;
        else if (i == 0)
            mb[0] = 1;
    }
    if (tid == 0) p.num_nodes[b] = n;
    __syncthreads();

    /* The mask: bytes up to the first 16-byte boundary, 16-byte stores, the tail. */
    const int len = Q * Q, head = min((int)((16 - ((uintptr_t)mask & 15)) & 15), len), body = (len - head) / 16;
    if (Q < kMaskBitsQ) { /* block-uniform */
#pragma unroll 1
        for (int j = tid; j < head; j += T) mask[j] = mb[j];
#pragma unroll 1
        for (int j = tid; j < body; j += T) ((uint4 *)(mask + head))[j] = ((const uint4 *)(mb + head))[j];
#pragma unroll 1
        for (int j = head + 16 * body + tid; j < len; j += T) mask[j] = mb[j];
        return;
    }
    const uint32_t qinv = 0xffffffffu / (uint32_t)Q + 1;
#pragma unroll 1
    for (int j = tid; j < head; j += T) mask[j] = mask_bit(bits, W, Q, qinv, j);
#pragma unroll 1
    for (int j = tid; j < body; j += T) {
        const uint32_t v = mask_bits16(bits, W, Q, qinv, head + 16 * j);
        ((uint4 *)(mask + head))[j] = make_uint4(bits_to_bytes(v & 15), bits_to_bytes(v >> 4 & 15),
                                                 bits_to_bytes(v >> 8 & 15), bits_to_bytes(v >> 12));
    }
#pragma unroll 1
    for (int j = head + 16 * body + tid; j < len; j += T) mask[j] = mask_bit(bits, W, Q, qinv, j);
}
